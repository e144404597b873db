"""The ISR a leader applies: an expansion being written counts its joiners in the high
watermark until the store's state is read back (Kafka's maximal ISR), and a state older
than one applied (same epoch, lower version) never shrinks the ISR again."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from batches import request

from sluice.broker.broker import Broker
from sluice.broker.peer import LOCAL
from sluice.cluster.store import PartitionState
from sluice.errors import NotEnoughReplicasAfterAppend
from sluice.harness import eventually
from sluice.protocol import messages as m

pytestmark = pytest.mark.timeout(60)


async def test_a_pending_expansion_counts_its_joiner_in_the_high_watermark(open_partition):
    part = open_partition(**{"flush.messages": "1"})
    part.make_leader(1, [0, 1], [0])
    await part.append(*request([b"a", b"b", b"c"]))
    assert part.high_watermark == 3  # the leader alone is in sync
    part.follower_fetched(1, 3)  # caught up: the leader writes [0, 1] to the store
    part.expanding([0, 1])
    await part.append(*request([b"d", b"e"]))
    # the swap's answer may be lost while the store holds [0, 1]: the controller could
    # elect 1, so nothing it lacks may be acknowledged
    assert (part.log_end_offset, part.high_watermark) == (5, 3)
    part.follower_fetched(1, 5)
    assert part.high_watermark == 5
    part.set_isr([0])  # the store's state read back: the expansion did not take effect
    assert part.joining == () and part.maximal_isr == (0,)
    await part.append(*request([b"f"]))
    assert part.high_watermark == 6  # the leader alone again


async def test_a_write_passed_by_a_high_watermark_of_too_small_an_isr_is_not_acknowledged(open_partition):
    part = open_partition(**{"flush.messages": "1", "min.insync.replicas": "2"})
    part.make_leader(1, [0, 1], [0, 1])
    part.follower_fetched(1, 0)
    waiting = part.append(*request([b"a"]), acks_all=True)
    await asyncio.sleep(0.05)
    assert not waiting.done()
    part.set_isr([0])  # 1 left: the high watermark passes the write with one copy
    with pytest.raises(NotEnoughReplicasAfterAppend):
        await waiting
    part.follower_fetched(1, 1)
    part.set_isr([0, 1])  # back in sync: acks=all works again
    second = part.append(*request([b"b"]), acks_all=True)
    part.follower_fetched(1, 2)
    assert (await asyncio.wait_for(second, 5)).base_offset == 1


async def test_an_older_state_of_the_same_epoch_never_shrinks_the_isr(broker: Broker):
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="t", partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message
    topic = broker.topics["t"]
    part = topic.partitions[0]
    me, epoch = broker.config.node_id, part.leader_epoch
    version = part.seen_version
    broker.replication.become(topic, 0, PartitionState(me, epoch, [me, 7], version + 20))  # the ISR grew
    assert part.isr == (me, 7)
    broker.replication.become(topic, 0, PartitionState(me, epoch, [me], version + 10))  # a late, older read
    assert part.isr == (me, 7) and part.state_version == version + 20
    assert topic.states[0].version == version + 20
    broker.replication.become(topic, 0, PartitionState(me, epoch, [me], version + 30))  # a newer one applies
    assert part.isr == (me,)


async def test_a_new_leader_stamps_its_epoch_before_any_write(open_partition):
    """An unclean election: the new leader lagged (its log has epoch 0 only) while the old
    one wrote on in epoch 1.  Asked where epoch 1 ends, it must say "where I started
    leading", so the old leader cuts its epoch-1 suffix; not "unknown" (the follower
    would then keep what it has up to its own high watermark, and diverge)."""
    part = open_partition()
    part.make_leader(0)
    await part.append(*request([b"a", b"b", b"c"]))
    part.make_follower(1)  # the old leader goes on in epoch 1 without this replica
    part.make_leader(2)  # elected uncleanly, before it writes anything
    assert part.end_offset_for_epoch(1) == (0, 3)
    assert part.end_offset_for_epoch(2) == (2, 3)
    await part.append(*request([b"d"]))
    assert part.log.epochs.entries() == [(0, 0), (2, 3)]
    part.make_follower(3)
    part.make_leader(4)
    part.make_follower(5)  # led in 4 without writing: its stamp is not in the log, it goes
    assert part.log.epochs.entries() == [(0, 0), (2, 3)]


async def test_a_leader_that_cut_its_log_leads_on_only_in_a_new_epoch(broker: Broker):
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="t", partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message
    topic = broker.topics["t"]
    part = topic.partitions[0]

    async def until(condition) -> None:
        await eventually(condition, 5, interval=0.01)

    await until(lambda: part.state_version is not None and part.state_version > 0)  # the store's state applied
    epoch = part.leader_epoch
    await part.append(*request([b"a"]))
    broker.replication.states.new_leader_epoch(part, "a failed fsync cut the log")
    assert not part.is_leader  # no write in the old epoch from now on
    with pytest.raises(Exception, match="does not lead"):
        await part.append(*request([b"b"]))
    await until(lambda: part.is_leader)
    assert part.leader_epoch == epoch + 1 and topic.states[0].leader_epoch == epoch + 1
    assert (await part.append(*request([b"c"]))).base_offset == 1
    assert part.log.epochs.entries()[-1] == (epoch + 1, 1)


async def test_a_topic_record_change_keeps_a_pending_expansion(broker: Broker):
    """A replica added to the topic's record (a move, an internal topic growing) while the
    leader writes an ISR expansion is no state of the store: the joiner still counts in the
    high watermark, since the expansion may have taken effect."""
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="t", partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message
    topic = broker.topics["t"]
    part = topic.partitions[0]
    me = broker.config.node_id
    await asyncio.sleep(0.5)  # the broker's own resync of the topic record is done
    part.set_replicas([me, 7], [me])  # follower 7, out of the ISR (the record does not list it: set here)
    part.follower_fetched(7, 0)  # caught up: the leader writes [me, 7] to the store
    part.expanding([me, 7])
    waiting = part.append(*request([b"a"]), acks_all=True)
    await asyncio.sleep(0.1)
    assert not waiting.done() and part.high_watermark == 0
    await broker.replication.reassignment.apply_record(topic, replace(topic.record, assignment=[[me, 7, 8]]))  # 8 added
    assert set(part.followers) == {7, 8}
    await asyncio.sleep(0.1)
    assert not waiting.done() and part.high_watermark == 0, "acknowledged without the joiner"
    assert part.joining == (7,)
    part.follower_fetched(7, 1)
    assert (await asyncio.wait_for(waiting, 5)).base_offset == 0
