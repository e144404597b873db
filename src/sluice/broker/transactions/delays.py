"""Delayed messages: committed by their partition's leader when they fall due.

A delayed message is a half message (partition.py, halves.py) of the producer group
``sluice.delay`` whose records carry their delivery time (protocol/transactions.py,
``delayed_batch``): durable and replicated once stored, invisible to every reader, and
made visible by the same commit as any transaction — the visible copy appended to the
same partition.  So the state of a delayed message is in its partition's log, a new
leader finds the open ones by its transaction scan, and nothing else is kept.

In memory, per partition led here: a heap of ``(deliver_at, offset)`` of its open delayed
halves (``PartitionTransactions.due``), one entry per stored batch — clients put the
messages of one delivery time into one batch, so a million pending messages are as many
entries as they have distinct times, not a million.

The due ones are committed at the earliest delivery time known, looking at least every
``TICK_S`` for halves stored meanwhile (lateness: a millisecond or so of timer, plus the
commit — the half's batch read back and copied, its records not decoded: ``tx.commit_copy``
— appended and acknowledged by the in-sync replicas).  A commit that fails (a leader
change, a full disk) is tried again ``RETRY_S`` later while this broker leads the partition.  Retention never
deletes a segment holding an open half message (storage/log.py ``expired_segments``), so
a delay longer than ``retention.ms`` is kept until delivered.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time

from sluice.errors import BrokerError, TransactionEnded, UnknownTransaction

log = logging.getLogger("sluice.broker.delays")

TICK_S = 0.01  # the longest wait between two looks at the due halves
MIN_WAIT_S = 0.001
DISCOVER_S = 0.5  # how often led partitions are looked at for open halves not tracked yet
RETRY_S = 1.0
COMMIT_TIMEOUT_S = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class DelayedDelivery:
    """Commits the delayed messages of the partitions this broker leads when due."""

    def __init__(self, transactions) -> None:
        self.txns = transactions
        self._tasks: set[asyncio.Task] = set()
        self._discovered = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._wait())
            try:
                await self.deliver_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep delivering: the cause may pass
                log.exception("delivering delayed messages failed")

    def _wait(self) -> float:
        """Seconds until the earliest delivery time known here, at most ``TICK_S`` (so that
        halves stored meanwhile are seen) and at least a millisecond."""
        first = min((st.due[0][0] for st in self.txns.states.values() if st.due and st.current), default=None)
        if first is None:
            return TICK_S
        return min(TICK_S, max((first + 0.5 - time.time() * 1000) / 1000, MIN_WAIT_S))

    def _discover(self) -> None:
        """Partitions led here with open halves get a transaction state (after a restart
        or a leader change nothing else may ask for one)."""
        mono = time.monotonic()
        if mono - self._discovered < DISCOVER_S:
            return
        self._discovered = mono
        for part in self.txns.led():
            if part.log.producers.open_halves and (part.topic, part.index) not in self.txns.states:
                self.txns.state(part)

    async def deliver_due(self) -> None:
        self._discover()
        for st in list(self.txns.states.values()):
            if not st.current:
                continue
            if st.dirty or st.inflight:
                await st.catch_up()
            now = _now_ms()
            due = st.due
            while due and due[0][0] <= now:
                at, offset = heapq.heappop(due)
                if offset in st.open and offset not in st.ending:
                    self._commit(st, at, offset)

    def _commit(self, st, at: int, offset: int) -> None:
        task = asyncio.get_running_loop().create_task(self._commit_one(st, at, offset))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _commit_one(self, st, at: int, offset: int) -> None:
        try:
            await st.end(offset, commit=True, timeout=COMMIT_TIMEOUT_S)
        except (TransactionEnded, UnknownTransaction):
            return  # ended by someone else (an operator), or gone
        except BrokerError as exc:
            if st.current:
                log.warning("%s: delayed message not delivered yet: %s; retrying", st.txn_id(offset), exc)
                heapq.heappush(st.due, (_now_ms() + int(RETRY_S * 1000), offset))
            return
        late = _now_ms() - at
        if late > 1000:
            log.info("%s: delayed message delivered %d ms after its time", st.txn_id(offset), late)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
