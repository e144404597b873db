"""PartitionLog against a plain model: segments as lists of batches, records as (offset, value).

The model rolls, truncates and expires by the rules the docstrings state, written out
independently; every step compares the log's segments, watermarks and reads with it.
Segments are tiny (``SEGMENT_BYTES``) and the index sparse (``INDEX_INTERVAL``) so rolls,
unindexed batches and index lookups all happen within a few steps.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from storage_helpers import append_batches, decode, make_batch, now_ms, read_all

from sluice.storage.log import LogConfig, OutOfRange, PartitionLog

SEGMENT_BYTES = 500
INDEX_INTERVAL = 150
CONFIG = LogConfig(
    segment_bytes=SEGMENT_BYTES, retention_ms=-1, index_interval_bytes=INDEX_INTERVAL
)

VALUES = st.lists(st.binary(max_size=24), min_size=1, max_size=4)
# (values, timestamp step): the machine's clock only moves forward (see test_reopen_keeps_...)
BATCHES = st.lists(st.tuples(VALUES, st.integers(0, 15)), min_size=1, max_size=3)


@dataclasses.dataclass
class MBatch:
    base: int
    values: list[bytes]
    size: int
    max_ts: int

    @property
    def next(self) -> int:
        return self.base + len(self.values)


@dataclasses.dataclass
class MSegment:
    base: int
    batches: list[MBatch]

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)


class LogModel:
    """What the log should hold, by the rules in log.py's docstrings."""

    def __init__(self) -> None:
        self.segments = [MSegment(0, [])]
        self.next = 0

    @property
    def start(self) -> int:
        return self.segments[0].base

    def batches(self) -> list[MBatch]:
        return [b for s in self.segments for b in s.batches]

    def records(self, start: int = 0) -> list[tuple[int, bytes]]:
        return [
            (b.base + i, v)
            for b in self.batches()
            for i, v in enumerate(b.values)
            if b.base + i >= start
        ]

    def append(self, batches: list[tuple[list[bytes], int]]) -> list[int]:
        sizes = [len(make_batch(v, t)) for v, t in batches]
        active = self.segments[-1]
        if active.size and active.size + sum(sizes) > SEGMENT_BYTES:
            active = MSegment(self.next, [])
            self.segments.append(active)
        bases = []
        for (values, ts), size in zip(batches, sizes, strict=True):
            bases.append(self.next)
            active.batches.append(MBatch(self.next, values, size, ts))
            self.next += len(values)
        return bases

    def read(self, offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Whole batches from the one holding ``offset`` within ``max_bytes``, at least one,
        never past the end of that batch's segment."""
        seg = next(s for s in reversed(self.segments) if s.base <= offset)
        first = next(i for i, b in enumerate(seg.batches) if b.next > offset)
        taken, used = [], 0
        for b in seg.batches[first:]:
            if taken and used + b.size > max_bytes:
                break
            taken.append(b)
            used += b.size
        return [
            (b.base + i, v) for b in taken for i, v in enumerate(b.values) if b.base + i >= offset
        ]

    def offset_for_time(self, ts: int) -> int | None:
        return next((b.base for b in self.batches() if b.max_ts >= ts), None)

    def truncate_to(self, offset: int) -> None:
        while len(self.segments) > 1 and self.segments[-1].base >= offset:
            self.segments.pop()
        seg = self.segments[-1]
        seg.batches = [b for b in seg.batches if b.base < offset]
        self.next = seg.batches[-1].next if seg.batches else seg.base

    def expire_by_size(self, retention_bytes: int) -> list[int]:
        dropped = []
        while len(self.segments) > 1:
            total = sum(s.size for s in self.segments)
            if total - self.segments[0].size < retention_bytes:
                break
            dropped.append(self.segments.pop(0).base)
        return dropped


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-log-model-"))
        self.model = LogModel()
        self.plog = PartitionLog.open(self.dir, CONFIG)
        self.clock = 0

    def teardown(self) -> None:
        self.plog.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(batches=BATCHES)
    def first_append(self, batches):
        self.append(batches)

    @rule(batches=BATCHES)
    def append(self, batches):
        stamped = []
        for values, step in batches:
            self.clock += step
            stamped.append((values, self.clock))
        got = append_batches(self.plog, [v for v, _ in stamped], [t for _, t in stamped])
        assert got == self.model.append(stamped)

    @precondition(lambda self: self.model.next > self.model.start)
    @rule(data=st.data(), max_bytes=st.integers(12, 1200))
    def read(self, data, max_bytes):
        offset = data.draw(st.integers(self.model.start, self.model.next - 1), "offset")
        res = self.plog.read(offset, max_bytes, self.plog.high_watermark)
        assert (res.high_watermark, res.log_start_offset) == (self.model.next, self.model.start)
        got = decode(res.data, offset)
        assert got, "a read below the high watermark must return at least one record"
        assert got == self.model.read(offset, max_bytes)

    @rule(past=st.integers(1, 5))
    def read_out_of_range(self, past):
        assert self.plog.read(self.model.next, 100, self.plog.high_watermark).data == b""
        with pytest.raises(OutOfRange):
            self.plog.read(self.model.next + past, 100, self.plog.high_watermark)
        if self.model.start > 0:
            with pytest.raises(OutOfRange):
                self.plog.read(max(self.model.start - past, 0), 100, self.plog.high_watermark)

    @rule(data=st.data())
    def offset_for_time(self, data):
        ts = data.draw(st.integers(-1, self.clock + 1), "ts")
        assert self.plog.offset_for_time(ts, self.plog.high_watermark) == self.model.offset_for_time(ts)

    @rule(data=st.data())
    def truncate(self, data):
        # batch boundaries (the contract), including the log start and the high watermark
        points = sorted(
            {self.model.start, self.model.next} | {b.base for b in self.model.batches()}
        )
        offset = data.draw(st.sampled_from(points), "offset")
        self.plog.truncate_to(offset)
        self.model.truncate_to(offset)

    @rule(data=st.data())
    def retention_by_size(self, data):
        sizes = [s.size for s in self.model.segments]
        suffix_sums = [sum(sizes[i:]) for i in range(len(sizes))]  # the boundary cases
        retention_bytes = data.draw(
            st.one_of(st.integers(0, 1500), st.sampled_from(suffix_sums)), "retention_bytes"
        )
        self.plog.config = dataclasses.replace(CONFIG, retention_bytes=retention_bytes)
        active = self.plog.active
        expired = self.plog.expired_segments(now_ms())
        self.plog.config = CONFIG
        assert active not in expired
        assert [s.base_offset for s in expired] == self.model.expire_by_size(retention_bytes)
        for seg in expired:
            seg.delete()
            seg.close()

    @rule()
    def reopen(self):
        self.plog.close()
        self.plog = PartitionLog.open(self.dir, CONFIG)
        assert self.plog.cuts == []
        assert read_all(self.plog) == self.model.records()

    @rule()
    def read_everything(self):
        assert read_all(self.plog) == self.model.records()

    @invariant()
    def matches_model(self):
        plog, model = self.plog, self.model
        assert plog.high_watermark == plog.next_offset == model.next
        assert plog.log_start_offset == model.start
        assert [(s.base_offset, s.size) for s in plog.segments] == [
            (s.base, s.size) for s in model.segments
        ]
        assert [s.next_offset for s in plog.segments] == [
            s.batches[-1].next if s.batches else s.base for s in model.segments
        ]
        on_disk = sorted(p.name for p in self.dir.glob("*.log"))
        assert on_disk == [f"{s.base:020d}.log" for s in model.segments]


LogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_partition_log_matches_model = LogMachine.TestCase


# --------------------------------------------------------------------------- fixed cases


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog.open(tmp_path / "p", CONFIG)
    yield log
    log.close()


def test_empty_log(plog):
    assert (plog.log_start_offset, plog.high_watermark) == (0, 0)
    assert plog.read(0, 100, plog.high_watermark).data == b""
    assert plog.offset_for_time(0, plog.high_watermark) is None
    with pytest.raises(OutOfRange):
        plog.read(1, 100, plog.high_watermark)


def test_rolls_keep_offsets_dense_across_segments(plog):
    values = [[bytes([i]) * 40] for i in range(30)]
    for v in values:
        append_batches(plog, [v])
    assert len(plog.segments) > 3
    bases = [s.base_offset for s in plog.segments]
    assert bases == sorted(bases) and bases[0] == 0
    for prev, seg in zip(plog.segments, plog.segments[1:], strict=False):
        assert seg.base_offset == prev.next_offset
    assert read_all(plog) == [(i, v[0]) for i, v in enumerate(values)]


def test_roll_only_when_the_batch_does_not_fit(plog):
    size = len(make_batch([b"x" * 100]))
    per_segment = SEGMENT_BYTES // size
    config = dataclasses.replace(CONFIG, segment_bytes=size * per_segment)
    plog.config = config
    for _ in range(per_segment):  # fills the segment exactly: no roll
        append_batches(plog, [[b"x" * 100]])
    assert len(plog.segments) == 1 and plog.active.size == config.segment_bytes
    append_batches(plog, [[b"x" * 100]])
    assert [s.base_offset for s in plog.segments] == [0, per_segment]


def test_a_batch_larger_than_a_segment_goes_alone_into_a_fresh_segment(plog):
    append_batches(plog, [[b"small"]])
    append_batches(plog, [[b"y" * (2 * SEGMENT_BYTES)]])
    append_batches(plog, [[b"small"]])
    assert [s.base_offset for s in plog.segments] == [0, 1, 2]
    assert read_all(plog) == [(0, b"small"), (1, b"y" * (2 * SEGMENT_BYTES)), (2, b"small")]


def test_retention_by_size_never_drops_the_active_segment(plog):
    for i in range(20):
        append_batches(plog, [[bytes([i]) * 40]])
    active = plog.active
    plog.config = dataclasses.replace(CONFIG, retention_bytes=0)
    expired = plog.expired_segments(now_ms())
    assert plog.segments == [active]
    assert plog.log_start_offset == active.base_offset > 0
    assert len(expired) > 2
    for seg in expired:
        seg.delete()
    assert read_all(plog) == [(i, bytes([i]) * 40) for i in range(active.base_offset, 20)]
    with pytest.raises(OutOfRange):
        plog.read(active.base_offset - 1, 100, plog.high_watermark)


def test_retention_by_age(plog):
    for ts in (100, 200, 300, 400, 500, 600):
        append_batches(plog, [[b"x" * 200]], [ts])  # one batch per segment
    maxima = [s.max_timestamp for s in plog.segments]
    assert len(maxima) >= 3
    plog.config = dataclasses.replace(CONFIG, retention_ms=1000)
    # a segment goes when its newest timestamp is more than retention.ms old
    expired = plog.expired_segments(maxima[1] + 1000)
    assert [s.max_timestamp for s in expired] == maxima[:1]
    expired = plog.expired_segments(10**9)
    assert len(plog.segments) == 1 and plog.active.max_timestamp == maxima[-1]


def test_a_follower_lets_go_of_segments_below_its_leaders_log_start(plog):
    for i in range(8):
        append_batches(plog, [[bytes([i]) * 200]])  # about one batch per segment
    bases = [s.base_offset for s in plog.segments]
    assert len(bases) >= 4
    assert plog.expired_segments(now_ms(), floor=bases[1] - 1) == []  # no whole segment below
    expired = plog.expired_segments(now_ms(), floor=bases[2])
    assert [s.base_offset for s in expired] == bases[:2]
    assert plog.log_start_offset == bases[2]
    assert plog.expired_segments(now_ms(), floor=10**9)[-1].base_offset < plog.active.base_offset  # never the active


@pytest.mark.parametrize("max_bytes", [0, 1, 11])
def test_read_with_tiny_max_bytes_still_returns_one_batch(plog, max_bytes):
    append_batches(plog, [[b"first", b"second"]])
    assert decode(plog.read(0, max_bytes, plog.high_watermark).data) == [(0, b"first"), (1, b"second")]


@given(st.lists(st.tuples(VALUES, st.integers(0, 60)), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_offset_for_time_with_out_of_order_timestamps(batches):
    """CreateTime timestamps need not grow; the answer is still the first batch reaching ts."""
    with tempfile.TemporaryDirectory() as d:
        plog = PartitionLog.open(Path(d), CONFIG)
        model = LogModel()
        for values, ts in batches:
            assert append_batches(plog, [values], [ts]) == model.append([(values, ts)])
        try:
            for ts in range(-1, 62):
                assert plog.offset_for_time(ts, plog.high_watermark) == model.offset_for_time(ts), ts
        finally:
            plog.close()


def test_reopen_keeps_max_timestamp_of_unindexed_batches(tmp_path):
    plog = PartitionLog.open(tmp_path, CONFIG)
    append_batches(plog, [[b"a"]], [5])  # position 0: indexed
    append_batches(plog, [[b"b" * 100]], [100])  # 81 bytes after an entry: not indexed
    append_batches(plog, [[b"c" * 10]], [50])  # indexed (interval passed); max so far stays 100
    append_batches(plog, [[b"d" * 300]], [10])  # rolls: segment 0 is no longer the last
    first = plog.segments[0]
    assert list(first.index.offsets) == [0, 2] and first.max_timestamp == 100
    assert plog.offset_for_time(80, plog.high_watermark) == 1
    plog.close()
    plog = PartitionLog.open(tmp_path, CONFIG)
    try:
        assert plog.segments[0].max_timestamp == 100
        assert plog.offset_for_time(80, plog.high_watermark) == 1
    finally:
        plog.close()
