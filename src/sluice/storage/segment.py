"""Segment: one ``<20-digit base offset>.log`` file of whole record batches, with its indexes.

A segment is appended to by one writer (the partition's writer task) and read by any thread.
Bytes up to ``size`` are whole, written batches; ``size`` only grows on the event loop after
a write returned, so a reader that takes ``size`` first never sees a half-written batch.

Concurrency contract:

- ``write`` / ``flush`` / ``save_indexes`` run in a worker thread (``write`` of a small
  group on the event loop itself, its fdatasync in the broker's syncer), one at a time per
  segment (the writer task guarantees it); ``appended`` then runs on the event loop.
- ``read`` / ``locate`` / ``find_time`` may run in any thread at any time: they use ``pread``
  on the one file descriptor and never read past the limit they were given.  A reader
  ``pin``s the segment first (``pinned()``), which keeps the descriptor open.
- ``recover`` runs when nobody else touches the segment; ``truncate_to`` runs in the writer
  while readers may read below the cut (see PartitionLog's generation check).

``close`` never pulls a descriptor from under a reader: it only marks the segment, and the
last reader to unpin closes it.  So a reader holding a segment that retention or truncation
has just removed (and unlinked) still reads the bytes it was given, never ``EBADF``, and
never another file that reused the descriptor number.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import CorruptRecord
from sluice.protocol.records import HEADER_SIZE, BatchHeader, batch_crc_ok, parse_header
from sluice.storage import faults
from sluice.storage.checkpoint import write_atomic
from sluice.storage.index import OffsetIndex, TimeIndex

log = logging.getLogger("sluice.storage")

# No accepted batch is larger (max.message.bytes is capped below it): a bigger one is corrupt.
_MAX_BATCH_BYTES = 64 * 1024 * 1024
_HEADER_CHUNK = 64 * 1024  # bytes read at once when walking batch headers
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # buffers per pwritev


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(frozen=True)
class Cut:
    """A torn or corrupt tail that recovery removed (kept aside in ``quarantine``)."""

    segment: Path
    position: int
    dropped_bytes: int
    reason: str
    quarantine: Path | None


class SegmentClosed(Exception):
    """The segment was closed (removed from its log) before a reader could pin it."""


class Segment:
    def __init__(self, directory: Path, base_offset: int, index_interval: int = 4096) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval = index_interval
        stem = segment_name(base_offset)
        self.path = directory / f"{stem}.log"
        self.index_path = directory / f"{stem}.index"
        self.timeindex_path = directory / f"{stem}.timeindex"
        self.index = OffsetIndex(base_offset)
        self.timeindex = TimeIndex(base_offset)
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.created_ms = int(time.time() * 1000)
        self._since_index = 0
        self._file = None
        self._pins = 0
        self._close_wanted = False
        self._pin_lock = threading.Lock()
        # (epoch, first offset) of each run of epochs, filled by a full recovery scan;
        # edge_epochs: epochs of the first and last batch (None when empty)
        self.scanned_epochs: list[tuple[int, int]] | None = None
        self.edge_epochs: tuple[int, int] | None = None
        # closed for good: rolled, flushed and its indexes saved (set by ``seal``); only
        # a sealed segment may be rewritten by the log cleaner, as nothing writes it again
        self.sealed = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval: int = 4096) -> Segment:
        seg = cls(directory, base_offset, index_interval)
        if faults.injector is not None:
            faults.injector.check("roll", seg.path)
        seg._file = open(seg.path, "x+b", buffering=0)  # noqa: SIM115 - lives with the segment
        return seg

    @classmethod
    def open(
        cls, directory: Path, base_offset: int, *, verify: bool, index_interval: int = 4096
    ) -> tuple[Segment, Cut | None]:
        """Open an existing segment.

        With ``verify`` every batch's header and CRC is checked and a bad tail is cut (the cut
        bytes are kept in ``<name>.log.<position>.bad``); indexes are rebuilt.  Without it the
        saved indexes are loaded, or rebuilt from batch headers when missing or invalid.
        """
        seg = cls(directory, base_offset, index_interval)
        seg._file = open(seg.path, "r+b", buffering=0)  # noqa: SIM115
        seg.created_ms = int(os.stat(seg.path).st_mtime * 1000)
        if verify:
            return seg, seg._recover(verify_crc=True)
        if not seg._load_indexes():
            cut = seg._recover(verify_crc=False)
            if cut:
                return seg, cut
        return seg, None

    @classmethod
    def adopt(cls, directory: Path, base_offset: int, path: Path, index_interval: int = 4096) -> Segment:
        """A segment of base ``base_offset`` over the complete file at ``path`` (a cleaned
        copy, still under its temporary name): indexes are built by scanning its batch
        headers.  The file keeps its descriptor when later renamed to the segment's name.
        ``CorruptRecord`` if its batches are not whole and in offset order.
        """
        seg = cls(directory, base_offset, index_interval)
        seg._file = open(path, "r+b", buffering=0)  # noqa: SIM115 - lives with the segment
        seg.created_ms = int(os.stat(path).st_mtime * 1000)
        cut = seg._scan()
        if cut is not None:
            seg.close()
            raise CorruptRecord(f"{path} at byte {cut[0]}: {cut[1]}")
        seg.sealed = True
        return seg

    def close(self) -> None:
        """Close the file now, or when the last reader unpins it. Idempotent."""
        with self._pin_lock:
            self._close_wanted = True
            if self._pins or self._file is None:
                return
            f, self._file = self._file, None
        f.close()

    def pin(self) -> bool:
        """Keep the file open for a read (any thread); False once the segment was closed."""
        with self._pin_lock:
            if self._close_wanted:
                return False
            self._pins += 1
            return True

    def unpin(self) -> None:
        with self._pin_lock:
            self._pins -= 1
            if self._pins or not self._close_wanted or self._file is None:
                return
            f, self._file = self._file, None
        f.close()

    @contextmanager
    def pinned(self):
        """``with seg.pinned():`` read; ``SegmentClosed`` if it is closed already."""
        if not self.pin():
            raise SegmentClosed(str(self.path))
        try:
            yield self
        finally:
            self.unpin()

    def delete(self) -> None:
        """Unlink the segment's files; open readers keep reading until they drop it."""
        for p in (self.path, self.index_path, self.timeindex_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    @property
    def fileno(self) -> int:
        return self._file.fileno()

    # ------------------------------------------------------------------ writing

    def write(self, buffers: list, total: int) -> None:
        """Append ``buffers`` (``total`` bytes) at ``size``. Worker thread, or the event loop
        for a small write.

        All or nothing: on any ``OSError`` (disk full, I/O error) the file is cut back to
        ``size`` before the error propagates, so no partial batch stays behind.
        """
        fd, pos, written = self.fileno, self.size, 0
        if faults.injector is not None:
            faults.injector.check("write", self.path)
        try:
            while written < total:
                n = os.pwritev(fd, buffers[:_IOV_MAX], pos + written)
                written += n
                if written < total:
                    buffers = _skip(buffers, n)
        except OSError:
            try:
                os.ftruncate(fd, pos)
            except OSError:
                log.exception("cannot cut %s back to %d after a failed write", self.path, pos)
            raise

    def flush(self) -> None:
        """fdatasync the log file. Worker thread only."""
        if faults.injector is not None:
            faults.injector.check("fsync", self.path)
        os.fdatasync(self.fileno)

    def appended(self, batches) -> None:
        """Account for batches just written: iterable of (base_offset, next_offset, max_ts, size).

        Event loop only, after ``write`` returned.  Per-batch work: index bookkeeping.
        """
        pos = self.size
        for base, nxt, max_ts, size in batches:
            self._account(base, nxt, max_ts, pos, size)
            pos += size
        self.size = pos

    def _account(self, base: int, nxt: int, max_ts: int, pos: int, size: int) -> None:
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        if self._since_index <= 0 or pos == 0:
            # Both indexes gain an entry at the same batches; the time entry carries the
            # running max, so "entry < t" proves every batch up to it is older than t.
            self.index.append(base, pos)
            self.timeindex.append(self.max_timestamp, base)
            self._since_index = self.index_interval
        self._since_index -= size
        self.next_offset = nxt

    def save_indexes(self) -> None:
        """Write both index files atomically. Worker thread only (or at shutdown)."""
        write_atomic(self.index_path, self.index.to_bytes())
        write_atomic(self.timeindex_path, self.timeindex.to_bytes())

    def seal(self) -> None:
        """Save the indexes of a segment nothing will write again (rolled and flushed) and
        mark it ``sealed``: from now on the log cleaner may replace it. Worker thread."""
        self.save_indexes()
        self.sealed = True

    # ------------------------------------------------------------------ reading

    def read(self, position: int, length: int) -> bytes:
        """``length`` bytes at ``position`` (fewer only at end of file). Any thread."""
        return os.pread(self.fileno, length, position)

    def headers_from(self, position: int, limit: int):
        """Yield (header, position) of the batches in [position, limit). Any thread.

        Reads the file in chunks and parses the headers that fall inside each, so a scan
        over many small batches costs a few reads, not one per batch.
        """
        fd = self.fileno
        chunk, chunk_at = b"", position
        while position + HEADER_SIZE <= limit:
            rel = position - chunk_at
            if rel + HEADER_SIZE > len(chunk):
                chunk, chunk_at, rel = os.pread(fd, min(_HEADER_CHUNK, limit - position), position), position, 0
            h = parse_header(chunk, rel)
            yield h, position
            position += h.size

    def locate(self, offset: int, limit: int) -> int | None:
        """Position of the batch holding ``offset``, looking below ``limit``; None if beyond."""
        _, pos = self.index.lookup(offset)
        for h, p in self.headers_from(pos, limit):
            if h.next_offset > offset:
                return p
        return None

    def find_time(self, timestamp: int, limit: int) -> int | None:
        """Base offset of the first batch with max timestamp ≥ ``timestamp``; None if none."""
        start = self.timeindex.scan_start(timestamp)
        _, pos = self.index.lookup(start)
        for h, _ in self.headers_from(pos, limit):
            if h.max_timestamp >= timestamp:
                return h.base_offset
        return None

    # ------------------------------------------------------------------ recovery

    def _load_indexes(self) -> bool:
        """Load saved indexes and the segment's end from them; False if they cannot be trusted."""
        try:
            size = os.fstat(self.fileno).st_size
            index = OffsetIndex.from_bytes(self.index_path.read_bytes(), self.base_offset, size)
            if size and not len(index):
                return False
            last_pos = index.positions[-1] if len(index) else 0
            next_offset, max_ts, last_epoch = self.base_offset, -1, None
            # Walk the headers after the last entry to find the end (cheap: a sparse tail).
            for h, p in self.headers_from(last_pos, size):
                if p + h.size > size:
                    return False
                next_offset, max_ts = h.next_offset, max(max_ts, h.max_timestamp)
                last_epoch = h.leader_epoch
                last_pos = p + h.size
            if last_pos != size:
                return False
            tindex = TimeIndex.from_bytes(
                self.timeindex_path.read_bytes(), self.base_offset, next_offset
            )
        except Exception as exc:  # noqa: BLE001 - any doubt about derived data => rebuild
            log.info("rebuilding indexes of %s: %s", self.path, exc)
            return False
        self.index, self.timeindex, self.size, self.next_offset = index, tindex, size, next_offset
        self.max_timestamp = max(max_ts, tindex.timestamps[-1] if len(tindex) else -1)
        if size:
            first = parse_header(os.pread(self.fileno, HEADER_SIZE, 0))
            self.edge_epochs = (first.leader_epoch, last_epoch)
        return True

    def _recover(self, verify_crc: bool) -> Cut | None:
        """Rebuild indexes by scanning the file; cut at the first bad or torn batch."""
        bad = self._scan(verify_crc)
        if bad is None:
            return None
        pos, reason = bad
        return self._cut(pos, os.fstat(self.fileno).st_size - pos, reason)

    def _scan(self, verify_crc: bool = False) -> tuple[int, str] | None:
        """Rebuild indexes, end and epoch runs from the batches; (position, reason) of the
        first bad or torn batch, None when the whole file is sound."""
        self.index = OffsetIndex(self.base_offset)
        self.timeindex = TimeIndex(self.base_offset)
        self.size, self.next_offset, self.max_timestamp, self._since_index = 0, self.base_offset, -1, 0
        fd = self.fileno
        file_size = os.fstat(fd).st_size
        pos, reason = 0, None
        expected = self.base_offset
        runs: list[tuple[int, int]] = []
        while pos < file_size:
            head = os.pread(fd, HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                reason = f"torn batch header ({len(head)} of {HEADER_SIZE} bytes)"
                break
            try:
                h = parse_header(head)
            except Exception as exc:  # noqa: BLE001 - CorruptRecord, reported below
                reason = str(exc)
                break
            if pos + h.size > file_size:
                reason = f"torn batch: {h.size} bytes declared, {file_size - pos} present"
                break
            # above ``expected`` is a gap the log cleaner left (storage/compaction.py)
            if h.base_offset < expected or h.last_offset_delta < 0:
                reason = f"batch offset {h.base_offset} is below {expected}, the end of the batch before"
                break
            if verify_crc and not _crc_ok(fd, pos, h):
                reason = f"CRC-32C mismatch in batch at offset {h.base_offset}"
                break
            self._account(h.base_offset, h.next_offset, h.max_timestamp, pos, h.size)
            if not runs or h.leader_epoch > runs[-1][0]:
                runs.append((h.leader_epoch, h.base_offset))
            expected = h.next_offset
            pos += h.size
        self.size = pos
        self.scanned_epochs = runs
        return None if reason is None else (pos, reason)

    def _cut(self, position: int, dropped: int, reason: str) -> Cut:
        quarantine = self.path.with_name(f"{self.path.name}.{position}.bad")
        n = 1
        while quarantine.exists():  # an earlier cut at the same place: keep both
            quarantine = self.path.with_name(f"{self.path.name}.{position}.{n}.bad")
            n += 1
        try:
            with open(quarantine, "wb") as out:
                out.write(os.pread(self.fileno, dropped, position))
        except OSError:
            quarantine = None
        os.ftruncate(self.fileno, position)
        os.fsync(self.fileno)
        cut = Cut(self.path, position, dropped, reason, quarantine)
        log.warning(
            "recovery cut %d bytes at position %d of %s: %s (kept in %s)",
            dropped, position, self.path, reason, quarantine,
        )
        return cut

    def truncate_to(self, offset: int) -> None:
        """Drop the batch holding ``offset`` and every later one; fsync the cut. Writer only.

        The cut falls at the start of the batch holding ``offset`` (normally a batch
        boundary: then exactly at ``offset``), so ``next_offset`` afterwards is at or below it.
        The indexes lose their entries past the cut; the max timestamp is recomputed from
        the time index and the few batches after the last index entry.  Readers may still
        read below the cut meanwhile; bytes above it change under readers of an older view,
        which PartitionLog detects (``generation``).
        """
        if offset >= self.next_offset:
            return
        pos = self.locate(offset, self.size)
        if pos is None:
            return
        cut = parse_header(os.pread(self.fileno, HEADER_SIZE, pos)).base_offset
        os.ftruncate(self.fileno, pos)
        os.fsync(self.fileno)  # the new size is durable before anything is written after it
        self.index.truncate_to(cut)
        self.timeindex.truncate_to(cut)
        self.size = pos
        # what remains after the last index entry is a few batches: scan just those
        _, scan_from = self.index.lookup(cut - 1)
        self.next_offset = self.base_offset
        self.max_timestamp = self.timeindex.timestamps[-1] if len(self.timeindex) else -1
        for h, _ in self.headers_from(scan_from, pos):
            self.max_timestamp = max(self.max_timestamp, h.max_timestamp)
            self.next_offset = h.next_offset
        self._since_index = 0

    def epoch_runs(self, after_epoch: int) -> list[tuple[int, int]]:
        """(epoch, first offset) of each batch whose epoch is above every one before it,
        starting from ``after_epoch`` (the last epoch before this segment). Any thread.

        Epochs never decrease along a log, so a segment whose first and last batch have
        the same epoch holds one run and costs no scan; otherwise the headers are read.
        """
        if self.scanned_epochs is not None:
            runs = self.scanned_epochs
        elif self.edge_epochs is None:
            return []
        elif self.edge_epochs[0] == self.edge_epochs[1]:
            runs = [(self.edge_epochs[0], self.base_offset)]
        else:
            runs, last = [], None
            for h, _ in self.headers_from(0, self.size):
                if last is None or h.leader_epoch > last:
                    runs.append((h.leader_epoch, h.base_offset))
                    last = h.leader_epoch
        out = []
        for epoch, start in runs:
            if epoch > after_epoch:
                out.append((epoch, start))
                after_epoch = epoch
        return out


def _crc_ok(fd: int, pos: int, h: BatchHeader) -> bool:
    if h.size > _MAX_BATCH_BYTES:
        return False
    return batch_crc_ok(os.pread(fd, h.size, pos), 0, h.size)


def _skip(buffers: list, n: int) -> list:
    """The buffers left after the first ``n`` bytes were written."""
    out = []
    for b in buffers:
        if n >= len(b):
            n -= len(b)
            continue
        out.append(memoryview(b)[n:] if n else b)
        n = 0
    return out
