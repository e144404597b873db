"""Offset and time indexes against brute-force models; file round trips and rejections."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.storage.index import OffsetIndex, TimeIndex

BASE = st.integers(0, 2**40)
# (offset step, position step) pairs; a zero step makes append ignore the entry
STEPS = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5000)), max_size=40)
TS_STEPS = st.lists(st.tuples(st.integers(-3, 1000), st.integers(0, 50)), max_size=40)


def build_offset_index(base: int, steps) -> tuple[OffsetIndex, list[tuple[int, int]]]:
    """The index after appending the stepped entries, and the entries a model keeps."""
    idx, model = OffsetIndex(base), []
    off, pos = base, 0
    for i, (do, dp) in enumerate(steps):
        if i:
            off, pos = off + do, pos + dp
        idx.append(off, pos)
        if not model or (off > model[-1][0] and pos > model[-1][1]):
            model.append((off, pos))
    return idx, model


def build_time_index(base: int, t0: int, steps) -> tuple[TimeIndex, list[tuple[int, int]]]:
    idx, model = TimeIndex(base), []
    ts, off = t0, base
    for i, (dt, do) in enumerate(steps):
        if i:
            ts, off = ts + dt, off + do
        idx.append(ts, off)
        if not model or (ts > model[-1][0] and off > model[-1][1]):
            model.append((ts, off))
    return idx, model


# --------------------------------------------------------------------------- OffsetIndex


def test_offset_index_byte_table():
    idx = OffsetIndex(100)
    idx.append(100, 0)
    idx.append(105, 300)
    assert idx.to_bytes() == bytes.fromhex("00000000 0000000000000005 0000012c")


@given(BASE, STEPS, st.lists(st.integers(-5, 3000), max_size=30))
def test_offset_lookup_matches_model(base, steps, targets):
    idx, model = build_offset_index(base, steps)
    assert list(zip(idx.offsets, idx.positions, strict=True)) == model
    last = model[-1][0] if model else base
    for t in targets + [base, last, last + 1]:
        target = base + t
        below = [e for e in model if e[0] <= target]
        assert idx.lookup(target) == (below[-1] if below else (base, 0))


@given(BASE, STEPS, st.integers(-5, 3000))
def test_offset_truncate_to_matches_model(base, steps, t):
    idx, model = build_offset_index(base, steps)
    idx.truncate_to(base + t)
    kept = [e for e in model if e[0] < base + t]
    assert list(zip(idx.offsets, idx.positions, strict=True)) == kept
    # appending after a truncation works from the new end
    nxt = (kept[-1][0] + 1, kept[-1][1] + 1) if kept else (base, 0)
    idx.append(*nxt)
    assert idx.lookup(nxt[0]) == nxt


@given(BASE, STEPS)
def test_offset_index_round_trip(base, steps):
    idx, model = build_offset_index(base, steps)
    data = idx.to_bytes()
    assert len(data) == 8 * len(model)
    size = model[-1][1] + 1 if model else 0
    back = OffsetIndex.from_bytes(data, base, size)
    assert list(zip(back.offsets, back.positions, strict=True)) == model
    assert back.base_offset == base


def _offset_file(*entries: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">II", r, p) for r, p in entries)


@pytest.mark.parametrize(
    ("data", "size", "what"),
    [
        (_offset_file((0, 0), (5, 100))[:-1], 1000, "partial entry"),
        (_offset_file((0, 0), (5, 100)) + b"\x00", 1000, "partial entry"),
        (_offset_file((0, 0), (5, 100), (3, 200)), 1000, "offset goes back"),
        (_offset_file((0, 0), (5, 100), (5, 200)), 1000, "offset repeats"),
        (_offset_file((0, 0), (5, 100), (7, 50)), 1000, "position goes back"),
        (_offset_file((0, 0), (5, 100), (7, 100)), 1000, "position repeats"),
        (_offset_file((0, 0), (5, 1000)), 1000, "position at the end of the segment"),
        (_offset_file((0, 0), (5, 4000)), 1000, "position past the segment"),
        (_offset_file((0, 0)), 0, "entry in an empty segment"),
    ],
)
def test_offset_index_from_bytes_rejects(data, size, what):
    with pytest.raises(ValueError):
        OffsetIndex.from_bytes(data, 7, size)


def test_offset_index_from_bytes_accepts_empty_and_last_byte():
    assert len(OffsetIndex.from_bytes(b"", 7, 0)) == 0
    idx = OffsetIndex.from_bytes(_offset_file((0, 0), (5, 999)), 7, 1000)
    assert idx.lookup(100) == (12, 999)


# --------------------------------------------------------------------------- TimeIndex


def test_time_index_byte_table():
    idx = TimeIndex(100)
    idx.append(-1, 100)
    idx.append(0x0102030405, 103)
    assert idx.to_bytes() == bytes.fromhex("ffffffffffffffff 000000000000000102030405 00000003")


@given(
    BASE, st.integers(-(2**40), 2**40), TS_STEPS, st.lists(st.integers(-10, 30_000), max_size=30)
)
def test_time_scan_start_matches_model(base, t0, steps, targets):
    idx, model = build_time_index(base, t0, steps)
    assert list(zip(idx.timestamps, idx.offsets, strict=True)) == model
    last = model[-1][0] if model else t0
    for t in targets + [0, last - t0, last - t0 + 1]:
        target = t0 + t
        below = [o for ts, o in model if ts < target]
        assert idx.scan_start(target) == (below[-1] if below else base)


@given(BASE, TS_STEPS, st.integers(-5, 3000))
def test_time_truncate_to_matches_model(base, steps, t):
    idx, model = build_time_index(base, 0, steps)
    idx.truncate_to(base + t)
    kept = [e for e in model if e[1] < base + t]
    assert list(zip(idx.timestamps, idx.offsets, strict=True)) == kept


@given(BASE, st.integers(-(2**40), 2**40), TS_STEPS)
def test_time_index_round_trip(base, t0, steps):
    idx, model = build_time_index(base, t0, steps)
    data = idx.to_bytes()
    assert len(data) == 12 * len(model)
    next_offset = model[-1][1] + 1 if model else base
    back = TimeIndex.from_bytes(data, base, next_offset)
    assert list(zip(back.timestamps, back.offsets, strict=True)) == model


def _time_file(*entries: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">qI", t, r) for t, r in entries)


@pytest.mark.parametrize(
    ("data", "next_offset", "what"),
    [
        (_time_file((10, 0), (20, 5))[:-1], 100, "partial entry"),
        (_time_file((10, 0), (20, 5)) + b"\x00" * 8, 100, "partial entry"),
        (_time_file((10, 0), (5, 6)), 100, "timestamp goes back"),
        (_time_file((10, 0), (10, 6)), 100, "timestamp repeats"),
        (_time_file((10, 3), (20, 2)), 100, "offset goes back"),
        (_time_file((10, 3), (20, 3)), 100, "offset repeats"),
        (_time_file((10, 0), (20, 93)), 100, "offset at the segment's next offset"),
        (_time_file((10, 0), (20, 500)), 100, "offset past the segment"),
        (_time_file((10, 0)), 7, "entry in an empty segment"),
    ],
)
def test_time_index_from_bytes_rejects(data, next_offset, what):
    with pytest.raises(ValueError):
        TimeIndex.from_bytes(data, 7, next_offset)
