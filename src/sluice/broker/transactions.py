"""Transactional messages on the broker: the unresolved half messages of the partitions
led here, ending them (commit / rollback), check-back, and the APIs.

Where the state lives (DESIGN §0): only in the data partitions.  A half message is a
transactional batch in its target partition; its commit is the visible copy of its records
(commit bit, header ``sluice.txn.id`` on the first record: ``tx.commit_copy`` copies the
half's bytes, it decodes no other record) appended to the same partition, its rollback a
control batch there (protocol/transactions.py).  The copy *is* the record of the commit —
one append — so no crash can leave a copy without its record or the reverse, and
replicating the partition replicates the transaction with it.

What is kept in memory (``PartitionTransactions``, one per partition led here, rebuilt
when leadership or the leader epoch changes) is derived: the open half messages and the
recently ended ones, built by scanning the log (batch headers; only transactional,
commit and control batches are decoded) off the event loop.  A partition's state is
brought up to its log end before it answers (``catch_up``); the scan is skipped when no
transactional batch was produced to it since the last one (``track``).  Check counts are
the one thing not in the log: they are kept by the leader and start again from 0 after a
leader change (more checks, never fewer).

Ending is serialised per half message: the first end of a half runs as its own task
(``PartitionTransactions.ending``); an end of the same half arriving meanwhile waits for
it and is answered from its outcome — success if it ended the same way, TRANSACTION_ENDED
otherwise (RocketMQ issue #8158: a commit and a rollback racing must not both win).  An
end that failed leaves the state to be scanned again before the next one is decided.

Check-back: every ``min(check_interval, check_timeout)`` the leader looks at its open
half messages; one older than ``check_timeout`` and not checked in the last
``check_interval`` is pushed (CHECK_TRANSACTION) to a live connection registered for its
producer group (REGISTER_PRODUCER); after ``max_checks`` checks it is rolled back with the
reason "discarded" and a copy goes to the internal topic ``__txn_discarded`` (rollback
first, then the audit copy: a crash between loses the audit copy, never the decision,
which the rollback marker itself records with its reason).

Concurrency: everything runs on the event loop; scans and reads run in the broker's read
executor and touch only immutable log views.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import zlib
from dataclasses import dataclass

from sluice.broker.peer import Peer
from sluice.broker.wait import until_woken
from sluice.client.transaction import leader_connection
from sluice.client.transport import Cluster
from sluice.errors import (
    BrokerError,
    ConnectionClosed,
    InvalidRequest,
    NotLeader,
    RequestTimedOut,
    TopicAlreadyExists,
    TransactionEnded,
    UnknownTransaction,
    raise_for_code,
)
from sluice.protocol import messages as m
from sluice.protocol import transactions as tx
from sluice.protocol.records import (
    TRANSACTIONAL_BIT,
    batch_attributes,
    build_batch,
    decode_batch,
    decode_first,
    encode_record,
    iter_batches,
    parse_header,
    validate_batches,
)
from sluice.storage.log import OutOfRange

log = logging.getLogger("sluice.broker.transactions")

SCAN_BYTES = 4 * 1024 * 1024  # per read of a scan
MAX_ENDED = 100_000  # ended halves remembered per partition; older ones are looked up in the log
DISCARD_TOPIC_CONFIG = {"retention.ms": "-1"}  # an audit trail: kept until an operator drops it


@dataclass
class Half:
    offset: int
    timestamp: int  # ms: when the broker stored it (the batch's max timestamp when scanned)
    group: str
    checks: int = 0
    last_check: float = 0.0  # monotonic time of the last check sent
    deliver_at: int = 0  # ms: a delayed message's delivery time (group DELAY_GROUP); 0 otherwise
    count: int = 1  # messages in its batch

    @property
    def delayed(self) -> bool:
        return self.deliver_at > 0


# --------------------------------------------------------------------------- log scans


def scan_log(plog, start: int, end: int, only: int | None = None) -> list[tuple]:
    """Worker thread: the transaction events of ``plog`` in ``[start, end)``, in log order.

    ``("half", offset, timestamp, group, deliver_at, count)`` for a half message, ``("end", half_offset,
    state, at)`` for a commit or rollback batch at ``at``.  Batch headers are read for
    every batch; of transactional, commit and control batches the first record is decoded.  With
    ``only``, events of that half only.
    """
    events: list[tuple] = []
    offset = max(start, plog.log_start_offset)
    while offset < end:
        data = plog.read(offset, SCAN_BYTES, end).data
        nxt = None
        for h, pos in iter_batches(data, check_crc=False):
            nxt = h.next_offset
            if nxt <= offset or not h.attributes & tx.TXN_BITS:
                continue
            first = decode_first(data, h, pos)  # what bookkeeping needs is in the first record
            recs = [first] if first is not None else []
            if h.attributes & TRANSACTIONAL_BIT:
                if only is None or h.base_offset == only:
                    group = tx.group_of(recs[0]) if recs else ""
                    at = tx.deliver_at_of(recs[0]) if group == tx.DELAY_GROUP else 0
                    events.append(("half", h.base_offset, h.max_timestamp, group, at, nxt - h.base_offset))
                continue
            half = tx.resolved_offset(h.attributes, recs)
            if half is not None and (only is None or half == only):
                state = m.TXN_ROLLED_BACK if h.attributes & tx.CONTROL_BIT else m.TXN_COMMITTED
                events.append(("end", half, state, h.base_offset))
        if nxt is None:
            break
        offset = nxt
    return events


def read_half_batch(plog, offset: int) -> bytes | None:
    """Worker thread: the batch of the half message at ``offset`` as stored (its CRC
    checked, its records not decoded); None if there is none."""
    try:
        data = plog.read(offset, 1, plog.log_end_offset).data
    except OutOfRange:
        return None
    for h, pos in iter_batches(data, check_crc=True):
        if h.base_offset == offset and h.attributes & TRANSACTIONAL_BIT:
            return data[pos : pos + h.size]
        if h.base_offset >= offset:
            break
    return None


def read_half(plog, offset: int) -> list:
    """Worker thread: the records of the half message at ``offset``; [] if there is none."""
    batch = read_half_batch(plog, offset)
    if batch is None:
        return []
    return decode_batch(batch, parse_header(batch), 0)


# --------------------------------------------------------------------------- one partition


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


# --------------------------------------------------------------------------- the manager


class TransactionManager:
    """Transaction state of every partition led here, check-back, and the three APIs."""

    def __init__(self, broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.check_timeout = cfg.txn_check_timeout_ms / 1000
        self.check_interval = cfg.txn_check_interval_ms / 1000
        self.max_checks = cfg.txn_max_checks
        self.states: dict[tuple[str, int], PartitionTransactions] = {}
        self.producers: dict[str, list] = {}  # group -> live connections that registered it
        self._rr = itertools.count()
        self._discarding: set[tuple[str, int, int]] = set()
        self._audit_ready = False
        self._pass_warned_at = -PASS_WARN_EVERY_S
        self._peers: Cluster | None = None  # a client to the other brokers, for audit copies
        self.closing = False
        self._discard_tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ state

    def state(self, part) -> PartitionTransactions | None:
        """The state of a partition led here (new after a change of leader epoch)."""
        if not part.is_leader:
            self.states.pop((part.topic, part.index), None)
            return None
        key = (part.topic, part.index)
        st = self.states.get(key)
        if st is None or st.part is not part or st.epoch != part.leader_epoch:
            st = self.states[key] = PartitionTransactions(part, self.broker.read_executor)
        return st

    def track(self, part, spans, data, fut: asyncio.Future) -> None:
        """Produce path: note an append holding transactional batches (per-batch check)."""
        if any(batch_attributes(data, s.pos) & TRANSACTIONAL_BIT for s in spans):
            st = self.state(part)
            if st is not None:
                st.track(fut)

    def _led(self, topics=None):
        for name, topic in list(self.broker.topics.items()):
            if topic.internal or (topics is not None and name not in topics):
                continue
            for part in list(topic.partitions.values()):
                if part.is_leader:
                    yield part

    # ------------------------------------------------------------------ handlers

    async def end_transaction(self, req: m.EndTransactionRequest, _att, _peer: Peer):
        if req.offset < 0 or req.partition < 0:
            raise InvalidRequest(f"bad transaction id {req.topic}/{req.partition}/{req.offset}")
        part = self.broker.led_partition(req.topic, req.partition)
        if self.broker.topics[req.topic].internal:
            raise UnknownTransaction(f"topic {req.topic} is internal: it holds no transactions")
        st = self.state(part)
        if st is None:
            raise NotLeader(f"this broker does not lead {req.topic}-{req.partition}")
        state, at, already = await st.end(req.offset, req.commit, max(req.timeout_ms, 1) / 1000)
        return m.EndTransactionResponse(state=state, offset=at, already=already), ()

    async def register_producer(self, req: m.RegisterProducerRequest, _att, peer: Peer):
        if not req.group:
            raise InvalidRequest("a producer group must be a non-empty string")
        conn = peer
        if conn is None:
            raise InvalidRequest("REGISTER_PRODUCER needs a connection")
        conns = self.producers.setdefault(req.group, [])
        if conn not in conns:
            conns.append(conn)
            conn.on_close(lambda c=conn, g=req.group: self._unregister(g, c))
        return m.RegisterProducerResponse(), ()

    def _unregister(self, group: str, conn) -> None:
        conns = self.producers.get(group, [])
        if conn in conns:
            conns.remove(conn)
        if not conns:
            self.producers.pop(group, None)

    async def list_transactions(self, req: m.ListTransactionsRequest, _att, _peer: Peer):
        topics = None if req.topics is None else set(req.topics)
        now = _now_ms()
        out: list[m.TransactionInfo] = []
        for part in self._led(topics):
            st = self.state(part)
            if st is None:
                continue
            await st.catch_up()
            for h in sorted(st.open.values(), key=lambda h: h.offset):
                if h.delayed != req.delayed:
                    continue
                out.append(m.TransactionInfo(
                    topic=part.topic, partition=part.index, offset=h.offset, group=h.group,
                    timestamp=h.timestamp, checks=h.checks, age_ms=max(now - h.timestamp, 0),
                    deliver_at=h.deliver_at, count=h.count,
                ))
        return m.ListTransactionsResponse(transactions=out), ()

    def handlers(self) -> dict:
        return {
            m.Api.END_TRANSACTION: self.end_transaction,
            m.Api.REGISTER_PRODUCER: self.register_producer,
            m.Api.LIST_TRANSACTIONS: self.list_transactions,
        }

    # ------------------------------------------------------------------ check-back

    async def run(self) -> None:
        """The check-back loop (a broker task)."""
        tick = max(min(self.check_interval, self.check_timeout), 0.05)
        while True:
            await asyncio.sleep(tick)
            try:
                await self.ensure_audit_topic()
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
        for part in self._led():
            st = self.state(part)
            if st is None:
                continue
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
        conns = [c for c in self.producers.get(h.group, []) if not c.closed]
        if not conns:
            log.info("%s: no live producer of group %r to check (check %d of %d)",
                     st.txn_id(h.offset), h.group, h.checks, self.max_checks)
            return
        loop = asyncio.get_running_loop()
        recs = await loop.run_in_executor(self.broker.read_executor, read_half, st.part.log, h.offset)
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
        recs = await loop.run_in_executor(self.broker.read_executor, read_half, st.part.log, h.offset)
        # the audit copy is retried (its partition's leader may be moving) for a while; the
        # rollback marker keeps the decision and the reason whatever happens
        deadline, delay = time.monotonic() + AUDIT_RETRY_S, 0.1
        while True:
            try:
                await self._audit(half_id, recs, reason, h)
                return
            except Exception as exc:  # noqa: BLE001 - retried, then reported
                if self.closing or time.monotonic() + delay > deadline:
                    log.error("%s: rolled back (%s) but its audit copy was not written: %s", half_id, reason, exc)
                    return
                log.info("%s: audit copy not written yet (%s); retrying", half_id, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _audit(self, half_id: str, recs, reason: str, h: Half) -> None:
        topic = self.broker.topics.get(tx.DISCARD_TOPIC)
        if topic is None:
            raise NotLeader(f"{tx.DISCARD_TOPIC} does not exist yet")
        index = zlib.crc32(half_id.encode()) % topic.count
        part = topic.partitions.get(index)
        now = _now_ms()
        body = b"".join(
            encode_record(i, 0, r.key, r.value, [
                *r.headers, (tx.ID_HEADER, half_id.encode()), (tx.REASON_HEADER, reason.encode()),
                (tx.CHECKS_HEADER, str(h.checks).encode()),
            ])
            for i, r in enumerate(recs)
        )
        data = bytearray(build_batch(body, len(recs), now, now))
        if part is not None and part.is_leader:
            spans = validate_batches(data, max(len(data), part.config.max_message_bytes))
            await part.append(data, spans, acks_all=True)
        else:
            await self._audit_at_leader(index, data)
        log.warning("%s %s; copied to %s-%d", half_id, reason, tx.DISCARD_TOPIC, index)

    async def _audit_at_leader(self, index: int, data: bytes) -> None:
        """Write an audit copy to the broker that leads ``__txn_discarded``-``index``: a
        produce flagged ``internal`` (brokers only), through a client of this broker's own."""
        if self._peers is None:
            addresses = [f"{b.host}:{b.port}" for b in self.broker.live_brokers.values()]
            if not addresses:
                raise NotLeader("no live broker known to write the audit copy to")
            self._peers = Cluster(addresses, request_timeout=AUDIT_TIMEOUT_S)
        conn = await leader_connection(self._peers, tx.DISCARD_TOPIC, index)
        req = m.ProduceRequest(
            partitions=[m.ProducePartition(topic=tx.DISCARD_TOPIC, partition=index, size=len(data))],
            acks=m.ACKS_ALL, timeout_ms=int(AUDIT_TIMEOUT_S * 1000), internal=True,
        )
        try:
            resp, _ = await conn.request(req, (bytes(data),), AUDIT_TIMEOUT_S + 5)
        except (NotLeader, ConnectionClosed):
            self._peers.mark_stale(tx.DISCARD_TOPIC)
            raise
        result = resp.partitions[0]
        if result.error:
            self._peers.mark_stale(tx.DISCARD_TOPIC)
            raise_for_code(result.error, result.message)

    async def close(self) -> None:
        """Stop discarding and close the client to the other brokers.  A discard stopped
        before its rollback is done again by the next leader; one stopped after it has no
        audit copy (its rollback marker keeps the reason)."""
        self.closing = True
        tasks = list(self._discard_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._peers is not None:
            await self._peers.close()

    async def ensure_audit_topic(self) -> None:
        """Create ``__txn_discarded`` (one partition, internal) once ``__groups`` exists:
        by then a new cluster has its brokers (broker.py ``_ensure_internal_topics``)."""
        if self._audit_ready or self.broker.groups is None:
            return
        if tx.DISCARD_TOPIC not in (await self.broker.metadata.topics()):
            new = m.NewTopic(name=tx.DISCARD_TOPIC, partitions=1, config=DISCARD_TOPIC_CONFIG)
            try:
                async with self.broker._admin_lock:
                    await self.broker._create_topic(new, validate_only=False, internal=True)
            except TopicAlreadyExists:
                pass
        self._audit_ready = True


PASS_WARN_EVERY_S = 30.0  # "check-back pass failed" warnings, at most one per this
AUDIT_TIMEOUT_S = 30.0  # one audit write
AUDIT_RETRY_S = 120.0  # all attempts of one audit copy


def _now_ms() -> int:
    return int(time.time() * 1000)
