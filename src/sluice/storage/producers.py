"""Idempotent producers' state in one partition: which sequences each producer stored where.

An idempotent producer stamps every batch with its producer id, epoch and the sequence of its
first record (records.py's header: ``producer_id``, ``producer_epoch``, ``base_sequence``).
For each producer id the partition keeps its latest epoch and its last ``WINDOW`` (5)
batches: (first sequence, last sequence, base offset, next offset).  A new batch is checked
against that (``check``):

    batch epoch < stored epoch                  -> ProducerFenced
    unknown producer, or batch epoch > stored   -> new (any base sequence: a new epoch
                                                   starts where its producer says)
    base sequence = last stored sequence + 1    -> new
    (first, last) = one of the last 5 batches   -> duplicate: its original base offset
    wholly before those 5 (< 2**30 behind)      -> duplicate, offset no longer known (-1)
    anything else (a gap, a partial overlap)    -> OutOfOrderSequence

Sequences are int32 in ``[0, 2**31)`` and wrap: the sequence after ``2**31 - 1`` is 0, so
every comparison is modular (``seq_add``, ``seq_distance``), never ``<`` on raw values.

**Where the state lives.**  The log is the truth: every stored batch carries its producer
fields, so the state is a fold over the batch headers.  A *snapshot* (``<offset>.producers``
in the partition directory: the state of the log below ``offset``) only spares a long scan:
``rebuild`` loads the newest snapshot at or below the log end and folds the headers from
there.  Snapshots are written when a segment rolls and when the log closes; the newest
``KEEP_SNAPSHOTS`` are kept.  Retention deletes segments, never state: the folded state
outlives the batches it came from.  Producers idle longer than ``producer.id.expiration.ms``
(by their last batch's timestamp) are dropped (``expire``).

The same fold keeps the offsets of the partition's **open half messages** (transactional
messages not yet committed or rolled back: protocol/transactions.py), so that a new leader
reads its log for transaction state from the oldest open half on, not from its start
(``open_halves``; broker/transactions/).

Concurrency: a ``ProducerTable`` belongs to its partition's writer (event loop); the I/O
functions (``rebuild``, ``write_snapshot``, ...) run in worker threads on tables no one else
is using, or on encoded snapshot bytes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

import msgspec

from sluice.errors import CorruptRecord, OutOfOrderSequence, ProducerFenced
from sluice.protocol import transactions as tx
from sluice.protocol.records import (
    CONTROL_BIT,
    TRANSACTIONAL_BIT,
    crc32c,
    decode_first,
    parse_header,
)
from sluice.storage.checkpoint import write_atomic

log = logging.getLogger("sluice.storage")

SEQ_MOD = 1 << 31  # sequences are int32 in [0, 2**31) and wrap to 0
HALF_SPACE = 1 << 30  # "behind" and "ahead" are told apart within half the sequence space
WINDOW = 5  # batches remembered per producer: as many as a producer keeps in flight
KEEP_SNAPSHOTS = 3
SNAPSHOT_SUFFIX = ".producers"
_SNAPSHOT_VERSION = 2  # 2: with the open half messages


def seq_add(seq: int, n: int) -> int:
    """The sequence ``n`` records after ``seq``, wrapping at 2**31."""
    return (seq + n) % SEQ_MOD


def seq_distance(frm: int, to: int) -> int:
    """How many records ``to`` is after ``frm``, in [0, 2**31) (modular)."""
    return (to - frm) % SEQ_MOD


class StoredBatch(NamedTuple):
    first_seq: int
    last_seq: int
    base_offset: int
    next_offset: int


class Duplicate(NamedTuple):
    """A batch already stored: ``base_offset`` is the original's (-1: no longer known);
    ``end`` is an offset at or past the original's end, which the high watermark must reach
    before an ``acks=all`` duplicate is answered."""

    base_offset: int
    end: int


class ProducerEntry:
    __slots__ = ("epoch", "batches", "last_timestamp")

    def __init__(self, epoch: int, batches: list[StoredBatch], last_timestamp: int) -> None:
        self.epoch = epoch
        self.batches = batches  # oldest first, at most WINDOW
        self.last_timestamp = last_timestamp

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.epoch, list(self.batches), self.last_timestamp)

    def add(self, epoch: int, batch: StoredBatch, timestamp: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, []
        self.batches.append(batch)
        if len(self.batches) > WINDOW:
            del self.batches[0]
        self.last_timestamp = max(self.last_timestamp, timestamp)


def check_batch(
    entry: ProducerEntry | None, producer_id: int, epoch: int, base_seq: int, count: int
) -> Duplicate | None:
    """None when the batch is new for ``entry`` (see the module's table), a ``Duplicate``
    when it is stored already; raises ``ProducerFenced`` or ``OutOfOrderSequence``."""
    if entry is None or epoch > entry.epoch or not entry.batches:
        return None
    if epoch < entry.epoch:
        raise ProducerFenced(
            f"producer {producer_id} epoch {epoch} is fenced: epoch {entry.epoch} has written"
        )
    newest = entry.batches[-1]
    expected = seq_add(newest.last_seq, 1)
    if base_seq == expected:
        return None
    last_seq = seq_add(base_seq, count - 1)
    for b in entry.batches:
        if b.first_seq == base_seq and b.last_seq == last_seq:
            return Duplicate(b.base_offset, newest.next_offset)
    oldest = entry.batches[0].first_seq
    if 0 < seq_distance(last_seq, oldest) <= HALF_SPACE and seq_distance(base_seq, oldest) <= HALF_SPACE:
        return Duplicate(-1, newest.next_offset)  # wholly before the window: stored long ago
    raise OutOfOrderSequence(
        f"producer {producer_id} epoch {epoch}: batch with sequences {base_seq}..{last_seq} "
        f"does not follow the last stored sequence {newest.last_seq} (expected {expected})"
    )


class ProducerTable:
    """The producer state of one partition's log below ``offset`` (see the module docstring)."""

    def __init__(
        self, offset: int = 0, producers: dict[int, ProducerEntry] | None = None, halves: set[int] | None = None
    ) -> None:
        self.offset = offset
        self.producers: dict[int, ProducerEntry] = producers if producers is not None else {}
        self.open_halves: set[int] = halves if halves is not None else set()

    def __len__(self) -> int:
        return len(self.producers)

    def observe(
        self, producer_id: int, epoch: int, base_seq: int, base_offset: int, next_offset: int,
        count: int, timestamp: int,
    ) -> None:
        """Fold in a stored batch (from the log, a follower's copy, or a leader's write)."""
        batch = StoredBatch(base_seq, seq_add(base_seq, count - 1), base_offset, next_offset)
        entry = self.producers.get(producer_id)
        if entry is None:
            self.producers[producer_id] = ProducerEntry(epoch, [batch], timestamp)
        else:
            entry.add(epoch, batch, timestamp)
        if next_offset > self.offset:
            self.offset = next_offset

    def observe_txn(self, attributes: int, base_offset: int, batch, pos: int = 0) -> None:
        """Fold in a stored batch that is part of the transaction bookkeeping (``attributes``
        has one of ``tx.TXN_BITS``; ``batch[pos:]`` holds it whole): a half opens, a commit
        or rollback ends its half."""
        change = txn_change(attributes, base_offset, batch, pos)
        if change is not None:
            opened, half = change
            (self.open_halves.add if opened else self.open_halves.discard)(half)

    def begin(self) -> Staging:
        """A staging area to check one write group's batches against this table and each
        other; ``Staging.commit`` applies them once the write succeeded."""
        return Staging(self)

    def expire(self, now_ms: int, idle_ms: int) -> int:
        """Drop producers whose last batch is more than ``idle_ms`` old; return how many."""
        stale = [pid for pid, e in self.producers.items() if now_ms - e.last_timestamp > idle_ms]
        for pid in stale:
            del self.producers[pid]
        return len(stale)

    # ------------------------------------------------------------------ snapshots

    def encode(self) -> bytes:
        """The snapshot bytes of this table: CRC-32C (4 bytes, big-endian) + msgpack."""
        body = msgspec.msgpack.encode([
            _SNAPSHOT_VERSION,
            self.offset,
            [[pid, e.epoch, e.last_timestamp, [list(b) for b in e.batches]] for pid, e in self.producers.items()],
            sorted(self.open_halves),
        ])
        return crc32c(body).to_bytes(4, "big") + body

    @classmethod
    def decode(cls, data: bytes) -> ProducerTable:
        """The table of snapshot bytes; ``ValueError`` when they are corrupt."""
        if len(data) < 4 or int.from_bytes(data[:4], "big") != crc32c(data[4:]):
            raise ValueError("producer snapshot CRC mismatch")
        try:
            version, offset, rows, halves = msgspec.msgpack.decode(data[4:])
            if version != _SNAPSHOT_VERSION:
                raise ValueError(f"unknown producer snapshot version {version}")
            producers = {
                pid: ProducerEntry(epoch, [StoredBatch(*b) for b in batches], ts)
                for pid, epoch, ts, batches in rows
            }
        except (msgspec.DecodeError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed producer snapshot: {exc}") from exc
        return cls(offset, producers, set(halves))


class Staging:
    """Checks and records of one write group, applied to the table only by ``commit`` (so
    that a failed write leaves the state where the log is)."""

    __slots__ = ("table", "entries", "halves")

    def __init__(self, table: ProducerTable) -> None:
        self.table = table
        self.entries: dict[int, ProducerEntry] = {}
        self.halves: list[tuple[bool, int]] = []  # (opened, half offset), in log order

    def _entry(self, producer_id: int) -> ProducerEntry | None:
        entry = self.entries.get(producer_id)
        return entry if entry is not None else self.table.producers.get(producer_id)

    def check(self, producer_id: int, epoch: int, base_seq: int, count: int) -> Duplicate | None:
        return check_batch(self._entry(producer_id), producer_id, epoch, base_seq, count)

    def record(
        self, producer_id: int, epoch: int, base_seq: int, base_offset: int, next_offset: int,
        count: int, timestamp: int,
    ) -> None:
        entry = self.entries.get(producer_id)
        if entry is None:
            stored = self.table.producers.get(producer_id)
            entry = self.entries[producer_id] = stored.copy() if stored else ProducerEntry(epoch, [], timestamp)
        entry.add(epoch, StoredBatch(base_seq, seq_add(base_seq, count - 1), base_offset, next_offset), timestamp)

    def record_txn(self, attributes: int, base_offset: int, batch, pos: int) -> None:
        change = txn_change(attributes, base_offset, batch, pos)
        if change is not None:
            self.halves.append(change)

    def commit(self, next_offset: int) -> None:
        table = self.table
        table.producers.update(self.entries)
        for opened, half in self.halves:
            (table.open_halves.add if opened else table.open_halves.discard)(half)
        table.offset = max(table.offset, next_offset)


def txn_change(attributes: int, base_offset: int, batch, pos: int) -> tuple[bool, int] | None:
    """(True, offset) for a half message at ``base_offset``, (False, half offset) for a
    commit or rollback batch (its first record names the half), None for anything else."""
    if attributes & TRANSACTIONAL_BIT:
        return True, base_offset
    if not attributes & tx.TXN_BITS:
        return None
    try:
        h = parse_header(batch, pos)
        first = decode_first(batch, h, pos)
        half = tx.resolved_offset(attributes, [first] if first is not None else [])
    except (CorruptRecord, ValueError) as exc:
        log.warning("transaction batch at offset %d cannot be read: %s", base_offset, exc)
        return None
    return None if half is None else (False, half)


# ---------------------------------------------------------------------- files (worker thread)


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: Path) -> list[int]:
    """Offsets of the snapshots in ``directory``, ascending."""
    return sorted(int(p.stem) for p in directory.glob(f"*{SNAPSHOT_SUFFIX}") if p.stem.isdigit())


def write_snapshot(directory: Path, offset: int, data: bytes) -> None:
    """Write snapshot bytes taken at ``offset`` (tmp + fsync + rename), then keep only the
    newest ``KEEP_SNAPSHOTS``."""
    write_atomic(snapshot_path(directory, offset), data)
    for old in snapshot_offsets(directory)[:-KEEP_SNAPSHOTS]:
        snapshot_path(directory, old).unlink(missing_ok=True)


def delete_snapshots_from(directory: Path, offset: int) -> None:
    """Remove snapshots taken above ``offset`` (the log was cut there: they describe batches
    that are gone)."""
    for off in snapshot_offsets(directory):
        if off > offset:
            snapshot_path(directory, off).unlink(missing_ok=True)


def load_snapshot(directory: Path, max_offset: int) -> ProducerTable | None:
    """The newest readable snapshot at or below ``max_offset``; a corrupt one is kept aside
    as ``*.bad`` and an older one tried.  None when there is none."""
    for off in reversed(snapshot_offsets(directory)):
        if off > max_offset:
            continue
        path = snapshot_path(directory, off)
        try:
            table = ProducerTable.decode(path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("producer snapshot %s is unreadable (%s); kept aside", path, exc)
            os.replace(path, path.with_name(path.name + ".bad"))
            continue
        table.offset = off
        return table
    return None


def rebuild(plog) -> ProducerTable:
    """The producer state of ``plog`` (a PartitionLog): its newest snapshot at or below the
    log end, then every batch header after it.  Worker thread, with the log's writer paused
    (at open, or in a truncation)."""
    end = plog.log_end_offset
    start = plog.log_start_offset
    table = load_snapshot(plog.directory, end)
    if table is None:
        table = ProducerTable(start)
    frm = max(table.offset, start)
    for seg in plog.segments:
        if seg.next_offset <= frm:
            continue
        pos = seg.locate(frm, seg.size) if seg.base_offset < frm else 0
        if pos is None:
            continue
        for h, at in seg.headers_from(pos, seg.size):
            if h.next_offset <= frm:
                continue
            if h.attributes & tx.TXN_BITS:
                table.observe_txn(h.attributes, h.base_offset, seg.read(at, h.size))
            if h.producer_id >= 0 and not h.attributes & CONTROL_BIT:
                # offsets, not records: a compacted batch keeps its span but not its records
                table.observe(
                    h.producer_id, h.producer_epoch, h.base_sequence, h.base_offset,
                    h.next_offset, h.next_offset - h.base_offset, h.max_timestamp,
                )
    table.offset = end
    table.open_halves = {o for o in table.open_halves if start <= o < end}  # retention took the rest
    return table
