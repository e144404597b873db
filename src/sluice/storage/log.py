"""PartitionLog: the segments of one partition, by base offset; roll, read, retention.

Directory layout of a partition::

    <data>/<topic>-<partition>/
        00000000000000000000.log         record batches, whole
        00000000000000000000.index       sparse offset index (derived)
        00000000000000000000.timeindex   sparse time index (derived)
        recovery-point                   offset below which every segment was fsynced
        cleaner-offset-checkpoint        offset below which the log was compacted (a hint)
        00000000000000001234.producers   producer state below that offset (a snapshot:
                                         storage/producers.py)

With ``cleanup.policy=compact`` the log cleaner (storage/cleaner.py) rewrites closed segments
below the high watermark: offsets keep their values, so a cleaned log has gaps between
batches (and batches with no record).  Reads start at the first batch whose
``next_offset`` is above the asked offset, so an offset the cleaner removed reads as the
next batch that survived.

The log does no asyncio itself.  Its owner (broker.partition.Partition) decides which
thread runs what, following the contracts in segment.py: appends happen through
``roll_due`` (event loop) -> ``Segment.create`` of a rolled segment, ``Segment.write`` /
``flush`` (worker thread) -> ``roll`` and ``appended`` (event loop).

Two ends, each an offset with its byte position (``LogPosition``):

- the **log end** (LEO): the offset after the last batch written; moves in ``appended``;
- the **high watermark** (HW): the end of what is acknowledged to the in-sync replicas and
  may be shown to consumers; at or below the log end, it moves only when the partition's
  ISR logic calls ``advance_high_watermark`` (and back down only by truncation).  It is
  persisted by the broker in a checkpoint; on opening it is min(checkpoint, log end).

Every read names its upper bound: the high watermark for consumers, the log end for
replicas.  Readers in worker threads never look at the mutable segment list: every change
(append, roll, retention, truncation, HW move) publishes an immutable ``LogView`` — segments,
their bases, both ends with their positions, and the truncation ``generation`` — and a read
takes one view and works from it alone.  Segments a read touches are pinned, so their
files stay open even if the segment is removed meanwhile; bytes that a truncation changed
under a read are detected by the generation and the read is redone on the new view.

A segment is ``sealed`` once nothing will write it again (opened closed, or rolled and
its indexes saved by the writer); only sealed segments are cleaned.

The leader-epoch cache (``epochs``, storage/epochs.py) is rebuilt from batch headers by
``open`` and kept in step by ``appended``, ``truncate_to`` and retention.  So is the
idempotent producers' state (``producers``, storage/producers.py), from its newest snapshot
on: the partition's writer keeps it in step with what it appends.
"""

from __future__ import annotations

import errno
import logging
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sluice.protocol.records import HEADER_SIZE, LOG_OVERHEAD, parse_header
from sluice.storage.checkpoint import fsync_dir, write_atomic
from sluice.storage.cleaner import read_cleaner_checkpoint, recover_cleaning
from sluice.storage.epochs import LeaderEpochCache
from sluice.storage.producers import ProducerTable, delete_snapshots_from, rebuild, write_snapshot
from sluice.storage.segment import Cut, Segment, SegmentClosed

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
    log_end_offset: int = -1


class LogPosition(NamedTuple):
    """An offset and where it begins: byte ``position`` in the segment based at ``segment``."""

    offset: int
    segment: int
    position: int


class LogView(NamedTuple):
    """What readers see: consistent as a whole, replaced (never changed) by the loop."""

    bases: tuple[int, ...]
    segments: tuple[Segment, ...]
    high_watermark: LogPosition
    log_end: LogPosition
    generation: int  # truncations so far: a read whose view is older than the log's redoes


class OutOfRange(Exception):
    """The asked offset is below the log start or above the log end."""


class NotYetAvailable(Exception):
    """The asked offset is in the log but above the read's upper bound (the high watermark
    of a new leader that has not caught up yet): retry later."""


_ZERO = LogPosition(0, 0, 0)


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        self.segments: list[Segment] = []
        self.log_end = self.high_watermark_position = _ZERO
        self.generation = 0
        self.view = LogView((), (), _ZERO, _ZERO, 0)
        self.cuts: list[Cut] = []
        self.epochs = LeaderEpochCache()
        self.producers = ProducerTable()  # idempotent producers' state (storage/producers.py)
        self.cleaned_up_to = 0  # the log cleaner's first dirty offset (storage/cleaner.py)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls, directory: Path, config: LogConfig, high_watermark: int | None = None
    ) -> PartitionLog:
        """Open (or create) the log in ``directory``, recovering what a crash left behind.

        Segments at or above the recovery point (normally just the last) are verified batch
        by batch; a torn or corrupt tail is cut, kept aside as ``*.bad`` and reported in
        ``cuts`` and the log.  Segments after a cut are removed as they cannot follow it.
        The last segment is fsynced (what a crash left in the page cache becomes durable
        before anyone can see it).  The high watermark is min(``high_watermark``, log end):
        the checkpointed value, never above what survived; None (no checkpoint, as for a
        log written before high watermarks were kept) means the log end.  The leader-epoch
        cache is rebuilt from batch headers.  Worker thread (file I/O).
        """
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        self = cls(directory, config)
        for tmp in directory.glob("*.tmp"):
            tmp.unlink()
        recover_cleaning(directory)
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
        self.active.flush()
        for seg in self.segments[:-1]:
            seg.sealed = True
        self.cleaned_up_to = min(read_cleaner_checkpoint(directory), self.active.base_offset)
        for seg in self.segments:
            for epoch, start in seg.epoch_runs(self.epochs.latest_epoch):
                self.epochs.assign(epoch, start)
        self.log_end = self.high_watermark_position = self._end_position()
        self._publish()
        delete_snapshots_from(directory, self.log_end.offset)
        self.producers = rebuild(self)
        if high_watermark is not None and high_watermark < self.log_end.offset:
            self.high_watermark_position = self.position_of(max(high_watermark, self.log_start_offset))
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
        """Replace the readers' view after the segment list or an end changed (event loop)."""
        segs = tuple(self.segments)
        self.view = LogView(
            tuple(s.base_offset for s in segs), segs, self.high_watermark_position,
            self.log_end, self.generation,
        )

    def _end_position(self) -> LogPosition:
        active = self.active
        return LogPosition(active.next_offset, active.base_offset, active.size)

    # ------------------------------------------------------------------ state

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.log_end.offset

    @property
    def next_offset(self) -> int:
        """The offset the next appended batch gets: the log end."""
        return self.log_end.offset

    @property
    def high_watermark(self) -> int:
        return self.high_watermark_position.offset

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

    def roll_due(self, total: int, count: int, now_ms: int) -> bool:
        """Whether ``total`` more bytes (``count`` offsets) must go to a new segment: they do
        not fit the active one, or it is too old.  Offsets relative to a segment's base must
        stay below 2**31: the indexes store them in 32 bits.  Event loop; no I/O.

        The writer then creates the new segment (``Segment.create`` at the log end), fsyncs
        and seals the active one and writes the recovery point, all in a worker thread, and
        hands the new segment to ``roll`` on the event loop before ``appended``.
        """
        active = self.active
        if not active.size:
            return False
        too_big = active.size + total > self.config.segment_bytes
        too_old = now_ms - active.created_ms >= self.config.segment_ms
        too_many = self.next_offset + count - active.base_offset >= MAX_RELATIVE_OFFSET
        return too_big or too_old or too_many

    def roll(self, segment: Segment) -> None:
        """Make ``segment``, created at the log end, the active segment. Event loop."""
        if segment.base_offset != self.next_offset:
            raise ValueError(f"a segment rolled at {segment.base_offset} does not start at the log end {self.next_offset}")
        self._add(segment)

    def appended(
        self, segment: Segment, batches: list, next_offset: int, epochs=()
    ) -> None:
        """Publish batches written to ``segment``: (base, next, max_ts, size) each, ending
        at ``next_offset``; ``epochs`` lists the (epoch, first offset) runs they start.
        Moves the log end, not the high watermark. Event loop."""
        segment.appended(batches)
        for epoch, start in epochs:
            self.epochs.assign(epoch, start)
        self.log_end = LogPosition(next_offset, segment.base_offset, segment.size)
        view = self.view
        self.view = LogView(view.bases, view.segments, view.high_watermark, self.log_end, view.generation)

    def advance_high_watermark(self, offset: int) -> bool:
        """Move the high watermark up to ``offset`` (at most the log end). Event loop.

        ``offset`` is a replica's log end, so a batch boundary.  Lower values are no change
        (the HW never moves back but by truncation).  Returns True when it moved.  At the
        log end this is free; below it the position is found from the index (a short
        header scan, page-cache reads).
        """
        offset = min(offset, self.log_end.offset)
        if offset <= self.high_watermark_position.offset:
            return False
        pos = self.log_end if offset == self.log_end.offset else self.position_of(offset)
        self.high_watermark_position = pos
        view = self.view
        self.view = LogView(view.bases, view.segments, pos, view.log_end, view.generation)
        return True

    def position_of(self, offset: int) -> LogPosition:
        """Where the batch holding ``offset`` begins, with that batch's base offset (the
        log end at or past it). Owner's thread."""
        return self._bound_in(self.view, offset)

    # ------------------------------------------------------------------ reading

    def read(self, offset: int, max_bytes: int, upper_bound: int) -> ReadResult:
        """Whole batches from the one holding ``offset``, about ``max_bytes``, all below
        ``upper_bound`` (any thread).

        ``upper_bound`` is the high watermark for a consumer, the log end for a replica
        (above the log end it counts as the log end).  At least one whole batch is returned
        when there is one below the bound, even if larger than ``max_bytes``, so a reader
        always makes progress.  Empty at the bound.  Raises ``OutOfRange`` below the log
        start or above the log end, ``NotYetAvailable`` between the bound and the log end.
        """
        return self._on_view(self._read, offset, max_bytes, upper_bound)

    def offset_for_time(self, timestamp: int, upper_bound: int) -> int | None:
        """Offset of the first batch below ``upper_bound`` with a timestamp ≥ ``timestamp``;
        None if none (any thread)."""
        return self._on_view(self._offset_for_time, timestamp, upper_bound)

    def _on_view(self, fn, *args):
        """``fn(view, *args)`` on the current view, redone on a newer one when a truncation
        changed bytes under it (whatever it returned or raised meanwhile)."""
        while True:
            view = self.view
            try:
                result = fn(view, *args)
            except SegmentClosed:
                if self.view is view:  # not a newer view: the log itself was closed
                    raise OSError(errno.EBADF, f"log {self.directory} is closed") from None
                continue
            except Exception:
                if view.generation == self.generation:
                    raise
                continue  # bytes cut under the read made no sense: redo on the new view
            if view.generation == self.generation:
                return result

    def _read(self, view: LogView, offset: int, max_bytes: int, upper_bound: int) -> ReadResult:
        bases, segments, hw, leo, _ = view
        start = bases[0]
        if offset < start or offset > leo.offset:
            raise OutOfRange(f"offset {offset} is outside [{start}, {leo.offset}]")
        end = self._bound_in(view, upper_bound)
        if offset > end.offset:
            raise NotYetAvailable(f"offset {offset} is above {end.offset}, the bound of this read")
        if offset == end.offset:
            return ReadResult(b"", hw.offset, start, leo.offset)
        for i in range(max(bisect_right(bases, offset) - 1, 0), len(segments)):
            seg = segments[i]
            if seg.base_offset > end.segment:
                break
            with seg.pinned():
                limit = end.position if seg.base_offset == end.segment else seg.size
                pos = seg.locate(offset, limit)
                if pos is not None:
                    stop = min(limit, pos + max(max_bytes, LOG_OVERHEAD))
                    data = seg.read(pos, stop - pos)
                    if stop < limit:
                        # extend to the end of the first batch if the cap cut it
                        first = int.from_bytes(data[8:12], "big") + LOG_OVERHEAD
                        if first > len(data):
                            data = seg.read(pos, min(first, limit - pos))
                    return ReadResult(data, hw.offset, start, leo.offset)
        return ReadResult(b"", hw.offset, start, leo.offset)

    def _offset_for_time(self, view: LogView, timestamp: int, upper_bound: int) -> int | None:
        end = self._bound_in(view, upper_bound)
        for seg in view.segments:
            if seg.base_offset > end.segment:
                break
            if seg.max_timestamp >= timestamp:
                with seg.pinned():
                    limit = end.position if seg.base_offset == end.segment else seg.size
                    found = seg.find_time(timestamp, limit)
                if found is not None:
                    return found
        return None

    @staticmethod
    def _bound_in(view: LogView, upper_bound: int) -> LogPosition:
        """Where a read bounded by ``upper_bound`` stops in ``view``: the log end or the
        high watermark as they are (no I/O), else the start of the batch holding it (a
        bound inside a batch leaves that whole batch out)."""
        if upper_bound >= view.log_end.offset:
            return view.log_end
        if upper_bound == view.high_watermark.offset:
            return view.high_watermark
        i = max(bisect_right(view.bases, upper_bound) - 1, 0)
        for seg in view.segments[i:]:
            with seg.pinned():
                limit = view.log_end.position if seg.base_offset == view.log_end.segment else seg.size
                pos = seg.locate(upper_bound, limit)
                if pos is not None:
                    base = parse_header(seg.read(pos, HEADER_SIZE)).base_offset
                    return LogPosition(base, seg.base_offset, pos)
        return view.log_end

    # ------------------------------------------------------------------ retention and truncation

    def expired_segments(self, now_ms: int, floor: int = -1, keep: int = -1) -> list[Segment]:
        """Remove from the log (not from disk) the segments retention lets go. Event loop.

        Never the active segment, nor one holding offsets at or above the high watermark
        (not every replica has them yet).  By age: the segment's newest timestamp (or its file time
        when it has none) is older than ``retention_ms``.  By size: oldest first while the
        log without them stays at or above ``retention_bytes``.  By ``floor`` (a follower's:
        its leader's log start): every offset of the segment is below it.  Never one holding
        offset ``keep`` or above (an open half message: a pending delayed message is kept
        until delivered).  The caller deletes the files
        (``Segment.delete``) off the event loop, then closes them (``Segment.close``, which
        waits for readers).
        """
        cfg = self.config
        expired: list[Segment] = []
        total = self.size_bytes
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.high_watermark:
            if 0 <= keep < self.segments[1].base_offset:
                break
            oldest = self.segments[0]
            newest_ts = oldest.max_timestamp if oldest.max_timestamp >= 0 else oldest.created_ms
            by_age = cfg.retention_ms >= 0 and now_ms - newest_ts > cfg.retention_ms
            by_size = cfg.retention_bytes >= 0 and total - oldest.size >= cfg.retention_bytes
            by_floor = self.segments[1].base_offset <= floor
            if not (by_age or by_size or by_floor):
                break
            expired.append(self.segments.pop(0))
            total -= oldest.size
        if expired:
            self.epochs.truncate_from_start(self.log_start_offset)
            self._publish()
        return expired

    def swap_segments(self, replacements: list[tuple[Segment, Segment]], cleaned_up_to: int) -> None:
        """Put cleaned segments in place of the old ones, (old, new) each, and record that
        the log is clean up to ``cleaned_up_to``. Event loop, after the cleaner's commit.

        A new segment holds the same offsets as the old (it ends at the same
        ``next_offset``); an end position (log end, high watermark) that named an old
        segment's end names the new one's.  Readers of an earlier view keep reading the
        old segments' bytes; the caller closes the old segments (each closes when its last
        reader unpins it).
        """
        new_for = {id(old): new for old, new in replacements}
        for i, seg in enumerate(self.segments):
            new = new_for.get(id(seg))
            if new is None:
                continue
            if new.next_offset != seg.next_offset or new.base_offset != seg.base_offset:
                raise ValueError(f"cleaned {new.path} does not span the offsets of the segment it replaces")
            self.segments[i] = new
            if self.high_watermark_position.segment == seg.base_offset:
                self.high_watermark_position = LogPosition(
                    self.high_watermark_position.offset, new.base_offset, new.size
                )
            if self.log_end.segment == seg.base_offset:
                self.log_end = LogPosition(self.log_end.offset, new.base_offset, new.size)
        self.cleaned_up_to = max(self.cleaned_up_to, cleaned_up_to)
        self._publish()

    def truncate_to(self, offset: int) -> None:
        """Drop everything at or above ``offset`` (a follower's divergent tail). Writer only:
        no append or flush may run meanwhile; readers may.

        Cuts at the start of the batch holding ``offset``, so the log end afterwards is at
        or below it (never a partial batch).  Later segments are removed (their files close
        once their readers are done); the cut is fsynced, then the directory.  Indexes,
        epoch cache, log end and high watermark (min of itself and the new end) follow.
        Readers that took a view before the cut redo their read on the new one.  Does file
        I/O: call it in a worker thread with the partition's writer, retention and HW
        moves paused (Partition.truncate_to does), or in tests.
        """
        if offset >= self.log_end.offset:
            return
        self.generation += 1  # before any byte changes: reads in progress will redo
        removed = []
        while len(self.segments) > 1 and self.active.base_offset >= offset:
            removed.append(self.segments.pop())
        self.active.truncate_to(offset)
        self.active.sealed = False  # written again from now on: not the cleaner's
        end = self._end_position()
        self.cleaned_up_to = min(self.cleaned_up_to, self.active.base_offset)
        # the HW first: an event-loop reader of the two ends never sees HW above LEO
        if self.high_watermark_position.offset > end.offset:
            self.high_watermark_position = end
        self.log_end = end
        self.epochs.truncate_from_end(end.offset)
        self._publish()
        for seg in removed:
            seg.delete()
            seg.close()
        if removed:
            fsync_dir(self.directory)
            # a recovery point above the cut would spare rewritten segments the check
            self.write_recovery_point(self.active.base_offset)
        delete_snapshots_from(self.directory, end.offset)
        self.producers = rebuild(self)

    def reset_to(self, offset: int) -> None:
        """Drop the whole log and start it empty at ``offset``, above its log end (a
        follower so far behind that its leader no longer has the offsets it needs).
        Writer only, like ``truncate_to``; file I/O.

        The old segments go first, then the new one is created: a crash between leaves an
        empty log, which its follower resets again.
        """
        if offset <= self.log_end.offset:
            raise ValueError(f"reset to {offset}: not above the log end {self.log_end.offset}")
        self.generation += 1  # reads in progress will redo on the new view
        removed, self.segments = self.segments, []
        for seg in removed:
            seg.delete()
            seg.close()
        self.segments = [Segment.create(self.directory, offset, self.config.index_interval_bytes)]
        end = self._end_position()
        self.high_watermark_position = end
        self.log_end = end
        self.cleaned_up_to = offset
        self.epochs = LeaderEpochCache()
        delete_snapshots_from(self.directory, -1)
        self.producers = ProducerTable(offset)
        self._publish()
        fsync_dir(self.directory)
        self.write_recovery_point(offset)

    def flush(self) -> None:
        """fsync the active segment. Worker thread."""
        self.active.flush()

    def close(self) -> None:
        """Save the indexes, record the recovery point, snapshot the producer state and
        close every file."""
        try:
            self.active.flush()
            for seg in self.segments:
                seg.save_indexes()
            self.write_recovery_point(self.active.base_offset)
            write_snapshot(self.directory, self.log_end.offset, self.producers.encode())
        finally:
            for seg in self.segments:
                seg.close()
