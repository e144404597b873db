"""What ``cluster rebalance`` reports for replicas of dead brokers it cannot replace."""

from __future__ import annotations

from sluice.broker.replication.reassignment import Reassignment
from sluice.cluster.store import TopicRecord
from sluice.errors import BrokerBusy, InvalidReplicationFactor, NotLeader


def test_dead_replicas_left_in_place_are_reported_with_why():
    records = {"t": TopicRecord("t", 4, replication_factor=3,
                                assignment=[[3, 2, 1], [1, 2, 3], [1, 2, 4], [1, 2, 3]], moving={3: [3]})}
    live = {1, 2}
    plan = {"t": {2: [1, 2, 5]}}  # replaced: not reported here
    kept = Reassignment._kept_dead_replicas(records, ["t"], {("t", 0)}, plan, live)
    assert [(k.partition, k.old, k.new, k.error) for k in kept] == [
        (0, [3, 2, 1], [3, 2, 1], NotLeader.code),
        (1, [1, 2, 3], [1, 2, 3], InvalidReplicationFactor.code),
        (3, [1, 2, 3], [1, 2, 3], BrokerBusy.code),
    ]
    why = [k.message for k in kept]
    assert "no live leader" in why[0]
    assert "no live broker outside its replicas can take the place of broker(s) [3]" in why[1]
    assert "a replica move of it is pending" in why[2]
