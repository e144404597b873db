"""Partition: appended apart from acknowledged; the purgatory of acks=all writes; bounds.

A "slow follower" is simulated by stopping the ISR step (``Leadership.log_end_moved``) from moving
the high watermark: the test then moves it by hand with ``advance_high_watermark``, as
the replication step's ISR logic will.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from batches import request

from sluice.broker.partition import Partition
from sluice.errors import BrokerBusy, LeadershipLost, NotEnoughReplicas, NotLeader
from sluice.harness import eventually
from sluice.storage.log import NotYetAvailable, OutOfRange

pytestmark = pytest.mark.timeout(60)


def stall_followers(part: Partition, monkeypatch) -> None:
    """The high watermark no longer follows the log end by itself."""
    monkeypatch.setattr(part.leadership, "log_end_moved", lambda: None)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def until(condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` (the writer's fsync runs in a thread) until true or fail."""
    await eventually(condition, timeout, interval=0.002)


async def test_single_replica_acks_all_completes_through_the_high_watermark(open_partition):
    part = open_partition(**{"flush.messages": "1"})
    results = await asyncio.gather(*(part.append(*request([b"%d" % i]), acks_all=True) for i in range(5)))
    assert [r.base_offset for r in results] == [0, 1, 2, 3, 4]
    assert part.high_watermark == part.log_end_offset == 5
    await settle()
    assert part.leadership.acks.requests == 0 and part.leadership.acks.bytes == 0


async def test_acks_all_waits_for_the_high_watermark_and_acks_leader_does_not(open_partition, monkeypatch):
    part = open_partition()
    stall_followers(part, monkeypatch)
    waiting = [part.append(*request([b"a%d" % i, b"b"]), acks_all=True) for i in range(3)]
    leader = part.append(*request([b"leader"]))  # behind them in the same group
    assert (await leader).base_offset == 6, "acks=leader is answered once appended"
    assert not any(f.done() for f in waiting)
    assert (part.log_end_offset, part.high_watermark) == (7, 0)
    part.advance_high_watermark(3)  # a follower has 0..2: the first wait ends at 2, not passed
    await settle()
    assert [f.done() for f in waiting] == [True, False, False]
    part.advance_high_watermark(4)  # passes the second (ends at 4)
    await settle()
    assert [f.done() for f in waiting] == [True, True, False]
    part.advance_high_watermark(100)  # never past the log end
    assert part.high_watermark == 7
    assert [(await f).base_offset for f in waiting] == [0, 2, 4]


async def test_a_slow_acks_all_wait_never_holds_back_the_writer_or_other_waits(open_partition, monkeypatch):
    """Each wait has its own deadline: one given up leaves the purgatory, later ones and
    acks=leader writes carry on."""
    part = open_partition()
    stall_followers(part, monkeypatch)
    first = part.append(*request([b"x"]), acks_all=True)
    second = part.append(*request([b"y"]), acks_all=True)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(first, 0.05)  # the produce handler's timeout_ms
    await settle()
    assert first.cancelled() and part.leadership.acks.requests == 1
    for i in range(20):
        await part.append(*request([b"leader-%d" % i]))
    part.advance_high_watermark(2)  # the log end is 22 by now
    assert (await second).base_offset == 1
    await settle()
    assert part.leadership.acks.requests == 0


async def test_min_insync_replicas_above_the_isr_refuses_acks_all_at_once(open_partition):
    part = open_partition(**{"min.insync.replicas": "2"})
    fut = part.append(*request([b"x"]), acks_all=True)
    assert fut.done()
    with pytest.raises(NotEnoughReplicas, match="min.insync.replicas is 2"):
        await fut
    assert part.log_end_offset == 0, "nothing was written"
    assert (await part.append(*request([b"y"]))).base_offset == 0, "acks=leader still works"


async def test_purgatory_bound_by_count_answers_broker_busy_at_once(open_partition, monkeypatch):
    part = open_partition(**{"replica.wait.max.requests": "3"})
    stall_followers(part, monkeypatch)
    waiting = [part.append(*request([b"%d" % i]), acks_all=True) for i in range(3)]
    refused = part.append(*request([b"late"]), acks_all=True)
    assert refused.done() and isinstance(refused.exception(), BrokerBusy)
    assert refused.exception().retriable and refused.exception().appended_nothing
    await until(lambda: part.log_end_offset == 3)
    await settle()
    assert part.log_end_offset == 3, "the refused write appended nothing"
    part.advance_high_watermark(3)
    await asyncio.gather(*waiting)
    assert (await part.append(*request([b"again"]), acks_all=False)).base_offset == 3
    fut = part.append(*request([b"room"]), acks_all=True)  # room again once the waits ended
    await until(lambda: part.log_end_offset == 5)
    part.advance_high_watermark(5)
    assert (await fut).base_offset == 4


async def test_purgatory_bound_by_bytes(open_partition, monkeypatch):
    one = len(request([b"x" * 500])[0])
    part = open_partition(**{"replica.wait.max.bytes": str(2 * one)})
    stall_followers(part, monkeypatch)
    a = part.append(*request([b"x" * 500]), acks_all=True)
    b = part.append(*request([b"x" * 500]), acks_all=True)
    c = part.append(*request([b"x" * 500]), acks_all=True)
    assert isinstance(c.exception(), BrokerBusy) and "replica.wait.max.bytes" in str(c.exception())
    await until(lambda: part.log_end_offset == 2)
    assert not a.done() and not b.done()
    part.advance_high_watermark(2)
    await asyncio.gather(a, b)


async def test_one_request_larger_than_the_bounds_is_still_admitted(open_partition):
    part = open_partition(**{"replica.wait.max.bytes": "1024", "write.queue.max.bytes": "1024"})
    result = await part.append(*request([b"z" * 5000]), acks_all=True)
    assert result.base_offset == 0


async def test_writer_queue_is_bounded_in_bytes(open_partition):
    one = len(request([b"q" * 1000])[0])
    part = open_partition(**{"write.queue.max.bytes": str(3 * one)})
    # queued before the writer task runs: three fit, the fourth is refused at once
    futures = [part.append(*request([b"q" * 1000])) for _ in range(4)]
    assert isinstance(futures[3].exception(), BrokerBusy)
    assert [r.base_offset for r in await asyncio.gather(*futures[:3])] == [0, 1, 2]
    assert part.writer.queued_bytes == 0
    assert (await part.append(*request([b"after"]))).base_offset == 3


async def test_closing_fails_waits_that_can_no_longer_complete(open_partition, monkeypatch):
    part = open_partition()
    stall_followers(part, monkeypatch)
    fut = part.append(*request([b"x"]), acks_all=True)
    await until(lambda: part.log_end_offset == 1)
    await part.close()
    with pytest.raises(Exception) as info:
        await fut
    assert info.typename == "BrokerShuttingDown"


async def test_make_follower_fails_waits_and_refuses_leader_appends(open_partition, monkeypatch):
    part = open_partition()
    stall_followers(part, monkeypatch)
    fut = part.append(*request([b"x"]), acks_all=True)
    await until(lambda: part.log_end_offset == 1)
    part.make_follower(1)
    with pytest.raises(NotLeader):
        await fut
    with pytest.raises(NotLeader):
        await part.append(*request([b"y"]))
    with pytest.raises(ValueError):
        part.make_leader(0)  # epochs never go back


async def test_reads_are_bounded_by_the_high_watermark(open_partition, monkeypatch):
    part = open_partition(**{"timestamp.type": "CreateTime"})
    await part.append(*request([b"a", b"b"]))
    stall_followers(part, monkeypatch)
    await part.append(*request([b"c"]))
    assert (part.high_watermark, part.log_end_offset) == (2, 3)
    res = await part.read(0, 1 << 20, part.high_watermark)
    assert res.high_watermark == 2 and res.log_end_offset == 3
    assert len(res.data) == len(request([b"a", b"b"])[0]), "only the batch below the HW"
    assert (await part.read(2, 1 << 20, part.high_watermark)).data == b""
    with pytest.raises(NotYetAvailable):
        await part.read(3, 1 << 20, part.high_watermark)
    with pytest.raises(OutOfRange):
        await part.read(4, 1 << 20, part.high_watermark)
    replica = await part.read(2, 1 << 20, part.log_end_offset)  # a replica reads to the log end
    assert len(replica.data) == len(request([b"c"])[0])
    assert await part.offset_for_time(0) == 0
    assert await part.offset_for_time(2_000) is None


async def test_fetch_waiters_wake_when_the_high_watermark_moves_not_the_log_end(open_partition, monkeypatch):
    part = open_partition()
    stall_followers(part, monkeypatch)
    woken = []
    part.add_waiter(lambda: woken.append(True))
    await part.append(*request([b"x"]))
    await settle()
    assert woken == [] and part.log_end_offset == 1
    part.advance_high_watermark(1)
    assert woken == [True]


async def test_a_write_in_the_thread_when_leadership_moves_is_not_acknowledged(open_partition, monkeypatch):
    """A leader group written in the writer's thread (large) while make_follower runs: its
    acks=all wait must not enter the follower's purgatory, where the high watermark taken
    from the new leader would complete it over a tail that is truncated away."""
    part = open_partition()
    stall_followers(part, monkeypatch)
    gate = threading.Event()
    part.writer.write_executor.submit(gate.wait)  # the writer's thread is busy until the gate opens
    big = b"x" * 70_000  # every group is written in the thread
    write = part.append(*request([big]), acks_all=True)
    await until(lambda: not part.writer.queue)  # taken by the writer, waiting for its thread
    part.make_follower(1)
    gate.set()
    await until(lambda: part.log_end_offset == 1)
    part.advance_high_watermark(1)  # as a follower takes it from the new leader
    with pytest.raises(LeadershipLost) as info:
        await write
    assert info.value.appended_nothing is False  # it may have reached the new leader


async def test_make_follower_fails_waits_as_maybe_stored(open_partition, monkeypatch):
    part = open_partition()
    stall_followers(part, monkeypatch)
    fut = part.append(*request([b"x"]), acks_all=True)
    await until(lambda: part.log_end_offset == 1)
    part.make_follower(1)
    with pytest.raises(LeadershipLost):
        await fut
