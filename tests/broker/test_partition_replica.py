"""Follower appends and divergent tails, partition to partition, without a network.

Batches produced on a leader partition are read from its log (bounded by its log end, as
a replica fetch will be) and appended to follower partitions with ``append_as_follower``:
the logs must come out byte for byte the same, epochs and timestamps included.  A leader
change is played out with Kafka's OffsetsForLeaderEpoch (``end_offset_for_epoch``) and
``truncate_to``.
"""

from __future__ import annotations

import asyncio

import pytest
from batches import request

from sluice.broker.partition import Partition
from sluice.errors import InvalidRecord, NotLeader
from sluice.protocol.records import decode_records, iter_batches

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def replicas(open_partition):
    """replicas(name, leader=True, **topic_config) -> a Partition on its own fresh log, with
    small segments so that copies and truncations cross segment boundaries."""
    return lambda name, leader=True, **raw: open_partition(
        name, leader, **{"segment.bytes": "2048", **raw}
    )


async def produce(leader: Partition, n: int, tag: bytes) -> None:
    for i in range(n):
        await leader.append(*request([b"%s-%d-%d" % (tag, i, j) for j in range(1 + i % 3)]))


async def replicate(leader: Partition, follower: Partition, until: int | None = None) -> None:
    """Copy the leader's batches from the follower's log end, as a replica fetch would."""
    end = leader.log_end_offset if until is None else until
    while follower.log_end_offset < end:
        res = await leader.read(follower.log_end_offset, 700, end)  # replicas read to the log end
        assert res.data
        await follower.append_as_follower(res.data)


def log_bytes(part: Partition) -> bytes:
    return b"".join(seg.path.read_bytes()[: seg.size] for seg in part.log.segments)


def batches(part: Partition) -> list[tuple[int, int, int, int]]:
    return [(h.base_offset, h.next_offset, h.leader_epoch, h.max_timestamp) for h, _ in iter_batches(log_bytes(part))]


async def test_follower_log_is_byte_identical_to_the_leaders(replicas):
    leader = replicas("leader")
    follower = replicas("follower", leader=False)
    await produce(leader, 20, b"e0")
    leader.make_leader(3)
    await produce(leader, 25, b"e3")
    await replicate(leader, follower)
    assert log_bytes(follower) == log_bytes(leader)
    assert follower.log_end_offset == leader.log_end_offset
    assert follower.log.epochs.entries() == leader.log.epochs.entries() == [(0, 0), (3, 39)]  # 20 batches of 1, 2, 3, 1, ... records
    assert {e for _, _, e, _ in batches(follower)} == {0, 3}
    # the leader's append times are kept, and the follower's time index agrees
    for ts in sorted({t for *_, t in batches(leader)})[::5]:
        hw = leader.log_end_offset
        assert follower.log.offset_for_time(ts, hw) == leader.log.offset_for_time(ts, hw)
    assert follower.high_watermark == 0, "a follower's HW comes from its leader"
    follower.advance_high_watermark(leader.high_watermark)
    assert follower.high_watermark == leader.high_watermark == leader.log_end_offset


async def test_follower_refuses_batches_that_do_not_continue_its_log(replicas):
    leader = replicas("leader")
    follower = replicas("follower", leader=False)
    await produce(leader, 6, b"a")
    res = await leader.read(0, 1 << 20, leader.log_end_offset)
    blobs = [res.data[pos : pos + h.size] for h, pos in iter_batches(res.data)]
    corrupt = bytearray(blobs[0])
    corrupt[-1] ^= 1
    with pytest.raises(InvalidRecord, match="CRC"):
        await follower.append_as_follower(corrupt)
    with pytest.raises(InvalidRecord, match="is below"):
        await follower.append_as_follower(blobs[2] + blobs[0])  # offsets going back inside
    assert follower.log_end_offset == 0
    assert (await follower.append_as_follower(b"")).base_offset == 0
    await follower.append_as_follower(b"".join(blobs[:2]) + blobs[2][:30])  # a partial tail
    assert follower.log_end_offset == 3
    with pytest.raises(InvalidRecord, match="do not follow the log end 3"):
        await follower.append_as_follower(blobs[1])  # below the log end
    # (a gap above the log end is a compacted leader's: test_partition_compaction.py)
    # an epoch below the log's latest is refused
    leader2 = replicas("leader2")
    leader2.make_leader(7)
    await produce(leader2, 1, b"x")
    follower2 = replicas("follower2", leader=False)
    await replicate(leader2, follower2)
    old = bytearray(blobs[0])
    old[0:8] = (1).to_bytes(8, "big")  # base offset 1 (outside the CRC), epoch 0 < 7
    with pytest.raises(InvalidRecord, match=r"epoch 0\) do not follow"):
        await follower2.append_as_follower(old)


async def test_roles_are_exclusive(replicas):
    leader = replicas("leader")
    follower = replicas("follower", leader=False)
    await produce(leader, 1, b"a")
    res = await leader.read(0, 1 << 20, leader.log_end_offset)
    with pytest.raises(NotLeader):
        await leader.append_as_follower(res.data)
    with pytest.raises(NotLeader):
        await follower.append(*request([b"x"]))


async def test_divergent_tail_is_truncated_by_leader_epoch(replicas):
    """A (epoch 3) writes to 30 while B copies only to 24 and C to 30; B becomes leader in
    epoch 5 and writes on; C truncates where B's epoch 3 ended and copies B's log."""
    a = replicas("a")
    b = replicas("b", leader=False)
    c = replicas("c", leader=False)
    await produce(a, 12, b"e0")  # 24 offsets (1-3 records each: 12 batches of 1,2,3,...)
    a.make_leader(3)
    start3 = a.log_end_offset
    await produce(a, 6, b"e3")
    await replicate(a, c)
    mid = next(base for base, *_ in batches(a) if base > start3)  # B has epoch 3's first batch only
    await replicate(a, b, until=mid)
    assert (b.log_end_offset, c.log_end_offset) == (mid, a.log_end_offset)

    b.make_leader(5)  # the controller elects B; C follows it
    c.make_follower(5)
    await produce(b, 4, b"e5")
    epoch, end = b.end_offset_for_epoch(c.log.epochs.latest_epoch)
    assert (epoch, end) == (3, mid)
    await c.truncate_to(end)
    assert c.log_end_offset == mid and c.log.epochs.latest_epoch == 3
    await replicate(b, c)
    assert log_bytes(c) == log_bytes(b)
    assert c.log.epochs.entries() == b.log.epochs.entries() == [(0, 0), (3, start3), (5, mid)]
    records = decode_records(log_bytes(c), "t", 0)
    assert all(r.value.startswith(b"e5-") for r in records if r.offset >= mid), "A's tail is gone"


async def test_truncation_waits_for_queued_appends_and_orders_with_later_ones(replicas):
    leader = replicas("leader")
    follower = replicas("follower", leader=False)
    await produce(leader, 10, b"a")
    res = await leader.read(0, 1 << 20, leader.log_end_offset)
    blobs = [bytes(res.data[pos : pos + h.size]) for h, pos in iter_batches(res.data)]
    first = follower.append_as_follower(b"".join(blobs[:5]))
    cut = asyncio.ensure_future(follower.truncate_to(3))  # offsets 0..2 are the first 2 batches
    again = follower.append_as_follower(b"".join(blobs[2:4]))
    await asyncio.gather(first, cut, again)
    assert follower.log_end_offset == sum(1 + i % 3 for i in range(4))
    assert log_bytes(follower) == b"".join(blobs[:4])


async def test_a_follower_behind_its_leaders_log_start_starts_over_there(replicas):
    leader = replicas("leader", **{"retention.bytes": "0"})
    follower = replicas("follower", leader=False)
    await produce(leader, 6, b"old")
    await replicate(leader, follower)
    await produce(leader, 40, b"new")
    for seg in leader.take_expired(0):  # retention: the leader keeps only its active segment
        seg.delete()
    start = leader.log_start_offset
    assert start > follower.log_end_offset
    await follower.reset_to(start)
    assert (follower.log_start_offset, follower.log_end_offset, follower.high_watermark) == (start, start, start)
    assert follower.log.epochs.entries() == []
    await replicate(leader, follower)
    assert batches(follower) == batches(leader)
    end = follower.log_end_offset
    await follower.close()
    again = replicas("follower", leader=False)  # a restart keeps the new start
    assert (again.log_start_offset, again.log_end_offset) == (start, end)
