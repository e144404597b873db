"""Compaction of a live partition (Partition.clean): the writer keeps going meanwhile, a
truncation discards a pass, retention leaves compacted partitions alone, and a follower
copies a compacted leader's log, gaps included."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.broker import compacting as partition_module
from sluice.broker.partition import Partition
from sluice.protocol.records import (
    build_batch,
    decode_records,
    encode_record,
    iter_batches,
    validate_batches,
)

pytestmark = pytest.mark.timeout(60)

COMPACT = {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.percent": "0"}


@pytest.fixture
def cleaner():
    ex = ThreadPoolExecutor(1, thread_name_prefix="test-cleaner")
    yield ex
    ex.shutdown(wait=True)


def keyed(key: bytes, value: bytes | None) -> tuple[bytearray, list]:
    data = bytearray(build_batch(encode_record(0, 0, key, value), 1, 1_000, 1_000))
    return data, validate_batches(data, 1 << 30)


async def produce(part: Partition, n: int, keys: int = 5, tag: bytes = b"v") -> dict[bytes, tuple[int, bytes]]:
    latest = {}
    for i in range(n):
        key = b"k%d" % (i % keys)
        value = b"%s-%d-" % (tag, i) + b"x" * 60
        res = await part.append(*keyed(key, value))
        latest[key] = (res.base_offset, value)
    return latest


async def consume(part: Partition, start: int = 0) -> list[tuple[int, bytes, bytes]]:
    """As a consumer: read from ``start``, go on at the end of the last batch returned."""
    out, offset = [], start
    while offset < part.high_watermark:
        res = await part.read(offset, 500, part.high_watermark)
        out += [(r.offset, r.key, r.value) for r in decode_records(res.data, "t", 0, offset)]
        offset = [h.next_offset for h, _ in iter_batches(res.data)][-1]
    return out


async def test_clean_keeps_latest_per_key_while_the_writer_goes_on(open_partition, cleaner):
    part = open_partition(**COMPACT)
    await produce(part, 60)
    before_end = part.log_end_offset
    size_before = part.log.size_bytes
    cleaning = asyncio.ensure_future(part.clean(cleaner, int(time.time() * 1000)))
    more = await produce(part, 10, tag=b"w")  # appends complete while the pass runs
    freed = await cleaning
    assert freed > 0 and part.log.size_bytes < size_before + 10 * 100
    got = await consume(part)
    below = [r for r in got if r[0] < part.log.cleaned_up_to]
    assert len({k for _, k, _ in below}) == len(below), "one record per key below the cleaned end"
    latest = {k: (o, v) for o, k, v in got}
    assert latest == {**latest, **more}
    assert [o for o, *_ in got if o >= before_end] == list(range(before_end, part.log_end_offset))
    assert part.take_expired(int(time.time() * 1000) + 10**12) == []  # no retention when compacted


async def test_a_truncation_during_a_pass_discards_it(open_partition, cleaner, monkeypatch):
    part = open_partition(**COMPACT)
    await produce(part, 40)
    started, go_on = threading.Event(), threading.Event()
    real = partition_module.clean_segments

    def slow_clean(plan, stop):
        started.set()
        go_on.wait(10)
        return real(plan, stop)

    monkeypatch.setattr(partition_module, "clean_segments", slow_clean)
    cleaning = asyncio.ensure_future(part.clean(cleaner, int(time.time() * 1000)))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    await part.truncate_to(part.log_end_offset - 3)  # never waits for the pass
    go_on.set()
    assert await cleaning == 0
    assert not list(part.log.directory.glob("*.cleaned"))
    assert len(await consume(part)) == part.log_end_offset  # nothing cleaned


async def test_close_stops_a_pass(open_partition, cleaner, monkeypatch):
    part = open_partition(**COMPACT)
    await produce(part, 40)
    started = threading.Event()
    real = partition_module.clean_segments

    def watched(plan, stop):
        started.set()
        stop.wait(10)  # as a long pass would notice between batches
        return real(plan, stop)

    monkeypatch.setattr(partition_module, "clean_segments", watched)
    cleaning = asyncio.ensure_future(part.clean(cleaner, int(time.time() * 1000)))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    await asyncio.wait_for(part.close(), 10)
    assert await cleaning == 0
    assert not list(part.log.directory.glob("*.cleaned"))


async def test_a_follower_copies_a_compacted_leader_gaps_and_all(open_partition, cleaner):
    leader = open_partition("leader", **COMPACT)
    follower = open_partition("follower", leader=False, **COMPACT)
    await produce(leader, 80, keys=3)
    assert await leader.clean(cleaner, int(time.time() * 1000)) > 0
    while follower.log_end_offset < leader.log_end_offset:  # a replica fetch loop from scratch
        res = await leader.read(follower.log_end_offset, 300, leader.log_end_offset)
        await follower.append_as_follower(res.data)
    follower.advance_high_watermark(leader.high_watermark)
    assert follower.log_end_offset == leader.log_end_offset
    assert await consume(follower) == await consume(leader)
    assert follower.log.epochs.entries() == leader.log.epochs.entries()
