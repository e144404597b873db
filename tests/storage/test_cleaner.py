"""The log cleaner (storage/cleaner.py) against a plain model, and its swap at every step.

The model is the list of (offset, key, value) appended.  After a pass over the segments
below ``plan.end``: there, a keyless record survives, a keyed one only if it is the latest
of its key among those segments (and, for a tombstone, only while its segment's tombstones
are kept); at and above ``plan.end`` nothing changes.  Offsets, the log end and the high
watermark never change, and a read from any offset gives the first survivor at or after it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import append_batches, make_keyed_batch

from sluice.protocol.records import decode_records, iter_batches
from sluice.storage.cleaner import (
    CLEANED_SUFFIX,
    CLEANER_CHECKPOINT,
    SWAP_SUFFIX,
    clean_segments,
    commit_cleaning,
    plan_cleaning,
)
from sluice.storage.log import LogConfig, PartitionLog

CONFIG = LogConfig(segment_bytes=400, retention_ms=-1, index_interval_bytes=100)
DAY = 24 * 3600 * 1000

KEYS = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"]))
VALUES = st.one_of(st.none(), st.binary(min_size=1, max_size=12))
BATCHES = st.lists(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=4), min_size=1, max_size=30)


def run_pass(plog: PartitionLog, now: int, delete_retention_ms: int = DAY, min_dirty: int = 0):
    """One cleaner pass, step by step as Compaction._clean runs it (broker/compacting.py); the plan (None: no pass)."""
    plan = plan_cleaning(plog, min_dirty, delete_retention_ms, now)
    if plan is None:
        return None
    cleaned = clean_segments(plan, threading.Event())
    swapped = commit_cleaning(plan, cleaned, plog.directory)
    plog.swap_segments([(c.old, c.new) for c in swapped if c.new], plan.end)
    for c in swapped:
        if c.new is not None:
            c.old.close()
    return plan


def read_records(plog: PartitionLog, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) from ``start`` to the high watermark, read as a consumer does:
    after each fetch, go on at the end of the last whole batch."""
    offset = plog.log_start_offset if start is None else start
    out = []
    while offset < plog.high_watermark:
        data = plog.read(offset, 300, plog.high_watermark).data
        out += [(r.offset, r.key, r.value) for r in decode_records(data, "t", 0, offset)]
        ends = [h.next_offset for h, _ in iter_batches(data)]
        assert ends and ends[-1] > offset, f"no progress at {offset}"
        offset = ends[-1]
    return out


def append(plog: PartitionLog, batches) -> list[tuple[int, bytes | None, bytes | None]]:
    model = []
    for records in batches:
        base = append_batches(plog, [make_keyed_batch(records)])[0]
        model += [(base + i, k, v) for i, (k, v) in enumerate(records)]
    return model


def expected(model, end: int, keep_tombstone) -> list:
    latest = {k: o for o, k, _ in model if k is not None and o < end}
    return [
        (o, k, v) for o, k, v in model
        if o >= end or k is None or (latest[k] == o and (v is not None or keep_tombstone(o)))
    ]


def closed(plog: PartitionLog) -> None:
    """Drop the log as a crash would: files closed, nothing saved."""
    for seg in plog.segments:
        seg.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=BATCHES, second=st.lists(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=4), max_size=12))
def test_cleaning_keeps_the_latest_of_each_key(tmp_path_factory, first, second):
    d = tmp_path_factory.mktemp("log") / "t-0"
    plog = PartitionLog.open(d, CONFIG)
    model = append(plog, first)
    ends = (plog.log_end_offset, plog.high_watermark)
    t0 = 10 * DAY

    plan = run_pass(plog, t0)
    if plan is None:  # nothing below the active segment
        assert len(plog.segments) == 1
        return
    model = expected(model, plan.end, lambda o: True)  # tombstones of dirty segments stay
    assert read_records(plog) == model
    assert (plog.log_end_offset, plog.high_watermark) == ends
    for o in range(plog.log_start_offset, plog.high_watermark):  # a removed offset reads as the next survivor
        assert read_records(plog, o)[:1] == [r for r in model if r[0] >= o][:1]

    model += append(plog, second)
    plog.close()
    plog = PartitionLog.open(d, CONFIG)
    assert plog.cleaned_up_to == plan.end
    assert read_records(plog) == model

    # a second pass long after the first: tombstones of segments cleaned before go
    first_end = plan.end
    plan = run_pass(plog, t0 + 2 * DAY, delete_retention_ms=DAY)
    if plan is not None:
        seg_ends = [s.next_offset for s in plan.segments]
        model = expected(model, plan.end, lambda o: o >= first_end or not any(e <= first_end for e in seg_ends if o < e))
        assert read_records(plog) == model
    epochs = plog.epochs.entries()
    plog.close()
    plog = PartitionLog.open(d, CONFIG)
    assert read_records(plog) == model
    assert plog.epochs.entries() == epochs
    plog.close()


def test_a_tombstone_stays_for_delete_retention_after_its_segment_was_cleaned(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", CONFIG)
    append(plog, [[(b"k", b"v" * 100)], [(b"k", None)], [(b"x", b"1" * 150)], [(b"x", b"2" * 150)]])
    append(plog, [[(b"y", b"3" * 150)]])  # rolls: the tombstone's segment is closed
    t0 = 10 * DAY
    assert run_pass(plog, t0, delete_retention_ms=1000) is not None
    assert (1, b"k", None) in read_records(plog)
    append(plog, [[(b"z", b"4" * 300)]] * 3)  # more dirt, so a second pass runs
    run_pass(plog, t0 + 999, delete_retention_ms=1000)
    assert (1, b"k", None) in read_records(plog)  # cleaned 999 ms ago: still there
    append(plog, [[(b"z", b"5" * 300)]] * 3)
    run_pass(plog, t0 + 1000, delete_retention_ms=1000)
    assert [r for r in read_records(plog) if r[1] == b"k"] == []
    plog.close()


def test_a_partition_below_the_dirty_ratio_is_not_cleaned(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", CONFIG)
    append(plog, [[(b"k", b"v" * 150)]] * 6)
    assert run_pass(plog, DAY, min_dirty=100) is not None  # all dirty: 100 %
    assert plan_cleaning(plog, 1, DAY, DAY) is None  # all clean now
    append(plog, [[(b"k", b"w" * 150)]] * 2)
    clean_bytes = sum(s.size for s in plog.segments[:-1] if s.next_offset <= plog.cleaned_up_to)
    dirty = sum(s.size for s in plog.segments[:-1] if s.next_offset > plog.cleaned_up_to)
    assert clean_bytes and dirty
    pct = dirty * 100 // (dirty + clean_bytes)
    assert plan_cleaning(plog, pct + 1, DAY, DAY) is None
    assert plan_cleaning(plog, pct, DAY, DAY) is not None
    plog.close()


def test_nothing_at_or_above_the_high_watermark_is_cleaned(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", CONFIG)
    append(plog, [[(b"k", b"v" * 150)]] * 2)
    for _ in range(6):
        append_batches(plog, [make_keyed_batch([(b"k", b"w" * 150)])], advance=False)
    hw = plog.high_watermark
    plan = run_pass(plog, DAY)
    assert plan is not None and plan.end <= hw
    plog.advance_high_watermark(plog.log_end_offset)
    assert [o for o, *_ in read_records(plog) if o >= hw] == list(range(hw, plog.log_end_offset))
    plog.close()


# ---------------------------------------------------------------------- swap and crash


@pytest.fixture
def dirty_log(tmp_path):
    """A log of one key rewritten 12 times over several segments; (dir, records before)."""
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, CONFIG)
    append(plog, [[(b"k", str(i).encode() * 60), (None, b"keyless")] for i in range(12)])
    before = read_records(plog)
    plog.close()
    return d, before


def _cleaned_view(d: Path):
    plog = PartitionLog.open(d, CONFIG)
    got = read_records(plog)
    plog.close()
    return got


@pytest.mark.parametrize("step", ["copied", "one-swap", "all-swapped", "installed", "indexed"])
def test_a_crash_at_any_step_leaves_each_segment_old_or_cleaned(dirty_log, step):
    d, before = dirty_log
    plog = PartitionLog.open(d, CONFIG)
    plan = plan_cleaning(plog, 0, DAY, DAY)
    cleaned = [c for c in clean_segments(plan, threading.Event()) if c.new is not None]
    assert len(cleaned) >= 2
    paths = [c.old.path for c in cleaned]
    if step != "copied":
        for i, p in enumerate(paths):
            if step == "one-swap" and i:
                break
            os.replace(p.with_name(p.name + CLEANED_SUFFIX), p.with_name(p.name + SWAP_SUFFIX))
    if step in ("installed", "indexed"):
        for p in paths:
            p.with_suffix(".index").unlink(missing_ok=True)
            os.replace(p.with_name(p.name + SWAP_SUFFIX), p)
    if step == "indexed":
        for c in cleaned:
            c.new.save_indexes()
    for c in cleaned:
        c.new.close()
    closed(plog)

    got = _cleaned_view(d)
    assert not list(d.glob("*" + CLEANED_SUFFIX)) and not list(d.glob("*" + SWAP_SUFFIX))
    survivors = [r for r in before if r[0] >= plan.end or r[1] is None or r[0] == max(
        o for o, k, _ in before if k == b"k" and o < plan.end)]
    swapped_bases = {c.old.base_offset for c in cleaned}
    if step == "copied":
        assert got == before
    elif step == "one-swap":  # the first segment cleaned, the others as they were
        first = min(swapped_bases)
        first_end = next(c.old.next_offset for c in cleaned if c.old.base_offset == first)
        assert [r for r in got if r[0] >= first_end] == [r for r in before if r[0] >= first_end]
        assert [r for r in got if r[0] < first_end] == [r for r in before if r[0] < first_end and r[1] is None]
    else:
        assert got == survivors
    assert not (d / CLEANER_CHECKPOINT).exists()  # a lagging hint: the next pass redoes it


def test_readers_of_the_old_segments_are_unharmed(dirty_log):
    d, before = dirty_log
    plog = PartitionLog.open(d, CONFIG)
    old = plog.segments[0]
    view = plog.view
    assert old.pin()  # a reader in flight
    try:
        run_pass(plog, DAY)
        assert plog.segments[0] is not old
        got = [(r.offset, r.key, r.value) for r in decode_records(old.read(0, old.size), "t", 0)]
        assert got == [r for r in before if r[0] < old.next_offset]  # its bytes, as they were
    finally:
        old.unpin()
    assert not old.pin()  # closed once its reader let go
    assert plog._read(plog.view, 0, 1 << 20, plog.high_watermark).data  # the new view reads
    assert view.segments[0] is old
    plog.close()


def test_a_pass_stops_when_asked_and_leaves_nothing_behind(dirty_log):
    d, before = dirty_log
    plog = PartitionLog.open(d, CONFIG)
    stop = threading.Event()
    stop.set()
    assert clean_segments(plan_cleaning(plog, 0, DAY, DAY), stop) is None
    assert not list(d.glob("*" + CLEANED_SUFFIX))
    assert read_records(plog) == before
    plog.close()
