"""One subscription on one partition led here: the delivery state machine.

``Cursor`` (cursor.py): the durable part — ``confirmed`` (every offset below is
settled) and the acked ranges above it.  ``SubscriptionPartition``: the cursor plus
what only the leader keeps in memory —

- ``next_read``: the first offset not delivered yet (starts at ``confirmed`` after a load:
  what was in flight before a crash or a leader change is delivered again; ``catch_up``
  reads on from there, before any consumer, past what would not be handed out);
- units in flight (in_flight.py): stored batches delivered with the offsets of each that
  the delivery wants settled — batch bytes and offset ranges, no record decoded (but for
  tag filters and key-ordered mode: selection.py).  A unit wants no more offsets than its
  consumer has credit for (``prefetch``): a larger batch goes out in parts;
- retries (retries.py): offset ranges waiting for their redelivery time (a nack, a
  deadline passed, a consumer gone).  After ``max_attempts`` deliveries a range is
  dead-lettered (dead_letters.py writes the copies) and then acked.
  Ordered mode has one unit out at a time; a failure counts for the failed message only
  (the ones behind it were never handed to the application), the retry at the lowest
  offset goes first, and nothing new is read while any retry waits.

Batches no reader sees (half messages, control batches — the subscription records among
them) are settled as they are read, so ``confirmed`` passes them.

Bounds: in flight is bounded by the consumers' prefetch; acked ranges by
``MAX_ACKED_RANGES``: at the bound, no new message is read (``stalled`` says so in
describe) until acks below close gaps — ack state is never dropped.  Retries are offset
ranges, and every one is a gap in the acked ranges above ``confirmed``, so that bound
bounds them too (and ``MAX_RETRIES`` entries stall reading as well).  Every retry with an
attempt counted is journaled in the partition's log with the next cursor record
(protocol/subscriptions.py): a restart or a new leader redelivers it when due, with its
attempt count.  A full record (a snapshot) also holds the deliveries out, counted as
failed, since it replaces the journal of those that were retries.  In key-ordered mode a
restored retry parks its key again when the first read passes its offset.

Event loop only; reads go through ``Partition.read`` (off the loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from sluice.broker.subscriptions.cursor import Cursor
from sluice.broker.subscriptions.in_flight import InFlight, Unit
from sluice.broker.subscriptions.keys import KeyOrder
from sluice.broker.subscriptions.retries import Retries, Retry, failed_counts
from sluice.broker.subscriptions.selection import pick
from sluice.broker.subscriptions.session import Session
from sluice.errors import BrokerError, NotLeader
from sluice.protocol import messages as m
from sluice.protocol.ranges import Pairs, RangeSet, count, first
from sluice.protocol.records import HIDDEN_BITS, decode_batch, iter_batches
from sluice.protocol.subscriptions import CursorState, SubscriptionConfig
from sluice.storage.log import OutOfRange

log = logging.getLogger("sluice.broker.subscriptions")

READ_BYTES = 1024 * 1024
PEEK_BYTES = 64 * 1024  # read with no consumer ready: only to pass what none would be handed
MAX_ACKED_RANGES = 10_000
MAX_WAITING = 100_000  # key-ordered: messages held behind their keys before reading stops
MAX_RETRIES = 100_000  # pending redeliveries before reading stops
DEAD_LETTER_RETRY_S = 1.0  # after a failed dead-letter write


class Owner(Protocol):
    """What a ``SubscriptionPartition`` needs of the partition's subscriptions
    (``PartitionSubscriptions``, partition.py): the partition, the cursor records, the
    dead-letter copies, and a home for its background tasks."""

    part: object  # the Partition (broker/partition.py) led here

    def mark_dirty(self, sp: SubscriptionPartition) -> None:
        """``sp``'s state changed: write it with the next cursor record."""

    def records_unsettled(self, cursor: Cursor) -> int:
        """Subscription records above ``cursor.confirmed`` it has not passed (not messages)."""

    def track(self, task: asyncio.Task) -> None:
        """Cancel ``task`` when the partition's subscriptions close."""

    async def dead_letter(self, sp: SubscriptionPartition, ranges: Pairs, attempts: int, reason: str) -> None:
        """Copy the messages at ``ranges`` to ``sp``'s dead-letter topic; return once the
        copies are acknowledged by every in-sync replica (raise if they may not be)."""


class SubscriptionPartition:
    """See the module docstring.  ``owner`` (``Owner``) is the partition's
    ``PartitionSubscriptions`` (partition.py): the partition, persistence, dead letters."""

    def __init__(self, owner: Owner, state: CursorState) -> None:
        self.owner = owner
        self.part = owner.part
        self.name = state.name
        self.config: SubscriptionConfig = state.config
        self.cursor = Cursor(state.confirmed, state.acked)
        self.dead_lettered = state.dead_lettered
        self.expired = state.expired
        self.created_ms = state.created_ms
        self.next_read = self.cursor.confirmed
        self.sessions: list[Session] = []
        self._rr = 0
        self._out = InFlight()
        self._retries = Retries()
        self._dead_lettering = 0  # messages being copied to the dead-letter topic
        # offsets of retries read from the cursor record, above next_read: the first read
        # after a load passes them without delivering them as new messages
        self._restored = RangeSet()
        now_ms, mono = time.time() * 1000, time.monotonic()
        for a, b, attempt, due_ms in state.retries:
            ranges = self.cursor.unsettled(a, b)  # journal entries outlive their acks
            if not ranges:
                continue
            for x, y in ranges:
                self._restored.add(x, y)
            self._retries.restore(ranges, attempt, mono + max(0.0, due_ms - now_ms) / 1000)
        self._keys = KeyOrder()  # key-ordered mode: messages held behind their key's one out
        self._seeks = 0  # seeks so far: a read begun before one is stale when it returns
        self._stalled_logged = False
        self._wake = asyncio.Event()
        self._pump_task: asyncio.Task | None = None
        self.closed = False

    # ------------------------------------------------------------------ state

    def state(self, full: bool = False) -> CursorState:
        """The record to write: with every pending retry when ``full`` (or when the
        journal was lost), else with those scheduled since the last record."""
        unsettled = self.cursor.unsettled
        full = full or self._retries.journal_lost
        if full:
            now_ms, mono = time.time() * 1000, time.monotonic()
            entries = self._in_flight_entries(int(now_ms))
            entries += self._retries.all_entries(now_ms, mono)
        else:
            entries = self._retries.take_journal()
        return CursorState(
            name=self.name, config=self.config, confirmed=self.cursor.confirmed, acked=self.cursor.acked.pairs(),
            retries=[(x, y, n, due) for a, b, n, due in entries for x, y in unsettled(a, b)], full=full,
            dead_lettered=self.dead_lettered, expired=self.expired, created_ms=self.created_ms,
        )

    def _in_flight_entries(self, now_ms: int) -> list[tuple[int, int, int, int]]:
        """Journal entries of the deliveries out now, each counted as failed and due at
        once: what a broker that stops before they are settled leaves behind, as a consumer
        gone does (``_requeue``).  A full record replaces the journal, so without them a
        retry out at attempt N when it is written would come back after a crash as a new
        message, its count started again — and ``max_attempts`` would never be reached.
        Acks and later failures override them (the acked ranges and later entries)."""
        return [
            (a, b, n, now_ms)
            for u in self._out.units()
            for ranges, n in self._failed_counts(u.want.pairs(), u.attempt) if n > 0
            for a, b in ranges
        ]

    def unwritten(self) -> None:
        """The record ``state()`` gave was not written: the next one holds every retry."""
        self._retries.lose_journal()

    def in_flight(self) -> int:
        return self._out.count()

    def retrying(self) -> int:
        unsettled = self.cursor.unsettled
        return sum(count(unsettled(a, b)) for r in self._retries for a, b in r.ranges) + self._dead_lettering

    @property
    def stalled(self) -> str:
        if len(self.cursor.acked) >= MAX_ACKED_RANGES:
            return f"ack state full: {len(self.cursor.acked)} acked ranges above offset {self.cursor.confirmed}"
        if self._keys.waiting >= MAX_WAITING:
            return f"{self._keys.waiting} messages wait behind their keys"
        if len(self._retries) >= MAX_RETRIES:
            return f"{len(self._retries)} redeliveries pending"
        return ""

    def info(self) -> m.SubscriptionPartitionInfo:
        if self.next_read < self.part.log_start_offset:  # retention ran: count what it took now
            self._expire_below(self.part.log_start_offset)
            self.wake()  # keys released may let retries go
        hw = self.part.high_watermark
        settled_above = self.cursor.acked.count()
        return m.SubscriptionPartitionInfo(
            subscription=self.name, partition=self.part.index, config=self.config,
            confirmed=self.cursor.confirmed, next_read=self.next_read, high_watermark=hw,
            backlog=max(0, hw - self.cursor.confirmed - settled_above - self.owner.records_unsettled(self.cursor)),
            acked_ranges=len(self.cursor.acked),
            in_flight=self.in_flight(), retrying=self.retrying(), waiting=self._keys.waiting,
            dead_lettered=self.dead_lettered,
            expired=self.expired, consumers=len(self.sessions), stalled=self.stalled,
        )

    def _dirty(self) -> None:
        self.owner.mark_dirty(self)

    # ------------------------------------------------------------------ lifecycle

    async def catch_up(self) -> None:
        """After a load, before anyone is answered: read on past what would not be handed
        out (``_deliver_new`` with no consumer) — so that describe tells what it told
        before: keys of restored retries parked again, their messages waiting.  A read
        that fails is left to the pump."""
        try:
            await self._deliver_new()
        except Exception as exc:  # noqa: BLE001 - the pump reads again
            log.warning("reading %s of %s-%d after its load failed: %s", self.name, self.part.topic, self.part.index, exc)

    def start(self) -> None:
        if self._pump_task is None and not self.closed:
            self._pump_task = asyncio.get_running_loop().create_task(
                self._pump(), name=f"subscription {self.name} {self.part.topic}-{self.part.index}"
            )

    def wake(self) -> None:
        self._wake.set()

    def close(self, exc: BrokerError | None) -> None:
        """Stop delivering (leadership lost, deleted, broker stopping); sessions are told."""
        self.closed = True
        if self._pump_task is not None:
            self._pump_task.cancel()
        for s in self.sessions:
            s.end(self.part.index, exc)
        self.sessions.clear()
        self._out.clear()

    def attach(self, session: Session) -> None:
        if session not in self.sessions:
            self.sessions.append(session)
            session.parts[self.part.index] = self
        self.wake()

    def detach(self, session: Session) -> None:
        """The session's connection is gone: what it holds is redelivered at once."""
        if session in self.sessions:
            self.sessions.remove(session)
        now = time.monotonic()
        for unit in [u for u in self._out.units() if u.session is session]:
            self._out.drop(unit)
            self._requeue(unit.want.pairs(), unit.attempt, now, "consumer disconnected")
        self.wake()

    def seek(self, offset: int) -> None:
        """Everything from ``offset`` on is unsettled and undelivered; the rest settled."""
        for u in self._out.units():
            u.session.credit_freed(u.want.count())
        self._out.clear()
        self._retries.clear()  # the seek's record holds every retry: none
        self._keys.clear()
        self._restored = RangeSet()
        self.cursor.reset(offset)
        self.next_read = offset
        self._seeks += 1
        self._dirty()
        self.wake()

    # ------------------------------------------------------------------ settling

    def settle(self, req: m.AckPartition) -> None:
        """Apply a consumer's acks, nacks, touches and releases (see messages.AckPartition)."""
        now = time.monotonic()
        lo, hi = self.cursor.confirmed, self.next_read
        # an ack counts for any stored offset: after a restart or a leader change the acks
        # of what the old leader delivered arrive before the new one has read that far
        stored = self.part.high_watermark
        for a, b in req.acks:
            a, b = max(a, lo), min(b, stored)
            if a >= b:
                continue
            if self.cursor.ack(a, b):
                self._dirty()
                self._release_keys(a, b)
            for unit in self._out.overlapping(a, b):
                n = unit.want.remove(a, b)
                if n:
                    unit.session.credit_freed(n)
                    if not unit.want:
                        self._out.drop(unit)
        delay = req.nack_delay_ms
        for pairs, counted in ((req.nacks, True), (req.releases, False)):
            for a, b in pairs:
                for unit in self._out.overlapping(max(a, lo), min(b, hi)):
                    if not counted:
                        # a consumer hands messages back as it shuts down: given back to it
                        # now, they would count as an attempt once its connection goes
                        unit.session.draining = True
                    taken = self._take(unit, a, b)
                    if not taken:
                        continue
                    reason = req.reason or ("nacked" if counted else "released")
                    if not counted:
                        self._retry(taken, unit.attempt - 1, now, reason)
                        continue
                    if delay >= 0:
                        due = now + delay / 1000
                    else:
                        due = now + self.config.backoff_ms(unit.attempt) / 1000
                    self._requeue(taken, unit.attempt, due, reason, failed=(a, b))
        for a, b in req.touches:
            for unit in self._out.overlapping(a, b):
                self._out.touch(unit, now + self.config.ack_timeout_ms / 1000)
        self.wake()

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
            self._out.drop(unit)
        return taken

    def _requeue(
        self, ranges: Pairs, attempt: int, due: float, reason: str, failed: tuple[int, int] | None = None
    ) -> None:
        """Retry ``ranges`` of a delivery that failed at ``attempt`` (``_failed_counts``) at
        ``due``; those whose last attempt it was are due now: dead-lettered with no backoff
        (an ordered partition would wait one for nothing)."""
        last = self.config.max_attempts
        for part, n in self._failed_counts(ranges, attempt, failed):
            self._retry(part, n, min(due, time.monotonic()) if last and n >= last else due, reason)

    def _failed_counts(self, ranges: Pairs, attempt: int, failed: tuple[int, int] | None = None):
        return failed_counts(ranges, attempt, self.config.mode == "ordered", failed)

    def _retry(self, ranges: Pairs, attempt: int, due: float, reason: str) -> None:
        if self._retries.schedule(ranges, attempt, due, reason):
            self._dirty()  # journaled: attempt counts and due times survive a restart

    def _expire(self, now: float) -> None:
        """Units past their deadline go back for redelivery after the backoff."""
        for unit in self._out.expired(now):
            n = unit.want.count()
            unit.session.credit_freed(n)
            due = now + self.config.backoff_ms(unit.attempt) / 1000
            self._requeue(unit.want.pairs(), unit.attempt, due, "ack timeout")

    # ------------------------------------------------------------------ delivering

    async def _pump(self) -> None:
        """Deliver: due retries first, then new messages, while consumers have credit."""
        part = self.part
        while not self.closed:
            self._wake.clear()
            now = time.monotonic()
            self._expire(now)
            try:
                await self._deliver_retries(now)
                await self._deliver_new()
                self._note_stall()
            except asyncio.CancelledError:
                raise
            except NotLeader:
                return  # the owner closes this on the leadership change
            except Exception:  # noqa: BLE001 - a read error (disk): try again shortly
                log.exception("delivering %s on %s-%d failed; retrying", self.name, part.topic, part.index)
                await asyncio.sleep(0.5)
                continue
            # a retry due already waits for credit or for the one out before it (ordered):
            # a settle, freed credit or a new consumer wakes this, not a timer
            nxt = self._next_retry()
            first = self._out.next_deadline()
            wake_at = ([] if first is None else [first]) + ([nxt.due] if nxt and nxt.due > now else [])
            timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
            if self.next_read >= part.high_watermark:
                part.add_waiter(self._wake.set)
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
            finally:
                part.remove_waiter(self._wake.set)

    def _note_stall(self) -> None:
        """Log when reading stops at a bound, and when it goes on (describe's ``stalled``
        says the same)."""
        reason = self.stalled
        if bool(reason) != self._stalled_logged:
            self._stalled_logged = bool(reason)
            where = f"subscription {self.name} of {self.part.topic}-{self.part.index}"
            if reason:
                log.warning("%s reads no new message until acks close gaps: %s", where, reason)
            else:
                log.info("%s reads new messages again", where)

    def _ready_session(self) -> Session | None:
        sessions = self.sessions
        for i in range(len(sessions)):
            s = sessions[(self._rr + i) % len(sessions)]
            if s.ready:
                self._rr = (self._rr + i + 1) % len(sessions)
                return s
        for s in sessions:
            if not s.closed and s.conn.writable is False:
                s.conn.on_writable(self.wake)
        return None

    def _ordered_busy(self) -> bool:
        """Ordered mode: a message is out (in flight, or being dead-lettered): nothing
        behind it goes until it is settled."""
        return self.config.mode == "ordered" and (bool(self._out) or self._dead_lettering > 0)

    def _next_retry(self) -> Retry | None:
        return self._retries.next(self.config.mode == "ordered")

    async def _deliver_retries(self, now: float) -> None:
        while not self.closed and (r := self._next_retry()) is not None:
            ranges = [p for a, b in r.ranges for p in self.cursor.unsettled(a, b)]
            if not ranges:
                self._retries.pop(r)
                for a, b in r.ranges:  # settled meanwhile (seek, retention): their keys go on
                    self._release_keys(a, b)
                continue
            if r.due > now:
                return
            if self.config.max_attempts and r.attempt >= self.config.max_attempts:
                self._retries.pop(r)
                self._dead_letter(ranges, r)
                continue
            if self._ordered_busy():
                return
            session = self._ready_session()
            if session is None:
                return
            self._retries.pop(r)
            await self._deliver_ranges(session, ranges, r.attempt + 1, r.reason)

    async def _deliver_ranges(self, session: Session, ranges: Pairs, attempt: int, reason: str) -> None:
        """Deliver the stored batches holding ``ranges`` to ``session``, as many messages as
        its credit takes; the rest wait as a retry due now, their attempt not counted."""
        pending = RangeSet(ranges)
        deliveries, attachments = [], []
        seeks = self._seeks
        credit = session.prefetch - session.outstanding
        while pending and credit > 0:
            start = pending.starts[0]
            if start < self.part.log_start_offset:
                self._expire_below(self.part.log_start_offset)
                pending.remove(start, self.part.log_start_offset)
                continue
            data = (await self.part.read(start, READ_BYTES, self.part.high_watermark)).data
            if self.closed or self._seeks != seeks:
                return  # a seek forgot these ranges (and what was handed out of them) meanwhile
            moved = False
            for h, pos in iter_batches(data, check_crc=False):
                if h.next_offset <= start:
                    continue
                if credit <= 0:
                    break
                want = RangeSet(first(pending.overlap(h.base_offset, h.next_offset), credit))
                pending.remove(h.base_offset, want.ends[-1] if want else h.next_offset)
                moved = True
                if want:
                    credit -= want.count()
                    mv = memoryview(data)[pos:pos + h.size]
                    self._hand_out(session, h.base_offset, h.next_offset, mv, want, attempt, deliveries, attachments)
            if not moved:
                break
        self._push(session, deliveries, attachments)
        if pending and credit <= 0:  # the rest when there is credit again
            self._retry(pending.pairs(), attempt - 1, time.monotonic(), reason)
        elif pending:  # not readable now (a new leader below its high watermark): later
            self._retry(pending.pairs(), attempt - 1, time.monotonic() + DEAD_LETTER_RETRY_S, "not readable")

    async def _deliver_new(self) -> None:
        """Read on from ``next_read`` and hand out while a consumer has credit.  With or
        without one, it reads on past what it would not hand out: batches no reader sees
        and messages filtered out (settled as they pass; the hidden ones not written down
        on their own: a reload skips them again), restored retries, messages waiting
        behind their keys; it stops at the first message to hand out."""
        part = self.part
        ordered = self.config.mode == "ordered"
        # ordered: a message waiting for its redelivery goes before anything new
        while not self.closed and not self._ordered_busy() and not (ordered and self._retries) and not self.stalled:
            hw = part.high_watermark
            if self.next_read < part.log_start_offset:
                self._expire_below(part.log_start_offset)
            if self.next_read >= hw:
                return
            session = self._ready_session()
            seeks = self._seeks
            try:
                data = (await part.read(self.next_read, READ_BYTES if session else PEEK_BYTES, hw)).data
            except OutOfRange:
                continue  # retention moved the log start: expire and read again
            if self.closed:
                return
            if self._seeks != seeks:
                # read from before a seek: taken from the new next_read, its batches would
                # settle (hidden ones) or hand out (the client acking what they lack)
                # everything from the seek's offset up to them
                continue
            deliveries, attachments = [], []
            out_of_credit = False
            try:
                for h, pos in iter_batches(data, check_crc=False):
                    lo, hi = self.next_read, h.next_offset
                    if hi <= lo:
                        continue
                    if h.attributes & HIDDEN_BITS or not h.records_count:
                        self.cursor.ack(lo, hi)
                        self.next_read = hi
                        continue
                    if self._ordered_busy():
                        return
                    credit = session.prefetch - session.outstanding if session is not None and session.ready else 0
                    want, self.next_read = self._select(data, h, pos, lo, hi, credit)
                    if want:
                        mv = memoryview(data)[pos:pos + h.size]
                        self._hand_out(session, h.base_offset, hi, mv, want, 1, deliveries, attachments)
                    if self.next_read < hi:  # the consumer's credit ended inside the batch
                        out_of_credit = True
                        break
                if self._restored:  # read past: those come as redeliveries only
                    self._restored.pop_below(self.next_read)
            finally:
                if session is not None:
                    self._push(session, deliveries, attachments)
            if out_of_credit and self._ready_session() is None:
                return  # woken when a consumer has credit again
            # else another consumer has credit: the one chosen filled up (while the read
            # ran, say, from another partition's deliveries), and only its own credit
            # coming back would have woken this pump

    def _select(self, data, h, pos: int, lo: int, hi: int, limit: int) -> tuple[RangeSet, int]:
        """The offsets of the batch from ``lo`` to deliver now, at most ``limit`` (0: none,
        no consumer has credit), and the offset to read on from: ``hi``, or the first one
        to deliver past the limit.  Only with a tag filter or in key-ordered mode are its
        records decoded (selection.py): filtered ones are settled, and a key's messages
        behind one already out wait for it (``_release_keys``)."""
        want = RangeSet(self.cursor.unsettled(lo, hi))
        restored = RangeSet()  # waiting for their redelivery, with their attempt counts
        if self._restored:
            for a, b in self._restored.overlap(lo, hi):
                want.remove(a, b)
                for x, y in self.cursor.unsettled(a, b):
                    restored.add(x, y)
        cfg = self.config
        keyed = cfg.mode == "key-ordered"
        if not (want or (keyed and restored)) or not (cfg.tags or keyed):
            taken = first(want.pairs(), limit)
            return RangeSet(taken), (hi if want.count() <= limit else taken[-1][1] if taken else want.starts[0])
        records = decode_batch(data, h, pos, self.part.topic, self.part.index)
        chosen, stop = pick(records, lo, hi, want, restored, limit, set(cfg.tags), self._keys if keyed else None)
        for a, b in want.pairs():  # filtered out (or compacted away): settled
            for x, y in chosen.missing(a, b):
                if self.cursor.ack(x, y):
                    self._dirty()
        return chosen, stop

    def _release_keys(self, a: int, b: int) -> None:
        """Offsets in ``[a, b)`` were settled: their keys' next messages go out."""
        released = self._keys.release(a, b)
        now = time.monotonic() if released else 0.0
        for nxt in released:
            self._retry([(nxt, nxt + 1)], 0, now, "")

    def _hand_out(self, session, base, end, mv, want, attempt, deliveries, attachments) -> None:
        deadline = time.monotonic() + self.config.ack_timeout_ms / 1000
        unit = Unit(base, end, mv, want, attempt, session, deadline)
        self._out.add(unit)
        session.outstanding += want.count()
        deliveries.append(m.Delivery(base_offset=base, size=len(mv), attempt=attempt, want=want.pairs()))
        attachments.append(mv)

    def _push(self, session: Session, deliveries: list, attachments: list) -> None:
        if not deliveries:
            return
        deadline_ms = int(time.time() * 1000) + self.config.ack_timeout_ms
        msg = m.Deliver(
            topic=self.part.topic, subscription=self.name, partition=self.part.index,
            deliveries=deliveries, ack_deadline_ms=deadline_ms,
        )
        if not session.conn.push(m.Push.DELIVER, 1, msg, attachments):
            # gone: what was just handed out goes back at once, the attempt not counted
            now = time.monotonic()
            for d in deliveries:
                for u in self._out.of_batch(d.base_offset):
                    if u.session is session and u.attempt == d.attempt:
                        self._out.drop(u)
                        self._retry(u.want.pairs(), u.attempt - 1, now, "not delivered")
            self.detach(session)

    def _expire_below(self, start: int) -> None:
        """Retention deleted the log below ``start``: unsettled messages there are gone.
        Counted (``expired``) and logged, never silently dropped from the books."""
        if self.cursor.confirmed >= start:
            self.next_read = max(self.next_read, start)
            return
        lost = count(self.cursor.unsettled(self.cursor.confirmed, start))
        self.expired += lost
        log.warning(
            "subscription %s of %s-%d: %d unacked message(s) below offset %d were deleted by retention",
            self.name, self.part.topic, self.part.index, lost, start,
        )
        below = self.cursor.confirmed
        self.cursor.ack(below, start)
        self._release_keys(below, start)
        self.next_read = max(self.next_read, start)
        self._dirty()

    # ------------------------------------------------------------------ dead letters

    def _dead_letter(self, ranges: Pairs, r: Retry) -> None:
        n = count(ranges)
        self._dead_lettering += n
        task = asyncio.ensure_future(self._dead_letter_task(ranges, r, n))
        self.owner.track(task)

    async def _dead_letter_task(self, ranges: Pairs, r: Retry, n: int) -> None:
        seeks = self._seeks
        try:
            await self.owner.dead_letter(self, ranges, r.attempt, r.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - kept for another try: never acked unwritten
            log.warning(
                "cannot dead-letter %d message(s) of %s-%d for %s: %s; retrying",
                n, self.part.topic, self.part.index, self.name, exc,
            )
            self._retry(ranges, r.attempt, time.monotonic() + DEAD_LETTER_RETRY_S, r.reason)
            return
        finally:
            self._dead_lettering -= n
            self.wake()
        if self.closed or self._seeks != seeks:
            return  # a seek forgot these ranges meanwhile (the copies stay in the topic)
        for a, b in ranges:
            self.cursor.ack(a, b)
            self._release_keys(a, b)
        self.dead_lettered += n
        self._dirty()
