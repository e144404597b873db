"""The idempotent producer's bookkeeping: identities and per-partition sequences (DESIGN §4).

Pure state, no I/O and no asyncio: the sender (client/sender.py) asks it what to stamp on a
batch, tells it how each batch ended, and asks it what an OUT_OF_ORDER_SEQUENCE answer
means.  What lives here must hold whatever order answers arrive in.

The broker's contract, per (producer id, partition): sequences are int32 in 0..2**31-1 and
wrap; record i of a batch has sequence (base + i) mod 2**31 and the next batch starts at
(last + 1) mod 2**31.  A batch of the stored epoch is written when its base is the next
sequence, answered as a duplicate (with its original offset, or -1 when stored too long
ago) when it repeats a stored batch, refused with OUT_OF_ORDER_SEQUENCE otherwise; a newer
epoch, or a producer the partition does not know, starts anywhere; an older epoch is
PRODUCER_FENCED.  A request's part for one partition is checked as a whole.

What the client keeps, per partition (``PartitionSequences``):

- the identity its batches are stamped with, ``(producer_id, epoch)``, and the next sequence;
- ``outstanding``: the batches that have a sequence and have not ended (in flight or queued
  for a retry), in drain order (``Batch.drain_no``, consecutive per partition);
- whether a batch of this identity was acknowledged yet (until then the sender keeps one
  request in flight: a partition that does not know the producer accepts any sequence, so a
  second request could be stored ahead of a first one that failed);
- the newest batch that ended without being stored as far as the client knows
  (``last_failed``), unless a later batch was acknowledged since (which proves it stored).

Why an OUT_OF_ORDER_SEQUENCE part is never stored, nor anything after it: the sender puts
only batches with consecutive ``drain_no`` in one part, so if the part's first batch were
stored the broker would answer it (and each following one) as a duplicate or as the next
sequence.  The first batch of the part tells what happened (``classify``):

- ``RETRY``: an earlier batch of this identity is still outstanding: the part will follow it;
- ``GAP``: nothing earlier is outstanding and an earlier batch failed: the client made the gap
  itself (a batch expired or failed for good after it got its sequence).  A broker-assigned
  identity continues under the next epoch from sequence 0 (``renumber``, once nothing of the
  partition is in flight); an explicit identity never renumbers: the sends fail;
- ``LOST``: nothing earlier is outstanding and nothing failed: the broker lost batches it had
  acknowledged (``acks="leader"`` and a leader change).  The part fails with the error.

A new epoch rather than a new producer id: it needs no round trip that could fail, touches
only the partition with the gap (the others keep their sequences and their requests in
flight), and the broker accepts any sequence from a newer epoch.  Only past epoch 32767 does
the partition take a fresh producer id.
"""

from __future__ import annotations

from sluice import errors
from sluice.client.accumulator import Batch

SEQUENCE_MOD = 1 << 31
MAX_EPOCH = 32767
DERIVED_ID_MIN = 1 << 62  # ids from here up are derived by callers; brokers hand out less
MAX_IN_FLIGHT_BATCHES = 5  # the broker remembers the last 5 batches per producer and partition

RETRY, GAP, LOST = "retry", "gap", "lost"


def check_identity(producer_id, producer_epoch) -> None:
    """Validate an explicit identity: ``producer_id`` in [2**62, 2**63), ``producer_epoch``
    in 0..32767 (both ints, not bools); ``ConfigError`` otherwise."""
    for name, value, low, high in (
        ("producer_id", producer_id, DERIVED_ID_MIN, (1 << 63) - 1),
        ("producer_epoch", producer_epoch, 0, MAX_EPOCH),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise errors.ConfigError(f"{name} must be an int in [{low}, {high}], got {value!r}")


class PartitionSequences:
    """One partition's identity and sequence state; see the module docstring."""

    __slots__ = (
        "producer_id", "epoch", "explicit", "next_sequence", "next_no", "outstanding",
        "acked", "acked_max_no", "last_failed", "renumber_pending",
    )  # fmt: skip

    def __init__(self, producer_id: int, epoch: int, explicit: bool) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.explicit = explicit
        self.next_sequence = 0
        self.next_no = 0
        self.outstanding: dict[int, Batch] = {}  # drain_no -> batch, in drain order
        self.acked = False  # a batch of this identity was acknowledged
        self.acked_max_no = -1
        self.last_failed = -1  # drain_no of the newest failed batch not proven stored
        self.renumber_pending = False

    def follows(self, prev: Batch, b: Batch) -> bool:
        """May ``b`` go right after ``prev`` in one request part (consecutive drain order)?"""
        if b.drain_no >= 0:
            return b.drain_no == prev.drain_no + 1
        return prev.drain_no == self.next_no - 1

    def assign(self, b: Batch) -> None:
        """Stamp a batch drained for the first time (or since ``renumber``) with this
        partition's identity and next sequence."""
        b.drain_no = self.next_no
        self.next_no += 1
        b.stamp(self.producer_id, self.epoch, self.next_sequence)
        self.next_sequence = (self.next_sequence + b.count) % SEQUENCE_MOD
        self.outstanding[b.drain_no] = b

    def _current(self, b: Batch) -> bool:
        return b.drain_no >= 0 and (b.producer_id, b.producer_epoch) == (self.producer_id, self.epoch)

    def acknowledged(self, b: Batch) -> None:
        """The broker stored ``b`` (written or a duplicate); also for a batch that had
        failed at its deadline meanwhile: the answer proves it stored."""
        if not self._current(b):
            return
        self.outstanding.pop(b.drain_no, None)
        self.acked = True
        self.acked_max_no = max(self.acked_max_no, b.drain_no)
        if self.last_failed < b.drain_no:
            self.last_failed = -1  # stored after it: the failed one was stored too

    def failed(self, b: Batch) -> None:
        """``b`` ended without an acknowledgement (expired, failed for good, closed)."""
        if not self._current(b):
            return
        self.outstanding.pop(b.drain_no, None)
        if b.drain_no > self.acked_max_no:
            self.last_failed = max(self.last_failed, b.drain_no)

    def classify(self, first: Batch) -> str:
        """What OUT_OF_ORDER_SEQUENCE for a part starting at ``first`` means: ``RETRY``,
        ``GAP`` or ``LOST`` (module docstring)."""
        if not self._current(first):
            return RETRY  # stamped before a renumbering: it is renumbered when requeued
        if next(iter(self.outstanding), first.drain_no) < first.drain_no:
            return RETRY
        if 0 <= self.last_failed < first.drain_no:
            return GAP
        return LOST

    def renumber(self, queued) -> None:
        """Continue under the next epoch from sequence 0: forget every sequence given out and
        clear those of ``queued`` (the partition's queue; nothing of it may be in flight),
        which are stamped afresh when drained.  Call only after a ``GAP`` or ``LOST`` part
        proved every outstanding batch unstored, and with an epoch below ``MAX_EPOCH``."""
        assert not self.explicit and self.epoch < MAX_EPOCH
        self.reset_identity(self.producer_id, self.epoch + 1, queued)

    def reset_identity(self, producer_id: int, epoch: int, queued) -> None:
        """Like ``renumber``, to the given identity (a fresh producer id past the last epoch)."""
        self.producer_id, self.epoch = producer_id, epoch
        self.next_sequence = 0
        self.outstanding.clear()
        self.acked = False
        self.acked_max_no = self.last_failed = -1
        self.renumber_pending = False
        for b in queued:
            if b.drain_no >= 0:
                b.drain_no = b.sequence = -1
                b.maybe_stored = False  # proven unstored: see renumber's condition
