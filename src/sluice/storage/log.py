"""PartitionLog: the segments of one partition, by base offset; roll, read, retention.

Directory layout of a partition::

    <data>/<topic>-<partition>/
        00000000000000000000.log         record batches, whole
        00000000000000000000.index       sparse offset index (derived)
        00000000000000000000.timeindex   sparse time index (derived)
        recovery-point                   offset below which every segment was fsynced

The log does no asyncio itself.  Its owner (broker.partition.PartitionWriter) decides which
thread runs what, following the contracts in segment.py: appends happen through
``prepare_append`` (event loop) -> ``Segment.write``/``flush`` (worker thread) ->
``appended`` (event loop).  ``high_watermark`` is the end of what readers may see; it only
moves in ``appended``.

Readers in worker threads never look at the mutable segment list: every change (append,
roll, retention, truncation) publishes an immutable ``LogView`` — segments, their bases,
the high watermark and the byte end of the active segment that matches it — and a read
takes one view and works from it alone.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sluice.protocol.records import LOG_OVERHEAD
from sluice.storage.checkpoint import fsync_dir, write_atomic
from sluice.storage.segment import Cut, Segment

log = logging.getLogger("sluice.storage")

RECOVERY_POINT = "recovery-point"
MAX_RELATIVE_OFFSET = 2**31 - 1


@dataclass(frozen=True)
class LogConfig:
    """Storage settings of one partition (a subset of the topic config)."""

    segment_bytes: int = 256 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    index_interval_bytes: int = 4096


@dataclass(frozen=True)
class ReadResult:
    """Bytes of whole batches (the first may start below the asked offset)."""

    data: bytes
    high_watermark: int
    log_start_offset: int


class LogView(NamedTuple):
    """What readers see: consistent as a whole, replaced (never changed) by the loop."""

    bases: tuple[int, ...]
    segments: tuple[Segment, ...]
    high_watermark: int
    active_end: int  # byte end of the last segment that belongs to high_watermark


class OutOfRange(Exception):
    """The asked offset is below the log start or above the high watermark."""


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        self.segments: list[Segment] = []
        self.high_watermark = self.next_offset = 0
        self.view = LogView((), (), 0, 0)
        self.cuts: list[Cut] = []

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, directory: Path, config: LogConfig) -> PartitionLog:
        """Open (or create) the log in ``directory``, recovering what a crash left behind.

        Segments at or above the recovery point (normally just the last) are verified batch
        by batch; a torn or corrupt tail is cut, kept aside as ``*.bad`` and reported in
        ``cuts`` and the log.  Segments after a cut are removed as they cannot follow it.
        """
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        self = cls(directory, config)
        for tmp in directory.glob("*.tmp"):
            tmp.unlink()
        bases = sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())
        recovery_point = self._read_recovery_point()
        for i, base in enumerate(bases):
            verify = i == len(bases) - 1 or base >= recovery_point
            seg, cut = Segment.open(
                directory, base, verify=verify, index_interval=config.index_interval_bytes
            )
            if self.segments and seg.base_offset != self.segments[-1].next_offset:
                log.warning("segment %s does not follow its predecessor; kept aside", seg.path)
                seg.close()
                os.replace(seg.path, seg.path.with_name(seg.path.name + ".bad"))
                seg.delete()
                continue
            self._add(seg)
            if cut:
                self.cuts.append(cut)
                for later in bases[i + 1 :]:
                    orphan = Segment(directory, later)
                    log.warning("removing %s: it follows a cut segment", orphan.path)
                    bad = orphan.path.with_name(orphan.path.name + ".bad")
                    os.replace(orphan.path, bad)
                    orphan.delete()
                break
        if not self.segments:
            self._add(Segment.create(directory, 0, config.index_interval_bytes))
            fsync_dir(directory)
        if created:
            fsync_dir(directory.parent)  # the new partition directory itself survives a crash
        self.high_watermark = self.active.next_offset
        self.next_offset = self.high_watermark
        self._publish()
        return self

    def _read_recovery_point(self) -> int:
        try:
            return int((self.directory / RECOVERY_POINT).read_text().strip())
        except (FileNotFoundError, ValueError):
            return 0

    def write_recovery_point(self, offset: int) -> None:
        """Record that every segment below ``offset`` is fsynced. Worker thread."""
        write_atomic(self.directory / RECOVERY_POINT, f"{offset}\n".encode())

    def _add(self, seg: Segment) -> None:
        self.segments.append(seg)
        self._publish()

    def _publish(self) -> None:
        """Replace the readers' view after the segment list changed (event loop)."""
        segs = tuple(self.segments)
        end = segs[-1].size if segs else 0
        self.view = LogView(tuple(s.base_offset for s in segs), segs, self.high_watermark, end)

    # ------------------------------------------------------------------ state

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def reconfigure(self, config: LogConfig) -> None:
        """Use ``config`` from now on (event loop): the next append decides rolls by its
        segment limits, the next retention pass by its retention, and the index interval
        applies to the active segment's next batches."""
        self.config = config
        self.active.index_interval = config.index_interval_bytes

    # ------------------------------------------------------------------ appending

    def prepare_append(self, total: int, count: int, now_ms: int) -> Segment | None:
        """Roll if ``total`` more bytes (``count`` offsets) do not fit the active segment, or
        it is too old.  Offsets relative to a segment's base must stay below 2**31: the
        indexes store them in 32 bits.

        Event loop.  Returns the segment that was rolled away (the caller fsyncs it, saves
        its indexes and writes the recovery point in a worker thread), or None.
        """
        active = self.active
        if not active.size:
            return None
        too_big = active.size + total > self.config.segment_bytes
        too_old = now_ms - active.created_ms >= self.config.segment_ms
        too_many = self.next_offset + count - active.base_offset >= MAX_RELATIVE_OFFSET
        if not (too_big or too_old or too_many):
            return None
        self._add(Segment.create(self.directory, self.next_offset, self.config.index_interval_bytes))
        return active

    def appended(self, segment: Segment, batches: list, next_offset: int) -> None:
        """Publish batches written to ``segment``: (base, next, max_ts, size) each. Event loop."""
        segment.appended(batches)
        self.high_watermark = next_offset
        view = self.view
        self.view = LogView(view.bases, view.segments, next_offset, view.segments[-1].size)

    # ------------------------------------------------------------------ reading

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Whole batches from the one holding ``offset``, about ``max_bytes`` (any thread).

        At least one whole batch is returned when there is one, even if larger than
        ``max_bytes``, so a consumer always makes progress.  Empty at the high watermark.
        Raises ``OutOfRange`` below the log start or above the high watermark.
        """
        bases, segments, hw, active_end = self.view
        start = bases[0]
        if offset < start or offset > hw:
            raise OutOfRange(f"offset {offset} is outside [{start}, {hw}]")
        if offset == hw:
            return ReadResult(b"", hw, start)
        last = len(segments) - 1
        for i in range(max(bisect_right(bases, offset) - 1, 0), last + 1):
            seg = segments[i]
            limit = active_end if i == last else seg.size
            pos = seg.locate(offset, limit)
            if pos is not None:
                end = min(limit, pos + max(max_bytes, LOG_OVERHEAD))
                data = seg.read(pos, end - pos)
                if end < limit:
                    # extend to the end of the first batch if the cap cut it
                    first = int.from_bytes(data[8:12], "big") + LOG_OVERHEAD
                    if first > len(data):
                        data = seg.read(pos, first)
                return ReadResult(data, hw, start)
        return ReadResult(b"", hw, start)

    def offset_for_time(self, timestamp: int) -> int | None:
        """Offset of the first batch with a timestamp ≥ ``timestamp``; None if none (any thread)."""
        view = self.view
        for i, seg in enumerate(view.segments):
            if seg.max_timestamp >= timestamp:
                limit = view.active_end if i == len(view.segments) - 1 else seg.size
                found = seg.find_time(timestamp, limit)
                if found is not None:
                    return found
        return None

    # ------------------------------------------------------------------ retention and truncation

    def expired_segments(self, now_ms: int) -> list[Segment]:
        """Remove from the log (not from disk) the segments retention lets go. Event loop.

        Never the active segment.  By age: the segment's newest timestamp (or its file time
        when it has none) is older than ``retention_ms``.  By size: oldest first while the
        log without them stays at or above ``retention_bytes``.  The caller deletes the files
        (``Segment.delete``) off the event loop.
        """
        cfg = self.config
        expired: list[Segment] = []
        total = self.size_bytes
        while len(self.segments) > 1:
            oldest = self.segments[0]
            newest_ts = oldest.max_timestamp if oldest.max_timestamp >= 0 else oldest.created_ms
            by_age = cfg.retention_ms >= 0 and now_ms - newest_ts > cfg.retention_ms
            by_size = cfg.retention_bytes >= 0 and total - oldest.size >= cfg.retention_bytes
            if not (by_age or by_size):
                break
            expired.append(self.segments.pop(0))
            total -= oldest.size
        if expired:
            self._publish()
        return expired

    def truncate_to(self, offset: int) -> None:
        """Drop everything at or above ``offset``. Only while nothing else uses the log."""
        while len(self.segments) > 1 and self.active.base_offset >= offset:
            seg = self.segments.pop()
            seg.close()
            seg.delete()
        self.active.truncate_to(offset)
        self.next_offset = self.high_watermark = self.active.next_offset
        self._publish()

    def flush(self) -> None:
        """fsync the active segment. Worker thread."""
        self.active.flush()

    def close(self) -> None:
        """Save the indexes, record the recovery point and close every file."""
        try:
            self.active.flush()
            for seg in self.segments:
                seg.save_indexes()
            self.write_recovery_point(self.active.base_offset)
        finally:
            for seg in self.segments:
                seg.close()
