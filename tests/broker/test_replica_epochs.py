"""Leader epochs between replicas (Kafka's KIP-101/320): a replica fetch says the epoch of
the follower's last batch and the leader checks that the follower's log is its own before
counting it as copied; a follower's copy fetched in an epoch the partition has left is
dropped by the writer."""

from __future__ import annotations

import asyncio

import pytest
from batches import request

from sluice.broker.broker import Broker
from sluice.broker.peer import LOCAL
from sluice.cluster.store import PartitionState
from sluice.errors import FencedLeaderEpoch
from sluice.protocol import messages as m

pytestmark = pytest.mark.timeout(60)


async def test_a_copy_fetched_in_an_old_epoch_is_not_appended_after_the_epoch_moved(open_partition):
    leader = open_partition("leader")
    follower = open_partition("follower", leader=False)
    await leader.append(*request([b"a", b"b", b"c"]))
    res = await leader.read(0, 1 << 20, leader.log_end_offset)
    late = follower.append_as_follower(res.data, fetched_in=0)  # the answer of an epoch-0 fetch
    follower.make_follower(1)  # a new epoch before the writer takes it: it may truncate first
    with pytest.raises(FencedLeaderEpoch):
        await late
    assert follower.log_end_offset == 0
    await follower.append_as_follower(res.data, fetched_in=1)  # fetched again in epoch 1
    assert follower.log_end_offset == 3


def _fetch(part, offset: int, last_epoch: int) -> m.ReplicaFetchRequestV2:
    return m.ReplicaFetchRequestV2(
        replica_id=7, max_wait_ms=0, partitions=[m.ReplicaFetchPartitionV2(
            topic=part.topic, partition=part.index, leader_epoch=part.leader_epoch, offset=offset,
            last_fetched_epoch=last_epoch,
        )],
    )


async def test_a_follower_whose_log_diverges_is_told_where_and_not_counted_as_copied(broker: Broker):
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="t", partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message
    topic = broker.topics["t"]
    part = topic.partitions[0]
    me = broker.config.node_id
    broker.replication.become(topic, 0, PartitionState(me, 2, [me], 1 << 40))  # leads in epoch 2 (a version the store never had)
    await part.append(*request([b"a", b"b", b"c"]))  # offsets 0..2 in epoch 2
    await asyncio.sleep(0.5)  # the broker's own resync of the topic record is done
    part.set_replicas([me, 7], [me, 7])  # a follower, 7, in sync (the record does not list it: set here)
    assert part.high_watermark == 3  # as before: the high watermark never goes down
    await part.append(*request([b"d"]))
    assert part.high_watermark == 3  # 7 not heard of yet
    # 7 has four records too, but its last is of epoch 1 (from a leader this one never
    # followed): epoch 1 ends at 0 here, where epoch 2 starts
    got, blobs = await broker.replication.leader.replica_fetch(_fetch(part, 4, 1), None, LOCAL)
    [r] = got.partitions
    assert r.error == 0 and r.diverging and (r.diverging_epoch, r.diverging_end_offset) == (1, 0)
    assert not blobs and r.size == 0
    assert part.high_watermark == 3, "a diverged follower's log end was counted as copied"
    got, _ = await broker.replication.leader.replica_fetch(_fetch(part, 0, -1), None, LOCAL)  # cut to nothing: fetch again
    [r] = got.partitions
    assert not r.diverging and r.size > 0
    got, _ = await broker.replication.leader.replica_fetch(_fetch(part, 4, 2), None, LOCAL)  # copied: its log is ours
    assert not got.partitions[0].diverging
    assert part.high_watermark == 4
