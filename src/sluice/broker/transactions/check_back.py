"""Check-back: asking producers about the half messages they left open.

Every ``min(check_interval, check_timeout)`` the loop looks at the open half messages of
the partitions led here; one older than ``check_timeout`` and not checked in the last
``check_interval`` is pushed (CHECK_TRANSACTION) to a live connection registered for its
producer group (REGISTER_PRODUCER), in turn; after ``max_checks`` checks it is rolled back
with the reason "discarded" and copied to ``__txn_discarded`` (audit.py).  Delayed messages
(halves of the group ``sluice.delay``) are never checked: delays.py commits them.

Event loop only; the halves' records are read in the read executor it is given.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from sluice.broker.transactions.audit import AuditCopies
from sluice.broker.transactions.halves import Half, read_half
from sluice.broker.transactions.partition import PartitionTransactions
from sluice.errors import BrokerError, TransactionEnded
from sluice.protocol import messages as m

log = logging.getLogger("sluice.broker.transactions")

PASS_WARN_EVERY_S = 30.0  # "check-back pass failed" warnings, at most one per this
AUDIT_RETRY_S = 120.0  # all attempts of one audit copy


class CheckBack:
    """The check-back loop.  ``states()``: the transaction states of the partitions led
    here (``TransactionManager.led_states``); ``producers``: group -> the live connections
    that registered it (``push``, ``closed``), kept by the manager; ``audit``: the audit
    copies; times in seconds."""

    def __init__(
        self,
        states: Callable[[], Iterable[PartitionTransactions]],
        producers: Mapping[str, list],
        executor,
        audit: AuditCopies,
        check_timeout: float,
        check_interval: float,
        max_checks: int,
    ) -> None:
        self._states = states
        self._producers = producers
        self._executor = executor
        self._audit = audit
        self.check_timeout = check_timeout
        self.check_interval = check_interval
        self.max_checks = max_checks
        self._rr = itertools.count()
        self._discarding: set[tuple[str, int, int]] = set()
        self._pass_warned_at = -PASS_WARN_EVERY_S
        self.closing = False
        self._discard_tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        """The check-back loop (a broker task)."""
        tick = max(min(self.check_interval, self.check_timeout), 0.05)
        while True:
            await asyncio.sleep(tick)
            try:
                await self._audit.ensure_topic()
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except BrokerError as exc:  # etcd away, say: one line, at most every 30 s
                now = time.monotonic()
                if now - self._pass_warned_at >= PASS_WARN_EVERY_S:
                    self._pass_warned_at = now
                    log.warning("transaction check-back pass failed, retrying: %s", exc)
            except Exception:  # noqa: BLE001 - keep checking: the cause may pass
                log.exception("transaction check-back pass failed")

    async def check_once(self) -> None:
        now, mono = _now_ms(), time.monotonic()
        for st in self._states():
            await st.catch_up()
            for h in list(st.open.values()):
                if h.delayed or h.offset in st.ending or now - h.timestamp < self.check_timeout * 1000:
                    continue
                if h.last_check and mono - h.last_check < self.check_interval:
                    continue
                if h.checks >= self.max_checks:
                    self._discard(st, h)
                    continue
                h.checks += 1
                h.last_check = mono
                await self._push_check(st, h)

    async def _push_check(self, st: PartitionTransactions, h: Half) -> None:
        conns = [c for c in self._producers.get(h.group, []) if not c.closed]
        if not conns:
            log.info("%s: no live producer of group %r to check (check %d of %d)",
                     st.txn_id(h.offset), h.group, h.checks, self.max_checks)
            return
        loop = asyncio.get_running_loop()
        recs = await loop.run_in_executor(self._executor, read_half, st.part.log, h.offset)
        if not recs:
            return
        r = recs[0]
        push = m.CheckTransaction(
            topic=st.part.topic, partition=st.part.index, offset=h.offset, group=h.group,
            timestamp=r.timestamp, key=r.key, value=r.value, headers=list(r.headers), checks=h.checks,
        )
        conn = conns[next(self._rr) % len(conns)]
        conn.push(m.Push.CHECK_TRANSACTION, 1, push)
        log.debug("%s: check %d of %d sent to a producer of group %r",
                 st.txn_id(h.offset), h.checks, self.max_checks, h.group)

    def _discard(self, st: PartitionTransactions, h: Half) -> None:
        key = (st.part.topic, st.part.index, h.offset)
        if key in self._discarding:
            return
        self._discarding.add(key)
        task = asyncio.get_running_loop().create_task(self._discard_half(st, h))
        self._discard_tasks.add(task)
        task.add_done_callback(lambda t: (
            self._discarding.discard(key), self._discard_tasks.discard(t), t.cancelled() or t.exception()
        ))

    async def _discard_half(self, st: PartitionTransactions, h: Half) -> None:
        """Roll back a half its producers never resolved, then copy it to the audit topic."""
        reason = f"discarded: unresolved after {h.checks} checks (group {h.group!r})"
        half_id = st.txn_id(h.offset)
        try:
            await st.end(h.offset, commit=False, timeout=30.0, reason=reason)
        except TransactionEnded:
            return  # a producer committed it meanwhile: nothing to discard
        except BrokerError as exc:
            log.warning("%s: cannot discard yet: %s", half_id, exc)
            return
        loop = asyncio.get_running_loop()
        recs = await loop.run_in_executor(self._executor, read_half, st.part.log, h.offset)
        # the audit copy is retried (its partition's leader may be moving) for a while; the
        # rollback marker keeps the decision and the reason whatever happens
        deadline, delay = time.monotonic() + AUDIT_RETRY_S, 0.1
        while True:
            try:
                await self._audit.write(half_id, recs, reason, h.checks)
                return
            except Exception as exc:  # noqa: BLE001 - retried, then reported
                if self.closing or time.monotonic() + delay > deadline:
                    log.error("%s: rolled back (%s) but its audit copy was not written: %s", half_id, reason, exc)
                    return
                log.info("%s: audit copy not written yet (%s); retrying", half_id, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def close(self) -> None:
        """Stop discarding.  A discard stopped before its rollback is done again by the
        next leader; one stopped after it has no audit copy (its rollback marker keeps the
        reason)."""
        self.closing = True
        tasks = list(self._discard_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _now_ms() -> int:
    return int(time.time() * 1000)
