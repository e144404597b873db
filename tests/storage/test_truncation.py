"""Truncation of a divergent tail while reader threads read: no EBADF, no wrong bytes.

Every record's value names its offset and the round that wrote it (``"<offset>:<round>"``),
so a read that mixed bytes of two versions of the log, or of another file, cannot decode
as batches whose records agree with their offsets.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time

import pytest
from storage_helpers import append_batches

from sluice.protocol.records import decode_records
from sluice.storage.log import LogConfig, NotYetAvailable, OutOfRange, PartitionLog

CONFIG = LogConfig(segment_bytes=1500, retention_ms=-1, index_interval_bytes=200)

pytestmark = pytest.mark.timeout(120)


def _append(plog: PartitionLog, rnd: int, batches: int, epoch: int) -> None:
    for _ in range(batches):
        base = plog.log_end_offset
        values = [b"%d:%d:" % (base + i, rnd) + b"v" * 40 for i in range(3)]
        append_batches(plog, [values], epoch=epoch)


def test_reads_during_truncation_and_segment_deletion_see_whole_correct_batches(tmp_path):
    plog = PartitionLog.open(tmp_path, CONFIG)
    _append(plog, 0, 60, epoch=0)
    stop = threading.Event()
    failures: list[BaseException] = []
    stats = {"reads": 0, "records": 0, "gone": 0}

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                view = plog.view
                start, hw = view.bases[0], view.high_watermark.offset
                if hw <= start:
                    continue
                offset = rng.randrange(start, hw)
                try:
                    res = plog.read(offset, rng.choice([1, 300, 5000]), hw)
                except (OutOfRange, NotYetAvailable):
                    stats["gone"] += 1  # cut or expired meanwhile: a fair answer
                    continue
                recs = decode_records(res.data, "t", 0, min_offset=offset)  # checks every CRC
                if not recs and plog.generation != view.generation:
                    stats["gone"] += 1  # the bound fell inside a batch of the new tail
                    continue
                assert recs, f"no record at {offset} below {hw}"
                assert recs[0].offset == offset
                for prev, rec in zip(recs, recs[1:], strict=False):
                    assert rec.offset == prev.offset + 1
                for rec in recs:
                    assert rec.offset < hw
                    assert rec.value.split(b":")[0] == b"%d" % rec.offset, (rec.offset, rec.value)
                stats["reads"] += 1
                stats["records"] += len(recs)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    # a count of rounds, not a time: a busy machine runs fewer rounds a second (the cap only
    # bounds a hang)
    deadline = time.monotonic() + 120
    rounds = 0
    try:
        while (rounds < 30 or stats["reads"] < 200) and time.monotonic() < deadline and not failures:
            rounds += 1
            # cut a divergent tail (often across segments), then write a new one
            cut = rng.randrange(max(plog.log_start_offset, plog.log_end_offset - 120), plog.log_end_offset)
            plog.truncate_to(cut)
            assert plog.log_end_offset <= cut and plog.high_watermark == plog.log_end_offset
            _append(plog, rounds, rng.randrange(5, 40), epoch=rounds)
            if rounds % 5 == 0:  # retention: drop the oldest segments, close their files
                plog.config = dataclasses.replace(CONFIG, retention_bytes=6 * CONFIG.segment_bytes)
                for seg in plog.expired_segments(0):
                    seg.delete()
                    seg.close()
                plog.config = CONFIG
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    if failures:
        raise failures[0]
    assert rounds >= 30 and stats["reads"] >= 200, (rounds, stats)
    plog.close()


def test_truncation_fsyncs_the_cut_and_the_directory(tmp_path, monkeypatch):
    plog = PartitionLog.open(tmp_path, CONFIG)
    _append(plog, 0, 40, epoch=0)
    assert len(plog.segments) > 2
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    first = plog.segments[0]
    plog.truncate_to(first.base_offset + 3)
    assert first.fileno in synced, "ftruncate is followed by an fsync of the file"
    assert len(synced) >= 2, "and of the directory, after the later segments were removed"
    assert [p.name for p in sorted(tmp_path.glob("*.log"))] == [first.path.name]
    assert os.path.getsize(first.path) == first.size
    plog.close()
    reopened = PartitionLog.open(tmp_path, CONFIG)
    try:
        assert reopened.cuts == [] and reopened.log_end_offset == 3
    finally:
        reopened.close()


def test_a_removed_segment_stays_open_for_the_reader_that_pinned_it(tmp_path):
    plog = PartitionLog.open(tmp_path, CONFIG)
    _append(plog, 0, 40, epoch=0)
    seg = plog.segments[-1]
    with seg.pinned():
        fd = seg.fileno
        plog.truncate_to(seg.base_offset)  # removes the segment: close deferred
        assert not seg.pin()
        assert os.fstat(fd).st_size > 0  # still this file's descriptor
        assert len(seg.read(0, 100)) == 100
    assert seg._file is None  # closed by the last unpin
    plog.close()


def test_truncation_keeps_indexes_and_time_bounds_right(tmp_path):
    plog = PartitionLog.open(tmp_path, dataclasses.replace(CONFIG, segment_bytes=1 << 20))
    for ts in [5, 50, 20, 80, 10, 90, 30]:
        append_batches(plog, [[b"x" * 150]], [ts])
    plog.truncate_to(4)  # keeps timestamps 5, 50, 20, 80
    seg = plog.active
    assert seg.next_offset == 4 and seg.max_timestamp == 80
    assert all(o < 4 for o in seg.index.offsets) and all(o < 4 for o in seg.timeindex.offsets)
    assert plog.offset_for_time(85, plog.high_watermark) is None
    assert plog.offset_for_time(60, plog.high_watermark) == 3
    append_batches(plog, [[b"y"]], [100])
    assert plog.offset_for_time(85, plog.high_watermark) == 4
    plog.close()
