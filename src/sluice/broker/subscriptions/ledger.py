"""The books of one subscription on one partition: what is settled, out, retried, held.

``Ledger`` keeps the state the delivery (delivery.py) decides on and the cursor record is
written from: the cursor (cursor.py: ``confirmed`` and the acked ranges above it),
``next_read``, the units in flight (in_flight.py), the retries (retries.py), the keys of
key-ordered mode (keys.py), the restored retries the first read passes, and the counts
(``dead_lettered``, ``expired``).  It applies consumers' settlements, expires deadlines,
schedules retries and hands units out; it reads no log, pushes nothing and starts no task
— the delivery does (``SubscriptionPartition``).  Every change that the next cursor
record must hold calls ``on_change``.  The bounds are the delivery's (module docstring of
delivery.py): ``MAX_ACKED_RANGES``, ``MAX_WAITING``, ``MAX_RETRIES``.

Event loop only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sluice.broker.subscriptions.cursor import Cursor
from sluice.broker.subscriptions.in_flight import InFlight, Unit
from sluice.broker.subscriptions.keys import KeyOrder
from sluice.broker.subscriptions.retries import Retries, Retry, failed_counts
from sluice.broker.subscriptions.selection import pick
from sluice.broker.subscriptions.session import Session
from sluice.protocol import messages as m
from sluice.protocol.ranges import Pairs, RangeSet, count, first
from sluice.protocol.records import decode_batch
from sluice.protocol.subscriptions import CursorState

log = logging.getLogger("sluice.broker.subscriptions")

MAX_ACKED_RANGES = 10_000
MAX_WAITING = 100_000  # key-ordered: messages held behind their keys before reading stops
MAX_RETRIES = 100_000  # pending redeliveries before reading stops


class Ledger:
    """The books of subscription ``state.name`` on partition ``index`` of ``topic``, loaded
    from its cursor record ``state``; ``on_change()``: write them with the next record."""

    def __init__(self, state: CursorState, topic: str, index: int, on_change: Callable[[], None]) -> None:
        self.topic = topic
        self.index = index
        self._changed = on_change
        self.name = state.name
        self.config = state.config
        self.created_ms = state.created_ms
        self.cursor = Cursor(state.confirmed, state.acked)
        self.dead_lettered = state.dead_lettered
        self.expired = state.expired
        self.next_read = self.cursor.confirmed
        self.out = InFlight()
        self.retries = Retries()
        self.dead_lettering = 0  # messages being copied to the dead-letter topic
        # offsets of retries read from the cursor record, above next_read: the first read
        # after a load passes them without delivering them as new messages
        self.restored = RangeSet()
        now_ms, mono = time.time() * 1000, time.monotonic()
        for a, b, attempt, due_ms in state.retries:
            ranges = self.cursor.unsettled(a, b)  # journal entries outlive their acks
            if not ranges:
                continue
            for x, y in ranges:
                self.restored.add(x, y)
            self.retries.restore(ranges, attempt, mono + max(0.0, due_ms - now_ms) / 1000)
        self.keys = KeyOrder()  # key-ordered mode: messages held behind their key's one out
        self.seeks = 0  # seeks so far: a read begun before one is stale when it returns

    def state(self, full: bool = False) -> CursorState:
        """The record to write: with every pending retry when ``full`` (or when the
        journal was lost), else with those scheduled since the last record."""
        unsettled = self.cursor.unsettled
        full = full or self.retries.journal_lost
        if full:
            now_ms, mono = time.time() * 1000, time.monotonic()
            entries = self._in_flight_entries(int(now_ms))
            entries += self.retries.all_entries(now_ms, mono)
        else:
            entries = self.retries.take_journal()
        return CursorState(
            name=self.name, config=self.config, confirmed=self.cursor.confirmed, acked=self.cursor.acked.pairs(),
            retries=[(x, y, n, due) for a, b, n, due in entries for x, y in unsettled(a, b)], full=full,
            dead_lettered=self.dead_lettered, expired=self.expired, created_ms=self.created_ms,
        )

    def _in_flight_entries(self, now_ms: int) -> list[tuple[int, int, int, int]]:
        """Journal entries of the deliveries out now, each counted as failed and due at
        once: what a broker that stops before they are settled leaves behind, as a consumer
        gone does (``give_back``).  A full record replaces the journal, so without them a
        retry out at attempt N when it is written would come back after a crash as a new
        message, its count started again — and ``max_attempts`` would never be reached.
        Acks and later failures override them (the acked ranges and later entries)."""
        return [
            (a, b, n, now_ms)
            for u in self.out.units()
            for ranges, n in self._failed_counts(u.want.pairs(), u.attempt) if n > 0
            for a, b in ranges
        ]

    def unwritten(self) -> None:
        """The record ``state()`` gave was not written: the next one holds every retry."""
        self.retries.lose_journal()

    def in_flight(self) -> int:
        return self.out.count()

    def retrying(self) -> int:
        unsettled = self.cursor.unsettled
        return sum(count(unsettled(a, b)) for r in self.retries for a, b in r.ranges) + self.dead_lettering

    @property
    def stalled(self) -> str:
        if len(self.cursor.acked) >= MAX_ACKED_RANGES:
            return f"ack state full: {len(self.cursor.acked)} acked ranges above offset {self.cursor.confirmed}"
        if self.keys.waiting >= MAX_WAITING:
            return f"{self.keys.waiting} messages wait behind their keys"
        if len(self.retries) >= MAX_RETRIES:
            return f"{len(self.retries)} redeliveries pending"
        return ""

    def settle(self, req: m.AckPartition, stored: int) -> None:
        """Apply a consumer's acks, nacks, touches and releases (see messages.AckPartition);
        ``stored``: the partition's high watermark."""
        now = time.monotonic()
        lo, hi = self.cursor.confirmed, self.next_read
        # an ack counts for any stored offset (``stored``): after a restart or a leader change
        # the acks of what the old leader delivered arrive before the new one has read that far
        for a, b in req.acks:
            a, b = max(a, lo), min(b, stored)
            if a >= b:
                continue
            if self.cursor.ack(a, b):
                self._changed()
                self.release_keys(a, b)
            for unit in self.out.overlapping(a, b):
                n = unit.want.remove(a, b)
                if n:
                    unit.session.credit_freed(n)
                    if not unit.want:
                        self.out.drop(unit)
        delay = req.nack_delay_ms
        for pairs, counted in ((req.nacks, True), (req.releases, False)):
            for a, b in pairs:
                for unit in self.out.overlapping(max(a, lo), min(b, hi)):
                    if not counted:
                        # a consumer hands messages back as it shuts down: given back to it
                        # now, they would count as an attempt once its connection goes
                        unit.session.draining = True
                    taken = self._take(unit, a, b)
                    if not taken:
                        continue
                    reason = req.reason or ("nacked" if counted else "released")
                    if not counted:
                        self.retry(taken, unit.attempt - 1, now, reason)
                        continue
                    if delay >= 0:
                        due = now + delay / 1000
                    else:
                        due = now + self.config.backoff_ms(unit.attempt) / 1000
                    self.requeue(taken, unit.attempt, due, reason, failed=(a, b))
        for a, b in req.touches:
            for unit in self.out.overlapping(a, b):
                self.out.touch(unit, now + self.config.ack_timeout_ms / 1000)

    def _take(self, unit: Unit, a: int, b: int) -> Pairs:
        """Take ``[a, b)`` out of a unit for a retry; ordered mode takes everything of the
        unit from ``a`` on (the messages after a failed one wait for it)."""
        if self.config.mode == "ordered":
            b = unit.end
        taken = unit.want.overlap(a, b)
        n = sum(y - x for x, y in taken)
        if not n:
            return []
        for x, y in taken:
            unit.want.remove(x, y)
        unit.session.credit_freed(n)
        if not unit.want:
            self.out.drop(unit)
        return taken

    def requeue(
        self, ranges: Pairs, attempt: int, due: float, reason: str, failed: tuple[int, int] | None = None
    ) -> None:
        """Retry ``ranges`` of a delivery that failed at ``attempt`` (``failed_counts``, retries.py) at
        ``due``; those whose last attempt it was are due now: dead-lettered with no backoff
        (an ordered partition would wait one for nothing)."""
        last = self.config.max_attempts
        for part, n in self._failed_counts(ranges, attempt, failed):
            self.retry(part, n, min(due, time.monotonic()) if last and n >= last else due, reason)

    def _failed_counts(self, ranges: Pairs, attempt: int, failed: tuple[int, int] | None = None):
        return failed_counts(ranges, attempt, self.config.mode == "ordered", failed)

    def retry(self, ranges: Pairs, attempt: int, due: float, reason: str) -> None:
        if self.retries.schedule(ranges, attempt, due, reason):
            self._changed()  # journaled: attempt counts and due times survive a restart

    def expire(self, now: float) -> None:
        """Units past their deadline go back for redelivery after the backoff."""
        for unit in self.out.expired(now):
            n = unit.want.count()
            unit.session.credit_freed(n)
            due = now + self.config.backoff_ms(unit.attempt) / 1000
            self.requeue(unit.want.pairs(), unit.attempt, due, "ack timeout")

    def ordered_busy(self) -> bool:
        """Ordered mode: a message is out (in flight, or being dead-lettered): nothing
        behind it goes until it is settled."""
        return self.config.mode == "ordered" and (bool(self.out) or self.dead_lettering > 0)

    def next_retry(self) -> Retry | None:
        return self.retries.next(self.config.mode == "ordered")

    def select(self, data, h, pos: int, lo: int, hi: int, limit: int) -> tuple[RangeSet, int]:
        """The offsets of the batch from ``lo`` to deliver now, at most ``limit`` (0: none,
        no consumer has credit), and the offset to read on from: ``hi``, or the first one
        to deliver past the limit.  Only with a tag filter or in key-ordered mode are its
        records decoded (selection.py): filtered ones are settled, and a key's messages
        behind one already out wait for it (``release_keys``)."""
        want = RangeSet(self.cursor.unsettled(lo, hi))
        restored = RangeSet()  # waiting for their redelivery, with their attempt counts
        if self.restored:
            for a, b in self.restored.overlap(lo, hi):
                want.remove(a, b)
                for x, y in self.cursor.unsettled(a, b):
                    restored.add(x, y)
        cfg = self.config
        keyed = cfg.mode == "key-ordered"
        if not (want or (keyed and restored)) or not (cfg.tags or keyed):
            taken = first(want.pairs(), limit)
            return RangeSet(taken), (hi if want.count() <= limit else taken[-1][1] if taken else want.starts[0])
        records = decode_batch(data, h, pos, self.topic, self.index)
        chosen, stop = pick(records, lo, hi, want, restored, limit, set(cfg.tags), self.keys if keyed else None)
        for a, b in want.pairs():  # filtered out (or compacted away): settled
            for x, y in chosen.missing(a, b):
                if self.cursor.ack(x, y):
                    self._changed()
        return chosen, stop

    def release_keys(self, a: int, b: int) -> None:
        """Offsets in ``[a, b)`` were settled: their keys' next messages go out."""
        released = self.keys.release(a, b)
        now = time.monotonic() if released else 0.0
        for nxt in released:
            self.retry([(nxt, nxt + 1)], 0, now, "")

    def hand_out(self, session, base, end, mv, want, attempt, deliveries, attachments) -> None:
        deadline = time.monotonic() + self.config.ack_timeout_ms / 1000
        unit = Unit(base, end, mv, want, attempt, session, deadline)
        self.out.add(unit)
        session.outstanding += want.count()
        deliveries.append(m.Delivery(base_offset=base, size=len(mv), attempt=attempt, want=want.pairs()))
        attachments.append(mv)

    def expire_below(self, start: int) -> None:
        """Retention deleted the log below ``start``: unsettled messages there are gone.
        Counted (``expired``) and logged, never silently dropped from the books."""
        if self.cursor.confirmed >= start:
            self.next_read = max(self.next_read, start)
            return
        lost = count(self.cursor.unsettled(self.cursor.confirmed, start))
        self.expired += lost
        log.warning(
            "subscription %s of %s-%d: %d unacked message(s) below offset %d were deleted by retention",
            self.name, self.topic, self.index, lost, start,
        )
        below = self.cursor.confirmed
        self.cursor.ack(below, start)
        self.release_keys(below, start)
        self.next_read = max(self.next_read, start)
        self._changed()


    def seek(self, offset: int) -> None:
        """Everything from ``offset`` on is unsettled and undelivered; the rest settled."""
        for u in self.out.units():
            u.session.credit_freed(u.want.count())
        self.out.clear()
        self.retries.clear()  # the seek's record holds every retry: none
        self.keys.clear()
        self.restored = RangeSet()
        self.cursor.reset(offset)
        self.next_read = offset
        self.seeks += 1
        self._changed()

    def give_back(self, session: Session) -> None:
        """``session``'s connection is gone: what it holds is due again at once."""
        now = time.monotonic()
        for unit in [u for u in self.out.units() if u.session is session]:
            self.out.drop(unit)
            self.requeue(unit.want.pairs(), unit.attempt, now, "consumer disconnected")

    def not_delivered(self, session: Session, deliveries: list[m.Delivery]) -> None:
        """``deliveries`` just handed out to ``session`` could not be pushed: they go back
        at once, the attempt not counted."""
        now = time.monotonic()
        for d in deliveries:
            for u in self.out.of_batch(d.base_offset):
                if u.session is session and u.attempt == d.attempt:
                    self.out.drop(u)
                    self.retry(u.want.pairs(), u.attempt - 1, now, "not delivered")

    def dead_lettering_begins(self, ranges: Pairs) -> int:
        """``ranges`` are being copied to the dead-letter topic; returns how many messages."""
        n = count(ranges)
        self.dead_lettering += n
        return n

    def dead_lettered_at(self, ranges: Pairs, n: int) -> None:
        """The ``n`` messages at ``ranges`` are in the dead-letter topic: settled."""
        for a, b in ranges:
            self.cursor.ack(a, b)
            self.release_keys(a, b)
        self.dead_lettered += n
        self._changed()
