"""The partition's tail (storage/tail.py): reads at the end of the log answered from memory,
byte for byte what the log itself answers, and never bytes the log no longer holds."""

from __future__ import annotations

import random

import pytest
from batches import idempotent, request, request_of

from sluice.broker.partition import Partition
from sluice.config import ServerConfig
from sluice.errors import ConfigError
from sluice.storage.tail import Tail

pytestmark = pytest.mark.timeout(60)


def check_reads(part: Partition, rng: random.Random, reads: int = 40) -> int:
    """Random reads near the end: the tail's answer, where it has one, is the log's.
    Returns how many reads the tail answered."""
    plog, answered = part.log, 0
    start, end = plog.log_start_offset, plog.log_end_offset
    for _ in range(reads):
        offset = rng.randint(max(start, end - 60), end - 1)
        bound = rng.choice([end, rng.randint(offset, end)])
        max_bytes = rng.choice([0, 1, 100, 700, 5000, 1 << 20])
        got = part.reads.tail.read(offset, max_bytes, bound)
        if got is not None:
            answered += 1
            assert got == plog.read(offset, max_bytes, bound).data, (offset, max_bytes, bound)
    return answered


@pytest.mark.parametrize("seed", range(6))
async def test_the_tail_answers_as_the_log_does(open_partition, seed):
    rng = random.Random(seed)
    # small segments and a small tail: rolls and trims happen often
    part = open_partition(tail_cache_bytes=3000, **{"segment.bytes": "6000", "flush.messages": "0"})
    sent: list[bytes] = []  # idempotent batches, some sent again (duplicates, whole or mixed)
    answered = 0
    for _ in range(120):
        values = [rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.5:
            result = await part.append(*request(values))
        else:
            batch = idempotent(values, 7, sum(_count(b) for b in sent))
            if sent and rng.random() < 0.3:  # a retried batch beside a new one
                result = await part.append(*request_of(rng.choice(sent[-3:]), batch))
            else:
                result = await part.append(*request_of(batch))
            sent.append(batch)
        # the newest write is always in the tail
        newest, end = result.batch_offsets[-1], part.log_end_offset
        assert part.reads.tail.read(newest, 1 << 20, end) == part.log.read(newest, 1 << 20, end).data
        answered += check_reads(part, rng)
    assert answered > 400


def _count(batch: bytes) -> int:
    return int.from_bytes(batch[57:61], "big")  # records in a batch (its header's last field)


async def test_reads_after_a_truncation_come_from_the_log(open_partition):
    part = open_partition(**{"flush.messages": "0"})
    for i in range(10):
        await part.append(*request([b"x%d" % i] * 3))
    assert part.reads.tail.read(27, 1 << 20, 30) is not None
    await part.truncate_to(15)
    assert part.reads.tail.read(12, 1 << 20, 15) is None
    await part.append(*request([b"after"] * 5))
    got = await part.read(12, 1 << 20, part.log_end_offset)
    assert got.data == part.log.read(12, 1 << 20, part.log_end_offset).data
    assert part.reads.tail.read(15, 1 << 20, 20) == part.log.read(15, 1 << 20, 20).data


async def test_no_tail_when_it_is_off(open_partition):
    part = open_partition(tail_cache_bytes=0, **{"flush.messages": "0"})
    await part.append(*request([b"x"] * 3))
    assert part.reads.tail.read(0, 1 << 20, 3) is None
    assert (await part.read(0, 1 << 20, 3)).data == part.log.read(0, 1 << 20, 3).data


def test_a_negative_tail_size_is_refused():
    with pytest.raises(ConfigError, match="tail cache bytes"):
        ServerConfig(tail_cache_bytes=-1)


def test_a_small_part_of_a_large_frame_is_copied_not_kept_with_its_frame():
    tail = Tail(1 << 20)
    frame = bytearray(64 * 1024)  # a request frame, mostly other partitions' batches
    with memoryview(frame) as whole:
        tail.add(0, [(0, 1, -1, 100)], [whole[:100]])
    frame.append(0)  # the tail keeps no view into the frame (it could not grow if it did)
    assert tail.read(0, 1 << 20, 1) == bytes(100)
    with memoryview(frame) as whole:
        tail.add(0, [(1, 2, -1, 40_000)], [whole[100:40_100]])  # most of its frame: kept as is
    with pytest.raises(BufferError):
        frame.append(0)
    tail.clear()
    frame.append(0)
