"""The subscriptions of one partition this broker leads (``PartitionSubscriptions``).

It loads them when first asked (a scan of the log from the newest snapshot on, off the
event loop: store.py), delivers from its own log (one ``SubscriptionPartition`` per
subscription, delivery.py), and appends the subscriptions whose state changed every
``FLUSH_S`` in one control batch (acks are group-committed: a crash loses at most the acks
of the last ``FLUSH_S`` and the write, which means those messages are delivered again —
never lost).  What a load cannot read from the records (the read position, key-ordered
messages waiting behind a retry) it rebuilds by reading the log before answering anyone
(``SubscriptionPartition.catch_up``), so describe tells the same before and after a
restart.  Creations, deletions and seeks are written before they are answered.  When
leadership moves, the old leader ends its consumers' subscriptions (SUBSCRIPTION_ENDED:
NOT_LEADER) and the new leader reads the state from its own copy of the log.

Concurrency: event loop only; scans and reads run in the read executor it is given.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sluice.broker.subscriptions.dead_letters import DeadLetters
from sluice.broker.subscriptions.delivery import SubscriptionPartition
from sluice.broker.subscriptions.store import (
    EMPTY_SNAPSHOT_BYTES,
    FLUSH_S,
    SNAPSHOT_CHECK_S,
    cursor_batches,
    scan_states,
)
from sluice.errors import (
    BrokerError,
    InvalidSubscription,
    NotLeader,
    SubscriptionAlreadyExists,
    UnknownSubscription,
)
from sluice.protocol import messages as m
from sluice.protocol import subscriptions as sub
from sluice.protocol.ranges import Pairs, count
from sluice.protocol.records import validate_batches
from sluice.storage.log import OutOfRange

log = logging.getLogger("sluice.broker.subscriptions")

CLOSE_FLUSH_S = 5.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionSubscriptions:
    """The subscriptions of one partition this broker leads, in one leader epoch.

    ``part``: the ``Partition`` (broker/partition.py); ``executor``: where log scans run;
    ``dead_letters``: writes the dead-letter copies of its subscriptions."""

    def __init__(self, part, executor, dead_letters: DeadLetters, ordinary: bool = True) -> None:
        self.part = part
        self._executor = executor
        self._dead_letters = dead_letters
        self.ordinary = ordinary  # not: a compacted topic's, loaded to describe or delete what is stranded
        self.epoch = part.leader_epoch
        self.subs: dict[str, SubscriptionPartition] = {}
        self.loaded: asyncio.Future = asyncio.get_running_loop().create_future()
        self.lock = asyncio.Lock()  # creations, deletions, seeks
        self.closed = False
        self._dirty: set[SubscriptionPartition] = set()
        self._snapshot_base: int | None = None  # the segment holding the newest snapshot
        self._need_snapshot = False  # a large log holds none: write one, even of no subscription
        # (offset, count) of every subscription batch from records_low up (``records_unsettled``)
        self.records: list[tuple[int, int]] = []
        self.records_low = 0  # set by the load
        self._writing = 0  # subscription records being appended now
        self._cover_lock = asyncio.Lock()
        self._pinned: int | None = None  # a scan completing records down to here is running
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._flusher: asyncio.Task | None = None

    @property
    def current(self) -> bool:
        p = self.part
        return not self.closed and p.is_leader and p.leader_epoch == self.epoch

    async def load(self) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            states, found, where, covered = await loop.run_in_executor(
                self._executor, scan_states, self.part.log, self.part.log_end_offset
            )
            low = min((st.confirmed for st in states.values()), default=self.part.high_watermark)
            self.records = [w for w in where if w[0] + w[1] > low]  # not messages: no backlog
            self.records_low = max(covered, low)
            for state in states.values():
                self.subs[state.name] = SubscriptionPartition(self, state)
            for sp in list(self.subs.values()):
                await sp.catch_up()
        except BaseException as exc:
            if not self.loaded.done():
                self.loaded.set_exception(exc if isinstance(exc, Exception) else NotLeader("load cancelled"))
            raise
        if self.closed:
            return  # closed meanwhile (leadership moved): ``close`` answered the waiters
        if states:
            log.info(
                "loaded %d subscription(s) of %s-%d in %.0f ms", len(states), self.part.topic,
                self.part.index, (time.monotonic() - started) * 1000,
            )
        # so that the next load of a large log reads only its newest segments (but nothing
        # is written into a compacted topic for a subscription it does not have)
        self._need_snapshot = not found and self.ordinary and self.part.log.size_bytes >= EMPTY_SNAPSHOT_BYTES
        for sp in self.subs.values():
            sp.start()
        self._flusher = loop.create_task(self._flush_loop(), name=f"cursors {self.part.topic}-{self.part.index}")
        self.loaded.set_result(None)

    def mark_dirty(self, sp: SubscriptionPartition) -> None:
        self._dirty.add(sp)
        self._changed.set()

    def track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ writing

    async def write(self, states: list[sub.CursorState], snapshot: bool = False, acks_all: bool = True) -> None:
        """Append subscription records to the partition (``acks_all``: answered once in
        every in-sync replica)."""
        part = self.part
        data = bytearray(sub.cursor_batch(states, _now_ms(), snapshot))
        spans = validate_batches(data, max(len(data), part.config.max_message_bytes), broker=True)
        base = part.log.active.base_offset
        n = len(states) + snapshot
        self._writing += n  # counted from now: the high watermark may pass them before we resume
        try:
            result = await part.append(data, spans, acks_all=acks_all)
        finally:
            self._writing -= n
        if snapshot:
            self._snapshot_base = base
        self.records.append((result.base_offset, n))
        if len(self.records) > 64:  # those every subscription has read past count no more
            low = min((sp.next_read for sp in self.subs.values()), default=part.high_watermark)
            if self._pinned is not None:
                low = min(low, self._pinned)
            self.records = [r for r in self.records if r[0] + r[1] > low]
            self.records_low = max(self.records_low, low)

    def records_unsettled(self, cursor) -> int:
        """How many subscription records ``cursor`` has not settled (passed), counting those
        being appended now: a backlog counts messages, not them.  Exact for a cursor whose
        subscription reads from ``records_low`` up (``cover``): below its read position
        every record is settled."""
        return sum(count(cursor.unsettled(at, at + n)) for at, n in self.records) + self._writing

    async def cover(self, sps: list[SubscriptionPartition]) -> None:
        """Complete ``records`` down to where ``sps`` read from (the log start at least).
        A subscription can read from below ``records_low`` — a seek back, a creation at an
        earlier position, a load whose newest snapshot lies above a cursor — and the list is
        trimmed to what the subscriptions have not read past, so the log below it is
        scanned then, off the event loop (describe calls this: only it pays for the scan).
        On return ``records`` is complete for every one of ``sps``."""
        async with self._cover_lock:
            while sps:
                low = max(min(sp.next_read for sp in sps), self.part.log_start_offset)
                high = self.records_low
                if low >= high:
                    return
                where: list[tuple[int, int]] = []
                self._pinned = low  # kept by any trimming meanwhile
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        self._executor, cursor_batches, self.part.log, low, high, where
                    )
                except OutOfRange:
                    continue  # retention moved the log start: from there
                finally:
                    self._pinned = None
                known = {at for at, _ in self.records}  # one written as the scan ran may be in both
                self.records[:0] = [w for w in sorted(where) if w[0] not in known]
                self.records_low = low

    async def _flush_loop(self) -> None:
        """Write changed cursors ``FLUSH_S`` after the first change (group commit), and
        look every ``SNAPSHOT_CHECK_S`` whether the log rolled a segment (a snapshot due)."""
        while True:
            try:
                async with asyncio.timeout(SNAPSHOT_CHECK_S):
                    await self._changed.wait()
                await asyncio.sleep(FLUSH_S)
            except TimeoutError:
                pass
            self._changed.clear()
            await self.flush()

    async def flush(self) -> None:
        """Append the changed cursors; a snapshot of all when the log rolled a segment
        since the last one.  A failed append keeps them changed (retried next time)."""
        wanted = bool(self.subs) or self._need_snapshot
        snapshot = wanted and self._snapshot_base != self.part.log.active.base_offset
        if not self._dirty and not snapshot:
            return
        dirty, self._dirty = self._dirty, set()
        chosen = list(self.subs.values()) if snapshot else [sp for sp in dirty if not sp.closed]
        try:
            if chosen or snapshot:
                await self.write([sp.state(full=snapshot) for sp in chosen], snapshot=snapshot, acks_all=False)
                self._need_snapshot = self._need_snapshot and not snapshot
        except BaseException as exc:
            self._dirty |= dirty
            for sp in chosen:
                sp.unwritten()  # the retries journaled in it: the next record holds them all
            if not isinstance(exc, BrokerError):
                raise
            log.warning("cannot write the cursors of %s-%d: %s; retrying", self.part.topic, self.part.index, exc)
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ admin

    async def position(self, pos: m.Position) -> int:
        part = self.part
        start, hw = part.log_start_offset, part.high_watermark
        if pos.kind == "earliest":
            return start
        if pos.kind == "latest":
            return hw
        if pos.kind == "offset":
            return min(max(pos.value, start), hw)
        if pos.kind == "time":
            found = await part.offset_for_time(pos.value)
            return hw if found is None else max(found, start)
        raise InvalidSubscription(f"position must be earliest, latest, offset or time, not {pos.kind!r}")

    async def create(self, name: str, config: sub.SubscriptionConfig, start: m.Position) -> SubscriptionPartition:
        async with self.lock:
            if name in self.subs:
                raise SubscriptionAlreadyExists(
                    f"subscription {name!r} already exists on {self.part.topic}-{self.part.index}"
                )
            offset = await self.position(start)
            state = sub.CursorState(name=name, config=config, confirmed=offset, created_ms=_now_ms())
            await self.write([state])
            self._check_current()
            sp = self.subs[name] = SubscriptionPartition(self, state)
            sp.start()
            return sp

    async def delete(self, name: str) -> None:
        async with self.lock:
            sp = self.get(name)
            await self.write([sub.CursorState(name=name, deleted=True)])
            sp.close(UnknownSubscription(f"subscription {name!r} was deleted"))
            self.subs.pop(name, None)
            self._dirty.discard(sp)

    async def seek(self, name: str, pos: m.Position) -> int:
        """Move ``name``'s cursor to ``pos`` (an offset outside the log: its nearest end);
        returns the offset it went to."""
        async with self.lock:
            sp = self.get(name)
            offset = await self.position(pos)
            sp.seek(offset)
            self._dirty.discard(sp)
            await self.write([sp.state(full=True)])
            return offset

    def get(self, name: str) -> SubscriptionPartition:
        sp = self.subs.get(name)
        if sp is None:
            raise UnknownSubscription(f"{self.part.topic}-{self.part.index} has no subscription {name!r}")
        return sp

    def _check_current(self) -> None:
        if not self.current:
            raise NotLeader(f"{self.part.topic}-{self.part.index} changed leader")

    # ------------------------------------------------------------------ dead letters

    async def dead_letter(self, sp: SubscriptionPartition, ranges: Pairs, attempts: int, reason: str) -> None:
        """Copy the messages at ``ranges`` to ``sp``'s dead-letter topic; returns once the
        copies are acknowledged by every in-sync replica (dead_letters.py)."""
        await self._dead_letters.copy(self.part, sp.name, ranges, attempts, reason)

    # ------------------------------------------------------------------ lifecycle

    async def close(self, exc: BrokerError | None, flush: bool = False) -> None:
        """Stop: end the consumers' subscriptions with ``exc``; with ``flush`` write the
        changed cursors first (a broker stopping, still the leader)."""
        if self.closed:
            return
        if flush and self.current and self.loaded.done():
            try:
                async with asyncio.timeout(CLOSE_FLUSH_S):
                    await self.flush()
            except Exception as e:  # noqa: BLE001 - the next leader redelivers: never a loss
                log.warning("cursors of %s-%d not written at close: %s", self.part.topic, self.part.index, e)
        self.closed = True
        if self._flusher is not None:
            self._flusher.cancel()
        for task in list(self._tasks):
            task.cancel()
        for sp in self.subs.values():
            sp.close(exc)
        if not self.loaded.done():
            self.loaded.set_exception(exc or NotLeader("closed"))
            self.loaded.exception()  # retrieved: nobody may be waiting
