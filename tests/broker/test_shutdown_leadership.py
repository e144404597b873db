"""A broker that began shutting down (``Broker.drain``) takes no new leadership and creates
no topic: it would be gone before serving them, leaving them without a leader until the
cluster noticed.  Partition states that move leadership away still apply."""

from __future__ import annotations

import pytest

from sluice import errors
from sluice.broker.broker import Broker
from sluice.broker.peer import LOCAL
from sluice.cluster.store import PartitionState
from sluice.protocol import messages as m

pytestmark = pytest.mark.timeout(60)


async def test_a_stopping_broker_takes_no_leadership(broker: Broker):
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="t", partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message
    topic = broker.topics["t"]
    part = topic.partitions[0]
    me = broker.config.node_id
    epoch = part.leader_epoch
    broker.replication.become(topic, 0, PartitionState(-1, epoch + 1, [me]))  # its leadership moved away
    assert not part.is_leader
    broker.drain()
    broker.replication.become(topic, 0, PartitionState(me, epoch + 2, [me]))  # elected while stopping
    assert not part.is_leader
    broker.replication.become(topic, 0, PartitionState(-1, epoch + 3, [me]))  # moving away still applies
    assert part.leader_epoch == epoch + 3 and not part.is_leader


async def test_a_stopping_broker_creates_no_topic(broker: Broker):
    broker.drain()
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="late", partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == errors.BrokerShuttingDown.code
    assert "late" not in broker.topics
