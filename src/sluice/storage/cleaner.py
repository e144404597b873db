"""The log cleaner: compaction of a partition log (``cleanup.policy=compact``), Kafka style.

What a cleaning keeps
    Only *cleanable* segments are touched: the closed, sealed segments (storage/segment.py)
    from the log start that lie wholly below the high watermark — never the active segment,
    never an offset not yet on every in-sync replica.  Over them the cleaner keeps, for each
    key, the record with the highest offset; records without a key are kept as they are
    (Sluice does not refuse keyless records on compacted topics: that would be per-record
    work on the produce path).  A tombstone (a record whose value is null) that is the
    latest of its key is kept while its segment is *dirty* (never cleaned) and for
    ``delete.retention.ms`` after that segment was first cleaned, then removed: a consumer
    that reads the log from the start within that time sees the deletion.

    Offsets never change (storage/compaction.py rewrites batches in place of themselves).
    A batch left with no record is dropped, unless it is the last batch of its segment (so
    a segment still ends where the next begins, and the log end and every replica's
    position stay as they were) or the first batch of a leader epoch (so the epoch cache
    rebuilt from batch headers at the next start is the one a follower's truncation
    relies on).  Readers skip the empty batches and gaps by each batch's ``next_offset``.

Dirty and clean
    ``cleaned_up_to`` (the *first dirty offset*) is the end of the last cleaning: segments
    below it are clean.  It is kept in ``cleaner-offset-checkpoint`` in the partition
    directory, and it is only a hint — losing it makes every segment dirty again, which
    costs a cleaning and keeps tombstones one ``delete.retention.ms`` longer, nothing
    else.  The time a segment was first cleaned is its file's mtime: a cleaned copy of a
    dirty segment gets the cleaning time, a copy of a clean one keeps the old mtime, and a
    dirty segment the cleaning leaves unchanged is touched.  A pass runs when the dirty
    bytes are at least ``min.cleanable.dirty.percent`` of the cleanable bytes.

A pass, and who runs what
    1. ``plan_cleaning`` (event loop): picks the cleanable segments, decides by the ratio.
    2. ``clean_segments`` (the cleaner thread): maps each key to its latest offset, writes
       each segment that loses records to ``<base>.log.cleaned`` and fsyncs it, and adopts
       it as a new ``Segment`` with indexes built in memory.  Readers and the writer are
       untouched; it stops early when asked to (``abort``).
    3. ``commit_cleaning`` (the cleaner thread), segment by segment: rename
       ``.cleaned`` -> ``.swap``, fsync the directory (the commit point), unlink the old
       ``.index``/``.timeindex``, rename ``.swap`` -> ``.log`` (atomically replacing the
       old file, whose bytes stay readable through descriptors already open), fsync the
       directory, save the new indexes.  Then the checkpoint.
    4. ``PartitionLog.swap_segments`` (event loop): the new segments replace the old in the
       log and a new view is published; the old segments close when their last reader
       unpins them.

Recovery rules (``recover_cleaning``, run by ``PartitionLog.open`` before segments load)
    - ``<base>.log.cleaned``: a cleaning that had not committed; deleted.  The old segment
      is whole and still in place.
    - ``<base>.log.swap``: a committed cleaned segment, complete and fsynced; the old
      ``<base>.index`` and ``.timeindex`` are unlinked and the ``.swap`` is renamed over
      ``<base>.log``.  Indexes missing afterwards are rebuilt from the batches.
    A crash at any point thus leaves each segment either old or cleaned, never a mix, and
    the checkpoint lags at worst (one more cleaning).

Memory: the key map holds every distinct key of the cleanable segments (bytes -> offset).
Segments are not merged after cleaning.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from sluice.protocol.records import CONTROL_BIT
from sluice.storage.checkpoint import fsync_dir, write_atomic
from sluice.storage.compaction import RecordSlice, batch_body, iter_records, rewrite_batch
from sluice.storage.segment import Segment, SegmentClosed

log = logging.getLogger("sluice.storage")

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"


@dataclass(frozen=True)
class CleaningPlan:
    """What one pass cleans: ``segments`` from the log start, all below the high watermark."""

    segments: tuple[Segment, ...]
    first_dirty: int  # cleaned_up_to when planned: segments ending at or below it are clean
    generation: int  # the log's truncation generation when planned
    now_ms: int
    delete_retention_ms: int

    @property
    def end(self) -> int:
        """The offset the log is clean up to once the pass is committed."""
        return self.segments[-1].next_offset

    def is_dirty(self, seg: Segment) -> bool:
        return seg.next_offset > self.first_dirty


@dataclass
class CleanedSegment:
    """A segment of a plan and what replaces it (None: kept as it is)."""

    old: Segment
    new: Segment | None
    removed_bytes: int = 0


def dirty_percent(segments, first_dirty: int) -> int:
    """Dirty bytes as a whole percentage of the bytes of ``segments`` (0 when empty)."""
    total = sum(s.size for s in segments)
    dirty = sum(s.size for s in segments if s.next_offset > first_dirty)
    return dirty * 100 // total if total else 0


def plan_cleaning(plog, min_dirty_percent: int, delete_retention_ms: int, now_ms: int) -> CleaningPlan | None:
    """The pass to run on ``plog`` now, or None (nothing cleanable, or too little dirt).

    Event loop.  Cleanable: the sealed, closed segments from the log start whose offsets
    all lie below the high watermark.  A pass runs when some are dirty and the dirty ones
    make at least ``min_dirty_percent`` of their bytes.
    """
    hw = plog.high_watermark
    cleanable = []
    for seg in plog.segments[:-1]:
        if not seg.sealed or seg.next_offset > hw:
            break
        cleanable.append(seg)
    first_dirty = plog.cleaned_up_to
    if not cleanable or cleanable[-1].next_offset <= first_dirty:
        return None
    if dirty_percent(cleanable, first_dirty) < min_dirty_percent:
        return None
    return CleaningPlan(tuple(cleanable), first_dirty, plog.generation, now_ms, delete_retention_ms)


# ---------------------------------------------------------------------- the cleaner thread


def _batches(seg: Segment):
    """Yield (header, bytes) of every batch of ``seg`` (pinned by the caller)."""
    for h, pos in seg.headers_from(0, seg.size):
        yield h, seg.read(pos, h.size)


def build_key_map(plan: CleaningPlan, abort: threading.Event) -> dict[bytes, int] | None:
    """Each key of the plan's segments -> the highest offset it has; None if aborted."""
    latest: dict[bytes, int] = {}
    for seg in plan.segments:
        with seg.pinned():
            for h, data in _batches(seg):
                if abort.is_set():
                    return None
                if h.attributes & CONTROL_BIT or not h.records_count:
                    continue
                for r in iter_records(batch_body(data, h), h):
                    if r.key is not None:
                        latest[r.key] = r.offset
    return latest


def clean_segments(plan: CleaningPlan, abort: threading.Event) -> list[CleanedSegment] | None:
    """Step 2 of a pass: cleaned copies (``.cleaned``, fsynced, indexed) of the segments that
    lose records.  Cleaner thread.  None when ``abort`` was set or a segment was closed
    meanwhile (its copies are deleted).  ``OSError`` and ``CorruptRecord`` propagate after
    the copies made so far are deleted.
    """
    out: list[CleanedSegment] = []
    try:
        latest = build_key_map(plan, abort)
        if latest is None:
            return None
        last_epoch = -1
        for seg in plan.segments:
            cleaned, last_epoch = _clean_one(plan, seg, latest, last_epoch, abort)
            if cleaned is None:
                discard_cleaned(out)
                return None
            out.append(cleaned)
    except SegmentClosed:
        discard_cleaned(out)
        return None
    except BaseException:
        discard_cleaned(out)
        raise
    return out


def _clean_one(plan: CleaningPlan, seg: Segment, latest: dict, last_epoch: int, abort):
    """(CleanedSegment or None if aborted, epoch of the segment's last batch)."""
    dirty = plan.is_dirty(seg)
    with seg.pinned():
        cleaned_ms = plan.now_ms if dirty else int(os.fstat(seg.fileno).st_mtime * 1000)
        keep_tombstones = dirty or plan.now_ms - cleaned_ms < plan.delete_retention_ms

        def keep(r: RecordSlice) -> bool:
            if r.key is None:
                return True
            return latest.get(r.key) == r.offset and (keep_tombstones or not r.tombstone)

        path = seg.path.with_name(seg.path.name + CLEANED_SUFFIX)
        path.unlink(missing_ok=True)  # a copy an earlier, failed pass left
        changed, written = False, 0
        headers = list(seg.headers_from(0, seg.size))
        with open(path, "xb") as f:
            for i, (h, pos) in enumerate(headers):
                if abort.is_set():
                    break
                data = seg.read(pos, h.size)
                if h.attributes & CONTROL_BIT:
                    out, kept = data, h.records_count
                else:
                    out, kept = rewrite_batch(data, keep)
                starts_epoch = h.leader_epoch > last_epoch
                last_epoch = max(last_epoch, h.leader_epoch)
                if kept == 0 and not starts_epoch and i < len(headers) - 1:
                    changed = True
                    continue
                changed = changed or kept != h.records_count
                f.write(out)
                written += len(out)
            else:
                f.flush()
                os.fsync(f.fileno())
    if abort.is_set():
        path.unlink(missing_ok=True)
        return None, last_epoch
    if not changed:
        path.unlink()
        return CleanedSegment(seg, None), last_epoch
    os.utime(path, ns=(cleaned_ms * 1_000_000, cleaned_ms * 1_000_000))
    new = Segment.adopt(seg.directory, seg.base_offset, path, seg.index_interval)
    return CleanedSegment(seg, new, seg.size - written), last_epoch


def discard_cleaned(cleaned: list[CleanedSegment]) -> None:
    """Close and delete cleaned copies that will not be swapped in. Cleaner thread."""
    for c in cleaned:
        if c.new is not None:
            c.new.close()
            c.old.path.with_name(c.old.path.name + CLEANED_SUFFIX).unlink(missing_ok=True)


def commit_cleaning(plan: CleaningPlan, cleaned: list[CleanedSegment], directory: Path) -> list[CleanedSegment]:
    """Step 3 of a pass: swap the cleaned copies in on disk; the ones swapped, in order.

    Cleaner thread, with no truncation of the log running (see the module docstring for
    the order of renames).  On ``OSError`` the error propagates with ``.swapped`` set to
    the pairs already swapped (the log must take those in) and the copies not yet swapped
    deleted.  Dirty segments kept unchanged get the cleaning time as mtime.
    """
    swapped: list[CleanedSegment] = []
    try:
        for c in cleaned:
            old = c.old
            if c.new is None:
                if plan.is_dirty(old):
                    os.utime(old.path, ns=(plan.now_ms * 1_000_000,) * 2)
                continue
            cleaned_path = old.path.with_name(old.path.name + CLEANED_SUFFIX)
            swap = old.path.with_name(old.path.name + SWAP_SUFFIX)
            os.replace(cleaned_path, swap)
            fsync_dir(directory)
            _install_swap(swap, old.path)
            swapped.append(c)
            c.new.save_indexes()
        write_atomic(directory / CLEANER_CHECKPOINT, f"{plan.end}\n".encode())
    except OSError as exc:
        discard_cleaned([c for c in cleaned if c not in swapped])
        exc.swapped = swapped
        raise
    return swapped


def _install_swap(swap: Path, log_path: Path) -> None:
    """Replace ``log_path`` by the committed ``swap``: old indexes first (derived, rebuilt
    if missing), then the atomic rename, then the directory fsync."""
    stem = log_path.with_suffix("")
    for ext in (".index", ".timeindex"):
        stem.with_suffix(ext).unlink(missing_ok=True)
    os.replace(swap, log_path)
    fsync_dir(log_path.parent)


# ---------------------------------------------------------------------- recovery


def recover_cleaning(directory: Path) -> None:
    """Finish or undo what a crash left of a cleaning in ``directory`` (rules above).

    Call before the segments are opened, with nothing else using the directory.
    """
    for path in sorted(directory.glob("*.log" + CLEANED_SUFFIX)):
        log.info("removing %s: a cleaning that did not commit", path.name)
        path.unlink()
    for path in sorted(directory.glob("*.log" + SWAP_SUFFIX)):
        log.info("installing %s: a cleaning that committed", path.name)
        _install_swap(path, path.with_name(path.name[: -len(SWAP_SUFFIX)]))


def read_cleaner_checkpoint(directory: Path) -> int:
    """The offset below which the log was cleaned; 0 when unknown (all dirty)."""
    try:
        return max(int((directory / CLEANER_CHECKPOINT).read_text().strip()), 0)
    except (FileNotFoundError, ValueError):
        return 0

