"""One subscription on one partition led here: the delivery state machine.

``SubscriptionPartition`` reads the partition's log and pushes deliveries to the
consumers' sessions (session.py) while they have credit, in turns; its books are a
``Ledger`` (ledger.py): the cursor (cursor.py), the durable part — ``confirmed`` (every
offset below is settled) and the acked ranges above it — plus what only the leader keeps
in memory —

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

Bounds (ledger.py): in flight is bounded by the consumers' prefetch; acked ranges by
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
from sluice.broker.subscriptions.ledger import Ledger
from sluice.broker.subscriptions.retries import Retry
from sluice.broker.subscriptions.session import Session
from sluice.errors import BrokerError, NotLeader
from sluice.protocol import messages as m
from sluice.protocol.ranges import Pairs, RangeSet, first
from sluice.protocol.records import HIDDEN_BITS, iter_batches
from sluice.protocol.subscriptions import CursorState, SubscriptionConfig
from sluice.storage.log import OutOfRange

log = logging.getLogger("sluice.broker.subscriptions")

READ_BYTES = 1024 * 1024
PEEK_BYTES = 64 * 1024  # read with no consumer ready: only to pass what none would be handed
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
    ``PartitionSubscriptions`` (partition.py): the partition, persistence, dead letters;
    ``state`` the cursor record it was loaded from (or created with)."""

    def __init__(self, owner: Owner, state: CursorState) -> None:
        self.owner = owner
        self.part = owner.part
        self.name = state.name
        self.config: SubscriptionConfig = state.config
        self._ledger = Ledger(state, self.part.topic, self.part.index, self._dirty)
        self.sessions: list[Session] = []
        self._rr = 0
        self._stalled_logged = False
        self._wake = asyncio.Event()
        self._pump_task: asyncio.Task | None = None
        self.closed = False

    @property
    def cursor(self) -> Cursor:
        return self._ledger.cursor

    @property
    def next_read(self) -> int:
        return self._ledger.next_read

    @property
    def dead_lettered(self) -> int:
        return self._ledger.dead_lettered

    def state(self, full: bool = False) -> CursorState:
        """The record to write (``Ledger.state``)."""
        return self._ledger.state(full)

    def unwritten(self) -> None:
        """The record ``state()`` gave was not written: the next one holds every retry."""
        self._ledger.unwritten()

    def in_flight(self) -> int:
        return self._ledger.in_flight()

    def retrying(self) -> int:
        return self._ledger.retrying()

    def settle(self, req: m.AckPartition) -> None:
        """Apply a consumer's acks, nacks, touches and releases (see messages.AckPartition)."""
        self._ledger.settle(req, self.part.high_watermark)
        self.wake()

    # ------------------------------------------------------------------ state

    def info(self) -> m.SubscriptionPartitionInfo:
        ledger = self._ledger
        if ledger.next_read < self.part.log_start_offset:  # retention ran: count what it took now
            ledger.expire_below(self.part.log_start_offset)
            self.wake()  # keys released may let retries go
        hw = self.part.high_watermark
        settled_above = ledger.cursor.acked.count()
        return m.SubscriptionPartitionInfo(
            subscription=self.name, partition=self.part.index, config=self.config,
            confirmed=ledger.cursor.confirmed, next_read=ledger.next_read, high_watermark=hw,
            backlog=max(0, hw - ledger.cursor.confirmed - settled_above - self.owner.records_unsettled(ledger.cursor)),
            acked_ranges=len(ledger.cursor.acked),
            in_flight=ledger.in_flight(), retrying=ledger.retrying(), waiting=ledger.keys.waiting,
            dead_lettered=ledger.dead_lettered,
            expired=ledger.expired, consumers=len(self.sessions), stalled=ledger.stalled,
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
        self._ledger.out.clear()

    def attach(self, session: Session) -> None:
        if session not in self.sessions:
            self.sessions.append(session)
            session.parts[self.part.index] = self
        self.wake()

    def detach(self, session: Session) -> None:
        """The session's connection is gone: what it holds is redelivered at once."""
        if session in self.sessions:
            self.sessions.remove(session)
        self._ledger.give_back(session)
        self.wake()

    def seek(self, offset: int) -> None:
        """Everything from ``offset`` on is unsettled and undelivered; the rest settled."""
        self._ledger.seek(offset)
        self.wake()

    # ------------------------------------------------------------------ delivering

    async def _pump(self) -> None:
        """Deliver: due retries first, then new messages, while consumers have credit."""
        ledger = self._ledger
        part = self.part
        while not self.closed:
            self._wake.clear()
            now = time.monotonic()
            ledger.expire(now)
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
            nxt = ledger.next_retry()
            first = ledger.out.next_deadline()
            wake_at = ([] if first is None else [first]) + ([nxt.due] if nxt and nxt.due > now else [])
            timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
            if ledger.next_read >= part.high_watermark:
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
        reason = self._ledger.stalled
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

    async def _deliver_retries(self, now: float) -> None:
        ledger = self._ledger
        while not self.closed and (r := ledger.next_retry()) is not None:
            ranges = [p for a, b in r.ranges for p in ledger.cursor.unsettled(a, b)]
            if not ranges:
                ledger.retries.pop(r)
                for a, b in r.ranges:  # settled meanwhile (seek, retention): their keys go on
                    ledger.release_keys(a, b)
                continue
            if r.due > now:
                return
            if self.config.max_attempts and r.attempt >= self.config.max_attempts:
                ledger.retries.pop(r)
                self._dead_letter(ranges, r)
                continue
            if ledger.ordered_busy():
                return
            session = self._ready_session()
            if session is None:
                return
            ledger.retries.pop(r)
            await self._deliver_ranges(session, ranges, r.attempt + 1, r.reason)

    async def _deliver_ranges(self, session: Session, ranges: Pairs, attempt: int, reason: str) -> None:
        """Deliver the stored batches holding ``ranges`` to ``session``, as many messages as
        its credit takes; the rest wait as a retry due now, their attempt not counted."""
        ledger = self._ledger
        pending = RangeSet(ranges)
        deliveries, attachments = [], []
        seeks = ledger.seeks
        credit = session.prefetch - session.outstanding
        while pending and credit > 0:
            start = pending.starts[0]
            if start < self.part.log_start_offset:
                ledger.expire_below(self.part.log_start_offset)
                pending.remove(start, self.part.log_start_offset)
                continue
            data = (await self.part.read(start, READ_BYTES, self.part.high_watermark)).data
            if self.closed or ledger.seeks != seeks:
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
                    ledger.hand_out(session, h.base_offset, h.next_offset, mv, want, attempt, deliveries, attachments)
            if not moved:
                break
        self._push(session, deliveries, attachments)
        if pending and credit <= 0:  # the rest when there is credit again
            ledger.retry(pending.pairs(), attempt - 1, time.monotonic(), reason)
        elif pending:  # not readable now (a new leader below its high watermark): later
            ledger.retry(pending.pairs(), attempt - 1, time.monotonic() + DEAD_LETTER_RETRY_S, "not readable")

    async def _deliver_new(self) -> None:
        """Read on from ``next_read`` and hand out while a consumer has credit.  With or
        without one, it reads on past what it would not hand out: batches no reader sees
        and messages filtered out (settled as they pass; the hidden ones not written down
        on their own: a reload skips them again), restored retries, messages waiting
        behind their keys; it stops at the first message to hand out."""
        ledger = self._ledger
        part = self.part
        ordered = self.config.mode == "ordered"
        # ordered: a message waiting for its redelivery goes before anything new
        while not self.closed and not ledger.ordered_busy() and not (ordered and ledger.retries) and not ledger.stalled:
            hw = part.high_watermark
            if ledger.next_read < part.log_start_offset:
                ledger.expire_below(part.log_start_offset)
            if ledger.next_read >= hw:
                return
            session = self._ready_session()
            seeks = ledger.seeks
            try:
                data = (await part.read(ledger.next_read, READ_BYTES if session else PEEK_BYTES, hw)).data
            except OutOfRange:
                continue  # retention moved the log start: expire and read again
            if self.closed:
                return
            if ledger.seeks != seeks:
                # read from before a seek: taken from the new next_read, its batches would
                # settle (hidden ones) or hand out (the client acking what they lack)
                # everything from the seek's offset up to them
                continue
            deliveries, attachments = [], []
            out_of_credit = False
            try:
                for h, pos in iter_batches(data, check_crc=False):
                    lo, hi = ledger.next_read, h.next_offset
                    if hi <= lo:
                        continue
                    if h.attributes & HIDDEN_BITS or not h.records_count:
                        ledger.cursor.ack(lo, hi)
                        ledger.next_read = hi
                        continue
                    if ledger.ordered_busy():
                        return
                    credit = session.prefetch - session.outstanding if session is not None and session.ready else 0
                    want, ledger.next_read = ledger.select(data, h, pos, lo, hi, credit)
                    if want:
                        mv = memoryview(data)[pos:pos + h.size]
                        ledger.hand_out(session, h.base_offset, hi, mv, want, 1, deliveries, attachments)
                    if ledger.next_read < hi:  # the consumer's credit ended inside the batch
                        out_of_credit = True
                        break
                if ledger.restored:  # read past: those come as redeliveries only
                    ledger.restored.pop_below(ledger.next_read)
            finally:
                if session is not None:
                    self._push(session, deliveries, attachments)
            if out_of_credit and self._ready_session() is None:
                return  # woken when a consumer has credit again
            # else another consumer has credit: the one chosen filled up (while the read
            # ran, say, from another partition's deliveries), and only its own credit
            # coming back would have woken this pump

    def _push(self, session: Session, deliveries: list, attachments: list) -> None:
        if not deliveries:
            return
        deadline_ms = int(time.time() * 1000) + self.config.ack_timeout_ms
        msg = m.Deliver(
            topic=self.part.topic, subscription=self.name, partition=self.part.index,
            deliveries=deliveries, ack_deadline_ms=deadline_ms,
        )
        if not session.conn.push(m.Push.DELIVER, 1, msg, attachments):
            self._ledger.not_delivered(session, deliveries)  # gone: back at once
            self.detach(session)

    # ------------------------------------------------------------------ dead letters

    def _dead_letter(self, ranges: Pairs, r: Retry) -> None:
        n = self._ledger.dead_lettering_begins(ranges)
        task = asyncio.ensure_future(self._dead_letter_task(ranges, r, n))
        self.owner.track(task)

    async def _dead_letter_task(self, ranges: Pairs, r: Retry, n: int) -> None:
        seeks = self._ledger.seeks
        try:
            await self.owner.dead_letter(self, ranges, r.attempt, r.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - kept for another try: never acked unwritten
            log.warning(
                "cannot dead-letter %d message(s) of %s-%d for %s: %s; retrying",
                n, self.part.topic, self.part.index, self.name, exc,
            )
            self._ledger.retry(ranges, r.attempt, time.monotonic() + DEAD_LETTER_RETRY_S, r.reason)
            return
        finally:
            self._ledger.dead_lettering -= n
            self.wake()
        if self.closed or self._ledger.seeks != seeks:
            return  # a seek forgot these ranges meanwhile (the copies stay in the topic)
        self._ledger.dead_lettered_at(ranges, n)
