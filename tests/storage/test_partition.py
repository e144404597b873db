"""Partition's group-commit writer: grouping, offsets, flush policy, disk-full handling.

``os.pwritev``, ``Segment.flush`` and ``Syncer.fdatasync`` are wrapped to count (or fail)
the writer's system calls; the model is the list of values in queue order, which must come back densely
numbered from offset 0.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from storage_helpers import BIG, make_batch, read_all

from sluice.broker.partition import Partition
from sluice.config import TopicConfig
from sluice.errors import DiskFull, StorageError
from sluice.protocol.records import validate_batches
from sluice.storage.log import PartitionLog
from sluice.storage.segment import Segment
from sluice.storage.syncer import Syncer

_real_pwritev = os.pwritev


def request(batches: list[list[bytes]], ts: int = 1_000) -> tuple[bytearray, list]:
    """One produce request's partition data: validated batches, as the broker hands them."""
    data = bytearray(b"".join(make_batch(v, ts) for v in batches))
    return data, validate_batches(data, BIG)


class Calls:
    """Counts of the writer's pwritev calls and its fsyncs: Segment.flush in any thread, and
    those handed to the syncer."""

    def __init__(self, monkeypatch) -> None:
        self.writes = 0
        self.flushes = 0
        real_flush = Segment.flush
        real_fdatasync = Syncer.fdatasync

        def pwritev(fd, buffers, offset):
            self.writes += 1
            return _real_pwritev(fd, buffers, offset)

        def flush(seg):
            self.flushes += 1
            real_flush(seg)

        def fdatasync(syncer, fd):
            self.flushes += 1
            return real_fdatasync(syncer, fd)

        monkeypatch.setattr(os, "pwritev", pwritev)
        monkeypatch.setattr(Segment, "flush", flush)
        monkeypatch.setattr(Syncer, "fdatasync", fdatasync)


@pytest.fixture
async def open_partition(tmp_path):
    """open_partition(**topic_config) -> a Partition on a fresh log; closed at teardown."""
    write_ex = ThreadPoolExecutor(1, thread_name_prefix="test-write")
    read_ex = ThreadPoolExecutor(2, thread_name_prefix="test-read")
    opened: list[Partition] = []

    def open_(**raw: str) -> Partition:
        config = TopicConfig.parse(raw)
        plog = PartitionLog.open(tmp_path / "t-0", config.log_config)
        # the Python syncer: its writes and fsyncs are the os calls these tests wrap (the
        # native one makes the same calls in C: tests/storage/test_syncer.py)
        part = Partition("t", 0, plog, config, write_ex, read_ex, syncer=Syncer(1, write_ex, native=False))
        opened.append(part)
        return part

    yield open_
    for part in opened:
        if not part.closing:  # a test may have closed it already
            await part.close()
        part.writer.syncer.close()
    write_ex.shutdown(wait=True)
    read_ex.shutdown(wait=True)


def expected_records(requests: list[list[list[bytes]]]) -> list[tuple[int, bytes]]:
    values = [v for req in requests for batch in req for v in batch]
    return list(enumerate(values))


# --------------------------------------------------------------------------- group commit


async def test_queued_appends_are_one_group(open_partition, monkeypatch):
    part = open_partition(**{"timestamp.type": "CreateTime"})
    calls = Calls(monkeypatch)
    # 40 requests of 1-3 batches of 1-4 records, all queued before the writer task runs
    requests = [
        [[b"r%d-b%d-v%d" % (r, b, v) for v in range(1 + (r + b) % 4)] for b in range(1 + r % 3)]
        for r in range(40)
    ]
    futures = [part.append(*request(req)) for req in requests]
    results = await asyncio.gather(*futures)

    assert calls.writes == 1 and calls.flushes == 1
    counts = [sum(len(b) for b in req) for req in requests]
    bases = [sum(counts[:i]) for i in range(len(counts))]
    assert [r.base_offset for r in results] == bases
    assert all(r.append_time == -1 for r in results)
    assert part.high_watermark == sum(counts)
    assert read_all(part.log) == expected_records(requests)


async def test_appends_while_writing_gather_into_the_next_group(open_partition, monkeypatch):
    part = open_partition()
    calls = Calls(monkeypatch)
    first = part.append(*request([[b"a"]]))
    await asyncio.sleep(0)  # the writer takes the first request alone
    rest = [part.append(*request([[b"b%d" % i]])) for i in range(10)]
    results = await asyncio.gather(first, *rest)
    assert [r.base_offset for r in results] == list(range(11))
    assert calls.writes == 2
    assert all(r.append_time > 0 for r in results)  # LogAppendTime by default


async def test_more_queued_requests_than_iov_max(open_partition):
    part = open_partition()
    n = os.sysconf("SC_IOV_MAX") + 10
    futures = [part.append(*request([[b"%d" % i]])) for i in range(n)]
    results = await asyncio.gather(*futures)
    assert [r.base_offset for r in results] == list(range(n))


async def test_short_writes_are_resumed(open_partition, monkeypatch):
    """pwritev may write less than asked: the rest follows at the right position."""
    part = open_partition()
    state = {"calls": 0}

    def short_pwritev(fd, buffers, offset):
        state["calls"] += 1
        data = b"".join(bytes(b) for b in buffers)
        return os.pwrite(fd, data[: max(1, len(data) // 3)], offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    requests = [[[b"x" * 50, b"y" * 7]], [[b"z" * 90]], [[b"w"]]]
    results = await asyncio.gather(*(part.append(*request(r)) for r in requests))
    assert [r.base_offset for r in results] == [0, 2, 3]
    assert state["calls"] > 3
    assert read_all(part.log) == expected_records(requests)
    assert part.log.active.size == os.path.getsize(part.log.active.path)


# --------------------------------------------------------------------------- flush policy


async def test_flush_messages_1_fsyncs_every_group_before_its_ack(open_partition, monkeypatch):
    part = open_partition(**{"flush.messages": "1"})
    calls = Calls(monkeypatch)
    seen = []
    for i in range(5):
        fut = part.append(*request([[b"%d" % i]]))
        fut.add_done_callback(lambda f: seen.append(calls.flushes))
        await fut
    assert seen == [1, 2, 3, 4, 5]
    assert calls.writes == 5


async def test_flush_messages_n_fsyncs_every_n_messages_after_the_acks(open_partition, monkeypatch):
    part = open_partition(**{"flush.messages": "3", "flush.ms": "0"})
    calls = Calls(monkeypatch)
    seen = []
    for i in range(7):
        await part.append(*request([[b"%d" % i]]))
        for _ in range(200):  # the fsync follows the ack in the background
            await asyncio.sleep(0.005)
            if calls.flushes == (i + 1) // 3:
                break
        seen.append(calls.flushes)
    assert seen == [0, 0, 1, 1, 1, 2, 2]


async def test_flush_ms_fsyncs_in_the_background_not_per_group(open_partition, monkeypatch):
    part = open_partition(**{"flush.messages": "0", "flush.ms": "50"})
    calls = Calls(monkeypatch)
    for i in range(10):
        await part.append(*request([[b"%d" % i]]))
    assert calls.writes == 10
    assert calls.flushes <= 3  # not per group (a slow machine may see flush.ms pass once or twice)
    start = time.monotonic()
    while calls.flushes == 0 and time.monotonic() - start < 2:
        await asyncio.sleep(0.005)
    assert calls.flushes >= 1, "no background fsync within 2 s of flush.ms=50"
    flushed = calls.flushes
    await asyncio.sleep(0.2)  # idle and flushed: nothing more to do
    assert calls.flushes == flushed


async def test_flush_ms_fsyncs_under_sustained_load(open_partition, monkeypatch):
    part = open_partition(**{"flush.messages": "0", "flush.ms": "20"})
    calls = Calls(monkeypatch)
    start, i = time.monotonic(), 0
    while time.monotonic() - start < 0.3:  # 15 flush intervals of back-to-back appends
        await part.append(*request([[b"%d" % i]]))
        i += 1
    assert i > 20
    assert calls.flushes >= 1


async def test_flush_ms_0_and_flush_messages_0_never_fsync_until_close(open_partition, monkeypatch):
    part = open_partition(**{"flush.messages": "0", "flush.ms": "0"})
    calls = Calls(monkeypatch)
    for i in range(5):
        await part.append(*request([[b"%d" % i]]))
    await asyncio.sleep(0.05)
    assert calls.flushes == 0
    await part.close()
    assert calls.flushes == 1


# --------------------------------------------------------------------------- write failures


def _fail_after_half(errno_: int):
    """A pwritev that writes the first half of its data, then fails like a full disk."""

    def pwritev(fd, buffers, offset):
        data = b"".join(bytes(b) for b in buffers)
        os.pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno_, os.strerror(errno_))

    return pwritev


@pytest.mark.parametrize("first", [0, 2], ids=["empty-log", "after-appends"])
async def test_disk_full_fails_the_group_and_leaves_the_file_as_it_was(
    open_partition, monkeypatch, first
):
    part = open_partition()
    before = [[[b"before-%d" % i]] for i in range(first)]
    for req in before:
        await part.append(*request(req))
    path = part.log.active.path
    size = os.path.getsize(path)

    monkeypatch.setattr(os, "pwritev", _fail_after_half(errno.ENOSPC))
    futures = [part.append(*request([[b"lost-%d" % i] * 3])) for i in range(4)]
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, DiskFull) for o in outcomes), outcomes
    assert os.path.getsize(path) == size == part.log.active.size
    assert part.high_watermark == first

    monkeypatch.setattr(os, "pwritev", _real_pwritev)
    result = await part.append(*request([[b"after"]]))
    assert result.base_offset == first
    assert read_all(part.log) == expected_records(before + [[[b"after"]]])


async def test_other_io_error_is_a_storage_error(open_partition, monkeypatch):
    part = open_partition()
    monkeypatch.setattr(os, "pwritev", _fail_after_half(errno.EIO))
    with pytest.raises(StorageError) as info:
        await part.append(*request([[b"x" * 100]]))
    assert not isinstance(info.value, DiskFull)
    assert os.path.getsize(part.log.active.path) == 0


async def test_failed_fsync_cuts_the_group_again(open_partition, monkeypatch):
    part = open_partition(**{"flush.messages": "1"})
    await part.append(*request([[b"kept"]]))
    size = os.path.getsize(part.log.active.path)

    def failing_fdatasync(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)  # the writer's thread fsyncs the group
    with pytest.raises(StorageError):
        await part.append(*request([[b"unsynced"]]))
    assert os.path.getsize(part.log.active.path) == size
    assert part.high_watermark == 1
    monkeypatch.undo()
    assert (await part.append(*request([[b"next"]]))).base_offset == 1
    assert read_all(part.log) == [(0, b"kept"), (1, b"next")]


async def test_closed_partition_refuses_appends_and_reopens_intact(open_partition, tmp_path):
    part = open_partition()
    requests = [[[b"a", b"b"]], [[b"c"]]]
    for req in requests:
        await part.append(*request(req))
    await part.close()
    with pytest.raises(Exception) as info:
        await part.append(*request([[b"late"]]))
    assert info.typename == "BrokerShuttingDown"
    plog = PartitionLog.open(tmp_path / "t-0", TopicConfig().log_config)
    try:
        assert plog.cuts == [] and read_all(plog) == expected_records(requests)
    finally:
        plog.close()
