"""What PartitionLog.open does with what a crash or a bad disk leaves behind.

Each test writes a log, closes it cleanly, damages the files the way a crash would, reopens
and compares with the records written (the model): whole batches before the damage stay,
the damage is cut, quarantined (``*.bad``) and reported in ``cuts``, appends continue.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import append_batches, batch_bounds, read_all

from sluice.errors import CorruptRecord
from sluice.protocol.records import ATTRIBUTES_OFFSET, decode_records
from sluice.storage.checkpoint import read_json, write_atomic, write_json
from sluice.storage.log import RECOVERY_POINT, LogConfig, PartitionLog

CONFIG = LogConfig(segment_bytes=500, retention_ms=-1, index_interval_bytes=150)


def value(i: int) -> bytes:
    return b"v%03d-" % i + bytes([i % 256]) * (i % 17)


def write_log(directory: Path, batches: int = 21) -> list[tuple[int, bytes]]:
    """A cleanly closed log of ``batches`` two-record batches over several segments."""
    plog = PartitionLog.open(directory, CONFIG)
    records = []
    for b in range(batches):
        vals = [value(2 * b), value(2 * b + 1)]
        base = append_batches(plog, [vals], [1000 + b])[0]
        records += [(base, vals[0]), (base + 1, vals[1])]
    assert len(plog.segments) >= 4
    plog.close()
    return records


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def layout(path: Path) -> list[tuple[int, int, int, int]]:
    """(position, size, base_offset, next_offset) of each batch in a segment file."""
    return batch_bounds(path.read_bytes())


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def reopen_and_check(directory: Path, expected: list[tuple[int, bytes]]) -> PartitionLog:
    """Open, check the log holds exactly ``expected`` and that appends continue after it."""
    plog = PartitionLog.open(directory, CONFIG)
    end = expected[-1][0] + 1 if expected else 0
    assert plog.high_watermark == plog.next_offset == end
    assert read_all(plog) == expected
    assert append_batches(plog, [[b"after"]]) == [end]
    assert read_all(plog, end) == [(end, b"after")]
    return plog


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "t-0"


# --------------------------------------------------------------------------- (a) torn tail


@pytest.mark.parametrize(
    "keep",
    [1, 20, 60, 61, 62, -1],
    ids=["1-byte", "mid-header", "header-less-1", "header-only", "header+1", "all-but-last"],
)
def test_torn_last_batch_is_cut_and_quarantined(logdir, keep):
    records = write_log(logdir)
    last = segment_files(logdir)[-1]
    pos, size, base, _ = layout(last)[-1]
    keep = keep if keep >= 0 else size - 1
    original = last.read_bytes()
    os.truncate(last, pos + keep)

    plog = reopen_and_check(logdir, [r for r in records if r[0] < base])
    try:
        [cut] = plog.cuts
        assert (cut.segment, cut.position, cut.dropped_bytes) == (last, pos, keep)
        assert cut.quarantine == last.with_name(f"{last.name}.{pos}.bad")
        assert cut.quarantine.read_bytes() == original[pos : pos + keep]
    finally:
        plog.close()
    # the cut is durable: the next open finds nothing to cut
    plog = PartitionLog.open(logdir, CONFIG)
    try:
        assert plog.cuts == []
        assert read_all(plog)[-1] == (base, b"after")
    finally:
        plog.close()


def test_torn_tail_spanning_several_batches_cuts_at_the_first_broken_one(logdir):
    records = write_log(logdir)
    last = segment_files(logdir)[-1]
    bounds = layout(last)
    assert len(bounds) >= 2
    pos, _, base, _ = bounds[-2]
    # a crash that wrote later pages but not an earlier one: zeros in the middle of a batch
    data = bytearray(last.read_bytes())
    data[pos + 30 :] = bytes(len(data) - pos - 30)
    last.write_bytes(bytes(data))

    plog = reopen_and_check(logdir, [r for r in records if r[0] < base])
    try:
        [cut] = plog.cuts
        assert (cut.position, cut.dropped_bytes) == (pos, len(data) - pos)
        assert cut.quarantine.read_bytes() == bytes(data[pos:])
    finally:
        plog.close()


def test_cut_at_a_batch_boundary_is_no_cut(logdir):
    records = write_log(logdir)
    last = segment_files(logdir)[-1]
    pos, _, base, _ = layout(last)[-1]
    os.truncate(last, pos)
    plog = reopen_and_check(logdir, [r for r in records if r[0] < base])
    try:
        assert plog.cuts == []
        assert not list(logdir.glob("*.bad"))
    finally:
        plog.close()


def test_empty_last_segment_file(logdir):
    records = write_log(logdir)
    last = segment_files(logdir)[-1]
    first_base = layout(last)[0][2]
    os.truncate(last, 0)
    plog = reopen_and_check(logdir, [r for r in records if r[0] < first_base])
    try:
        assert plog.cuts == []
        assert plog.active.base_offset == first_base
    finally:
        plog.close()


# --------------------------------------------------------------------------- (b) corruption


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_flipped_byte_in_crc_covered_region_of_last_segment_is_cut(data):
    with tempfile.TemporaryDirectory() as d:
        logdir = Path(d)
        records = write_log(logdir)
        last = segment_files(logdir)[-1]
        pos, size, base, _ = data.draw(st.sampled_from(layout(last)), "batch")
        at = data.draw(st.integers(pos + ATTRIBUTES_OFFSET, pos + size - 1), "position")
        mask = data.draw(st.integers(1, 255), "mask")
        file_size = last.stat().st_size
        flip(last, at, mask)

        plog = reopen_and_check(logdir, [r for r in records if r[0] < base])
        try:
            [cut] = plog.cuts
            assert (cut.segment, cut.position, cut.dropped_bytes) == (last, pos, file_size - pos)
            assert cut.quarantine.stat().st_size == file_size - pos
        finally:
            plog.close()


# --------------------------------------------------------------------------- (c) recovery point


def test_flipped_byte_below_recovery_point_is_not_verified_on_open(logdir):
    """By design only segments at/after the recovery point are CRC-checked on open: the
    damage stays in the log and readers (which check CRCs) see it."""
    records = write_log(logdir)
    second = segment_files(logdir)[1]
    pos, size, base, _ = layout(second)[0]
    flip(second, pos + size - 1)

    plog = PartitionLog.open(logdir, CONFIG)
    try:
        assert plog.cuts == []
        assert plog.high_watermark == records[-1][0] + 1
        with pytest.raises(CorruptRecord):
            decode_records(plog.read(base, 1 << 20, plog.high_watermark).data, "t", 0, min_offset=base)
        later = layout(segment_files(logdir)[2])[0][2]
        assert read_all(plog, later) == [r for r in records if r[0] >= later]
    finally:
        plog.close()


def test_flipped_byte_at_or_after_recovery_point_is_verified(logdir):
    """A crash before the recovery point moved on: every segment from it is checked, the
    bad one is cut and the segments after it are kept aside as ``*.log.bad``."""
    records = write_log(logdir)
    files = segment_files(logdir)
    second = files[1]
    bounds = layout(second)
    pos, size, base, _ = bounds[1]
    (logdir / RECOVERY_POINT).write_text(f"{bounds[0][2]}\n")
    flip(second, pos + size - 1)

    plog = reopen_and_check(logdir, [r for r in records if r[0] < base])
    try:
        [cut] = plog.cuts
        assert (cut.segment, cut.position) == (second, pos)
        assert [s.path for s in plog.segments] == files[:2]
        for later in files[2:]:
            assert not later.exists()
            assert later.with_name(later.name + ".bad").exists()
            assert not later.with_suffix(".index").exists()
            assert not later.with_suffix(".timeindex").exists()
    finally:
        plog.close()


def test_unreadable_recovery_point_verifies_every_segment(logdir):
    records = write_log(logdir)
    first = segment_files(logdir)[0]
    pos, size, base, _ = layout(first)[-1]
    (logdir / RECOVERY_POINT).write_text("garbage\n")
    flip(first, pos + size - 1)
    plog = reopen_and_check(logdir, [r for r in records if r[0] < base])
    try:
        assert [c.position for c in plog.cuts] == [pos]
    finally:
        plog.close()


def test_missing_middle_segment_keeps_later_ones_aside(logdir):
    records = write_log(logdir)
    files = segment_files(logdir)
    files[2].unlink()
    end = layout(files[1])[-1][3]
    plog = reopen_and_check(logdir, [r for r in records if r[0] < end])
    try:
        for later in files[3:]:
            assert later.with_name(later.name + ".bad").exists()
    finally:
        plog.close()


# --------------------------------------------------------------------------- (d) indexes


def _damage_missing(p: Path) -> None:
    p.unlink()


def _damage_partial(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-1])


def _damage_garbage(p: Path) -> None:
    p.write_bytes(b"\xff" * (24 if p.suffix == ".index" else 36))


def _damage_reversed(p: Path) -> None:
    width = 8 if p.suffix == ".index" else 12
    data = p.read_bytes()
    entries = [data[i : i + width] for i in range(0, len(data), width)]
    assert len(entries) >= 2, "test needs a segment with two index entries"
    p.write_bytes(b"".join(reversed(entries)))


def _damage_empty(p: Path) -> None:
    p.write_bytes(b"")


DAMAGES = [_damage_missing, _damage_partial, _damage_garbage, _damage_reversed, _damage_empty]


# an empty .timeindex is valid (a segment whose timestamps never grew has none): not damage
DAMAGE_CASES = [
    pytest.param(damage, suffix, id=f"{damage.__name__.removeprefix('_damage_')}{suffix}")
    for damage in DAMAGES
    for suffix in (".index", ".timeindex")
    if not (damage is _damage_empty and suffix == ".timeindex")
]


@pytest.mark.parametrize(("damage", "suffix"), DAMAGE_CASES)
@pytest.mark.parametrize("which", [0, 1, -1], ids=["first", "middle", "last"])
def test_damaged_index_is_rebuilt(logdir, damage, suffix, which):
    records = write_log(logdir)
    plog = PartitionLog.open(logdir, CONFIG)
    before = [
        (list(s.index.offsets), list(s.index.positions), list(s.timeindex.offsets), s.max_timestamp)
        for s in plog.segments
    ]
    times = [plog.offset_for_time(t, plog.high_watermark) for t in range(995, 1025)]
    plog.close()
    victim = segment_files(logdir)[which].with_suffix(suffix)
    damage(victim)

    plog = PartitionLog.open(logdir, CONFIG)
    try:
        assert plog.cuts == []
        after = [
            (
                list(s.index.offsets),
                list(s.index.positions),
                list(s.timeindex.offsets),
                s.max_timestamp,
            )
            for s in plog.segments
        ]
        assert after == before
        assert read_all(plog) == records
        assert [plog.offset_for_time(t, plog.high_watermark) for t in range(995, 1025)] == times
        for offset, val in records[::3]:  # point reads go through the rebuilt index
            got = decode_records(plog.read(offset, 20, plog.high_watermark).data, "t", 0, min_offset=offset)
            assert (got[0].offset, got[0].value) == (offset, val)
    finally:
        plog.close()
    for seg in segment_files(logdir):  # close writes the indexes back
        assert seg.with_suffix(".index").exists() and seg.with_suffix(".timeindex").exists()


def test_torn_middle_segment_is_found_through_its_stale_index(logdir):
    """A middle segment shortened behind the index's back: the index is not trusted."""
    records = write_log(logdir)
    files = segment_files(logdir)
    pos, _, base, _ = layout(files[1])[-1]
    os.truncate(files[1], pos + 10)  # torn inside the last batch, index still covers it
    plog = PartitionLog.open(logdir, CONFIG)
    try:
        [cut] = plog.cuts
        assert (cut.segment, cut.position) == (files[1], pos)
        assert read_all(plog) == [r for r in records if r[0] < base]
    finally:
        plog.close()


# --------------------------------------------------------------------------- (e) tmp files


def test_leftover_tmp_files_are_removed(logdir):
    records = write_log(logdir)
    first = segment_files(logdir)[0]
    junk = [
        first.with_name(first.name.replace(".log", ".index.tmp")),
        logdir / f"{RECOVERY_POINT}.tmp",
        logdir / "whatever.tmp",
    ]
    for p in junk:
        p.write_bytes(b"\x00garbage")
    plog = reopen_and_check(logdir, records)
    plog.close()
    assert not any(p.exists() for p in junk)
    assert not list(logdir.glob("*.tmp"))


# --------------------------------------------------------------------------- (f) checkpoint


def test_write_atomic_replaces_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "state"
    write_atomic(path, b"one")
    write_atomic(path, b"two, longer")
    assert path.read_bytes() == b"two, longer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_write_atomic_replaces_a_stale_tmp(tmp_path):
    path = tmp_path / "state"
    (tmp_path / "state.tmp").write_bytes(b"x" * 1000)
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert not (tmp_path / "state.tmp").exists()


def test_json_round_trip_and_default(tmp_path):
    path = tmp_path / "offsets.json"
    assert read_json(path) is None
    assert read_json(path, {"a": 1}) == {"a": 1}
    obj = {"group": {"t-0": 42, "t-1": 7}, "list": [1, None, "x"]}
    write_json(path, obj)
    assert read_json(path) == obj
    assert json.loads(path.read_bytes()) == obj


@pytest.mark.parametrize("content", [b"{", b"", b"\xff\xfe", b'{"a": 1}garbage'])
def test_corrupt_json_is_quarantined(tmp_path, content):
    path = tmp_path / "offsets.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_json(path, {})
    bad = tmp_path / "offsets.json.bad"
    assert str(path) in str(info.value) and str(bad) in str(info.value)
    assert not path.exists()
    assert bad.read_bytes() == content
    assert read_json(path, {}) == {}  # next read: as if never written


def test_corrupt_json_replaces_an_older_bad_file(tmp_path):
    path = tmp_path / "s.json"
    (tmp_path / "s.json.bad").write_bytes(b"old")
    path.write_bytes(b"[")
    with pytest.raises(ValueError):
        read_json(path)
    assert (tmp_path / "s.json.bad").read_bytes() == b"["


def test_copy_of_a_closed_log_opens_identically(logdir, tmp_path):
    """Sanity for the helpers above: an undamaged copy reopens with nothing cut."""
    records = write_log(logdir)
    copy = tmp_path / "copy"
    shutil.copytree(logdir, copy)
    plog = PartitionLog.open(copy, CONFIG)
    try:
        assert plog.cuts == [] and read_all(plog) == records
    finally:
        plog.close()
