"""The transaction state of one partition led here (``PartitionTransactions``).

Where the state lives (DESIGN §0): only in the data partition (halves.py).  The copy of a
commit *is* the record of the commit — one append — so no crash can leave a copy without
its record or the reverse, and replicating the partition replicates the transaction.

What is kept in memory, one per partition led here, rebuilt when leadership or the leader
epoch changes, is derived: the open half messages and the recently ended ones, built by
scanning the log off the event loop.  The state is brought up to the log end before it
answers (``catch_up``); the scan is skipped when no transactional batch was produced to
the partition since the last one (``track``).  Check counts are the one thing not in the
log: kept by the leader, they start again from 0 after a leader change (more checks, never
fewer).

Ending is serialised per half message: the first end of a half runs as its own task
(``ending``); an end of the same half arriving meanwhile waits for it and is answered from
its outcome — success if it ended the same way, TRANSACTION_ENDED otherwise (RocketMQ
issue #8158: a commit and a rollback racing must not both win).  An end that failed leaves
the state to be scanned again before the next one is decided.

Concurrency: event loop only; scans and reads run in the read executor it is given.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time

from sluice.broker.transactions.halves import Half, read_half_batch, scan_log
from sluice.broker.wait import until_woken
from sluice.errors import (
    BrokerError,
    NotLeader,
    RequestTimedOut,
    TransactionEnded,
    UnknownTransaction,
)
from sluice.protocol import messages as m
from sluice.protocol import transactions as tx
from sluice.protocol.records import validate_batches

log = logging.getLogger("sluice.broker.transactions")

MAX_ENDED = 100_000  # ended halves remembered per partition; older ones are looked up in the log


def _now_ms() -> int:
    return int(time.time() * 1000)



class PartitionTransactions:
    """The transaction state of one partition led here, in one leader epoch."""

    def __init__(self, part, read_executor) -> None:
        self.part = part
        self.epoch = part.leader_epoch
        self._executor = read_executor
        self.open: dict[int, Half] = {}
        self.ended: dict[int, tuple[str, int]] = {}  # half offset -> (state, offset of its end)
        self.ending: dict[int, tuple[bool, asyncio.Task]] = {}  # half offset -> (commit, task)
        # the log below its oldest open half holds nothing this state needs (halves ended
        # there are looked up when asked: ``_lookup``); the partition's writer keeps that set
        self.scanned_to = self._scan_start()
        self.dirty = True  # the log may hold transaction batches above scanned_to
        self.inflight = 0  # transactional appends not completed yet
        self.due: list[tuple[int, int]] = []  # (deliver_at, offset) of open delayed halves
        self._scan_lock = asyncio.Lock()
        # resolved once the latest end begun has queued its append (or ended without one):
        # ends queue their appends in the order they began, whatever their reads take, so
        # delayed messages due in order are delivered in order
        self._append_turn: asyncio.Future | None = None

    def _scan_start(self) -> int:
        plog = self.part.log
        return min(plog.producers.open_halves, default=plog.log_end_offset)

    @property
    def current(self) -> bool:
        p = self.part
        return not p.closing and p.is_leader and p.leader_epoch == self.epoch

    def track(self, fut: asyncio.Future) -> None:
        """A produce appended a transactional batch (``fut``: its append): scan again."""
        self.inflight += 1
        self.dirty = True

        def done(_f) -> None:
            self.inflight -= 1
            self.dirty = True

        fut.add_done_callback(done)

    async def catch_up(self) -> None:
        """Bring the state up to the log end (a scan off the event loop when needed)."""
        async with self._scan_lock:
            plog = self.part.log
            end = plog.log_end_offset
            if end < self.scanned_to:  # a cut tail (a failed fsync): start over
                self.open.clear()
                self.ended.clear()
                self.due.clear()
                self.scanned_to, self.dirty = self._scan_start(), True
            if not self.dirty and not self.inflight:
                self.scanned_to = end  # nothing transactional was appended meanwhile
                return
            self.dirty = False
            start = self.scanned_to
            if start < end:
                loop = asyncio.get_running_loop()
                events = await loop.run_in_executor(self._executor, scan_log, plog, start, end)
                self._apply(events)
            self.scanned_to = max(self.scanned_to, end)

    def _apply(self, events: list[tuple]) -> None:
        for ev in events:
            if ev[0] == "half":
                _, offset, ts, group, deliver_at, count = ev
                if offset not in self.ended and offset not in self.open:
                    self.open[offset] = Half(offset, ts, group, deliver_at=deliver_at, count=count)
                    if deliver_at:
                        heapq.heappush(self.due, (deliver_at, offset))
            else:
                _, offset, state, at = ev
                self._ended(offset, state, at)

    def _ended(self, offset: int, state: str, at: int) -> None:
        self.open.pop(offset, None)
        self.ended[offset] = (state, at)
        while len(self.ended) > MAX_ENDED:  # the first ended go: looked up in the log when asked
            del self.ended[next(iter(self.ended))]

    def _check_leader(self) -> None:
        if not self.current:
            raise NotLeader(f"this broker no longer leads {self.part.topic}-{self.part.index}")

    def txn_id(self, offset: int) -> str:
        return tx.format_id(self.part.topic, self.part.index, offset)

    async def end(self, offset: int, commit: bool, timeout: float, reason: str = "") -> tuple[str, int, bool]:
        """Commit or roll back the half at ``offset``: (state, offset of its end, already).

        ``TransactionEnded`` when it was ended the other way; ``UnknownTransaction`` when
        there is no half message there; ``RequestTimedOut`` when the end is still being
        replicated after ``timeout`` seconds (it goes on: ask again).
        """
        deadline = time.monotonic() + timeout
        while True:
            pending = self.ending.get(offset)
            if pending is None:
                task = asyncio.get_running_loop().create_task(self._end(offset, commit, reason))
                self.ending[offset] = (commit, task)
                task.add_done_callback(lambda t, o=offset: self._end_done(o, t))
                mine = True
            else:
                task, mine = pending[1], False
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    state, at, already = await asyncio.shield(task)
            except TimeoutError:
                raise RequestTimedOut(
                    f"ending {self.txn_id(offset)} not completed within {timeout:g}s; it goes on: ask again"
                ) from None
            except (TransactionEnded, UnknownTransaction):
                if mine:
                    raise
                continue  # decided against the other end's kind: decide for ours
            except BrokerError:
                if mine:
                    raise
                continue  # the other attempt failed (nothing decided): try ourselves
            return self._answer(offset, commit, state, at, already or not mine)

    def _answer(self, offset: int, commit: bool, state: str, at: int, already: bool) -> tuple[str, int, bool]:
        wanted = m.TXN_COMMITTED if commit else m.TXN_ROLLED_BACK
        if state != wanted:
            verb = "committed" if commit else "rolled back"
            raise TransactionEnded(
                f"{self.txn_id(offset)} was {state.replace('_', ' ')} (at offset {at}); it cannot be {verb}"
            )
        return state, at, already

    def _end_done(self, offset: int, task: asyncio.Task) -> None:
        if self.ending.get(offset, (None, None))[1] is task:
            del self.ending[offset]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may be gone

    async def _end(self, offset: int, commit: bool, reason: str) -> tuple[str, int, bool]:
        """The one end of a half running now (see ``end``): decides on the state after
        catching up with the log, and appends the commit copy or the rollback marker, after
        the ends begun before it queued theirs."""
        prev, turn = self._append_turn, asyncio.get_running_loop().create_future()
        self._append_turn = turn
        try:
            return await self._end_in_turn(offset, commit, reason, prev, turn)
        finally:
            if not turn.done():
                turn.set_result(None)

    async def _end_in_turn(
        self, offset: int, commit: bool, reason: str, prev: asyncio.Future | None, turn: asyncio.Future
    ) -> tuple[str, int, bool]:
        self._check_leader()
        await self.catch_up()
        self._check_leader()
        done = self.ended.get(offset)
        if done is None and offset not in self.open:
            done = await self._lookup(offset)
        if done is not None:
            if not turn.done():
                turn.set_result(None)  # appends nothing: the ends after it need not wait
            await self._replicated(done[1])
            return self._answer(offset, commit, *done, True)
        loop = asyncio.get_running_loop()
        plog = self.part.log
        half = await loop.run_in_executor(self._executor, read_half_batch, plog, offset)
        if half is None:
            raise UnknownTransaction(f"{self.txn_id(offset)} holds no half message")
        half_id = self.txn_id(offset)
        if commit:
            data = bytearray(tx.commit_copy(half, half_id))  # per-batch work: only the first record decoded
        else:
            data = bytearray(tx.rollback_batch(half_id, offset, reason or "rolled back by its producer", _now_ms()))
        spans = validate_batches(data, max(len(data), self.part.config.max_message_bytes), broker=True)
        if prev is not None:
            await asyncio.shield(prev)
        self._check_leader()
        try:
            queued = self.part.append(data, spans, acks_all=True)
            turn.set_result(None)
            result = await queued
        except BaseException:
            self.dirty = True  # it may be in the log: the next end scans before deciding
            raise
        state = m.TXN_COMMITTED if commit else m.TXN_ROLLED_BACK
        self._ended(offset, state, result.base_offset)
        log.debug("%s %s at offset %d", half_id, state.replace("_", " "), result.base_offset)
        return state, result.base_offset, False

    async def _replicated(self, at: int) -> None:
        """Return once the high watermark passes the end batch at offset ``at`` (as a
        duplicate produce is answered only once its original is).  A new leader may hold
        an end copied from the old one above its high watermark: it is not settled until
        the ISR has it (a failover could still cut it), so "already ended" waits for that.
        ``NotLeader`` when leadership moves meanwhile; the caller's deadline bounds it."""
        part = self.part
        while True:
            self._check_leader()
            if part.high_watermark > at:
                return
            await until_woken([part.add_waiter], [part.remove_waiter], 1.0)

    async def _lookup(self, offset: int) -> tuple[str, int] | None:
        """The fate of a half not in memory (ended long ago, or not a half at all):
        scanned from the half itself to the log end.  None if it is open (found again)."""
        plog = self.part.log
        if offset >= plog.log_end_offset:
            raise UnknownTransaction(f"{self.txn_id(offset)}: offset beyond the log end {plog.log_end_offset}")
        if offset < plog.log_start_offset:
            raise UnknownTransaction(
                f"{self.txn_id(offset)}: offset below the log start {plog.log_start_offset} (deleted by retention?)"
            )
        loop = asyncio.get_running_loop()
        events = await loop.run_in_executor(self._executor, scan_log, plog, offset, self.scanned_to, offset)
        if not events or events[0][0] != "half":
            raise UnknownTransaction(f"{self.txn_id(offset)} holds no half message")
        self._apply(events)
        return self.ended.get(offset)
