"""Log end, high watermark and leader-epoch cache against a plain list of batches.

Random appends (in non-decreasing epochs), high-watermark moves, truncations at batch
boundaries, retention and reopening with a checkpointed high watermark; after every step
the log's two ends, its epoch cache and its OffsetsForLeaderEpoch answers match what the
list says, computed independently.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from storage_helpers import append_batches, decode

from sluice.storage.epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from sluice.storage.log import LogConfig, NotYetAvailable, PartitionLog

CONFIG = LogConfig(segment_bytes=400, retention_ms=-1, index_interval_bytes=120)


@dataclasses.dataclass
class B:
    base: int
    count: int
    epoch: int

    @property
    def next(self) -> int:
        return self.base + self.count


class ReplicaLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-replica-model-"))
        self.plog = PartitionLog.open(self.dir, CONFIG)
        self.batches: list[B] = []
        self.start = 0  # log start (moved by retention)
        self.end = 0  # log end
        self.hw = 0
        self.epoch = 0

    def teardown(self) -> None:
        self.plog.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ model answers

    def runs(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for b in self.batches:
            if not out or b.epoch > out[-1][0]:
                out.append((b.epoch, b.base))
        return out

    def end_for(self, epoch: int) -> tuple[int, int]:
        runs = self.runs()
        if not runs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == runs[-1][0]:
            return epoch, self.end
        later = [start for e, start in runs if e > epoch]
        if not later or epoch < 0:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        below = [e for e, _ in runs if e <= epoch]
        return (below[-1] if below else epoch), later[0]

    # ------------------------------------------------------------------ rules

    @rule(
        counts=st.lists(st.integers(1, 4), min_size=1, max_size=3),
        bump=st.integers(0, 2),
        advance=st.booleans(),
    )
    def append(self, counts, bump, advance):
        self.epoch += bump
        values = [[b"v%d" % i * 5 for i in range(n)] for n in counts]
        bases = append_batches(self.plog, values, epoch=self.epoch, advance=advance)
        for base, n in zip(bases, counts, strict=True):
            assert base == self.end
            self.batches.append(B(base, n, self.epoch))
            self.end += n
        if advance:  # the single-replica ISR step
            self.hw = self.end

    @rule(data=st.data())
    def advance_high_watermark(self, data):
        target = data.draw(st.sampled_from([self.hw, self.end] + [b.base for b in self.batches]))
        moved = self.plog.advance_high_watermark(target)
        assert moved == (target > self.hw)
        self.hw = max(self.hw, target)

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate(self, data):
        cut = data.draw(st.sampled_from([b.base for b in self.batches] + [self.end]))
        self.plog.truncate_to(cut)
        self.batches = [b for b in self.batches if b.base < cut]
        self.end = min(self.end, cut)
        self.hw = min(self.hw, self.end)

    @rule(keep=st.integers(0, 1200))
    def retention(self, keep):
        self.plog.config = dataclasses.replace(CONFIG, retention_bytes=keep)
        expired = self.plog.expired_segments(0)
        self.plog.config = CONFIG
        for seg in expired:
            seg.delete()
            seg.close()
        self.start = self.plog.log_start_offset
        self.batches = [b for b in self.batches if b.base >= self.start]

    @rule(data=st.data())
    def reopen(self, data):
        """A restart: the checkpoint may be older (lower) than the last high watermark, or
        missing; the log end is what survived."""
        checkpoint = data.draw(st.one_of(st.none(), st.integers(0, self.hw + 3)), "checkpoint")
        self.plog.close()
        self.plog = PartitionLog.open(self.dir, CONFIG, checkpoint)
        if checkpoint is None or checkpoint >= self.end:
            self.hw = self.end
        else:  # a checkpoint inside a batch (never written, but read) counts from its start
            self.hw = max([b.base for b in self.batches if b.base <= checkpoint], default=self.start)

    @precondition(lambda self: self.end > self.start)
    @rule(data=st.data())
    def read_bounded(self, data):
        offset = data.draw(st.integers(self.start, self.end - 1), "offset")
        if offset >= self.hw:
            if offset > self.hw:
                with pytest.raises(NotYetAvailable):
                    self.plog.read(offset, 1 << 20, self.hw)
            else:
                assert self.plog.read(offset, 1 << 20, self.hw).data == b""
        else:
            got = decode(self.plog.read(offset, 1 << 20, self.hw).data, offset)
            assert got and got[0][0] == offset and got[-1][0] < self.hw
        replica = decode(self.plog.read(offset, 1 << 20, self.plog.log_end_offset).data, offset)
        assert replica and replica[0][0] == offset

    # ------------------------------------------------------------------ invariants

    @invariant()
    def ends_and_epochs_match(self):
        plog = self.plog
        assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark) == (
            self.start, self.end, self.hw,
        )
        assert plog.high_watermark_position.offset == self.hw
        assert self.start <= self.hw, "retention never passes the high watermark"
        assert plog.view.high_watermark == plog.high_watermark_position
        assert plog.view.log_end == plog.log_end
        assert plog.epochs.entries() == self.runs()
        for epoch in range(-1, self.epoch + 2):
            assert plog.epochs.end_offset_for_epoch(epoch, plog.log_end_offset) == self.end_for(epoch), epoch


ReplicaLogMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_log_ends_and_epochs_match_model = ReplicaLogMachine.TestCase
