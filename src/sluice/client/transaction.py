"""Transactional messages, RocketMQ style (DESIGN §6): ``TransactionProducer``.

``send_in_transaction(topic, value, local_transaction)``:

1. the message is stored as a **half message** in its partition (``acks=all``): durable,
   replicated, invisible to every reader (protocol/transactions.py);
2. ``local_transaction(message)`` runs — the application's own transaction (a database
   write, say) — and returns ``LocalTransactionState.COMMIT``, ``ROLLBACK`` or ``UNKNOWN``;
3. the producer ends the half message: COMMIT makes it visible in its topic, exactly once;
   ROLLBACK means never visible; UNKNOWN leaves it to the broker's check-back.

**Check-back**: a producer registers its group on a connection to every broker
(REGISTER_PRODUCER, renewed after reconnects).  A partition's leader asks a live producer
of the group about each half message left unresolved longer than the broker's
``--txn-check-timeout-ms`` (CHECK_TRANSACTION, a server push); the producer calls
``check_local_transaction(message)`` and ends the half with its answer (UNKNOWN: nothing,
asked again later).  Any producer of the group answers, including a new instance started
after the one that sent the half died: the check carries the whole message.

Ending is idempotent: ending a half again the same way succeeds (``already``); the other
way fails with ``TransactionEnded``.  Ends that fail with a retriable error (the leader
moved or restarted, a lost connection) are retried until ``retry_timeout_ms``; ending is
safe to repeat, so a retried commit never makes two copies.

``local_transaction`` and ``check_local_transaction`` may be plain functions or coroutine
functions.  Plain ``local_transaction`` functions run on the event loop (in the caller's
thread with ``SyncTransactionProducer``); plain ``check_local_transaction`` functions run
in a worker thread, so a slow check does not stall the producer.  An exception from
``local_transaction`` leaves the half message unresolved (for check-back) and propagates;
one from ``check_local_transaction`` counts as UNKNOWN.

Concurrency: a ``TransactionProducer`` belongs to one event loop; use
``client.sync.SyncTransactionProducer`` from threads.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import crc32c as _crc32c

from sluice import errors
from sluice.client.arguments import argument_error, check_partition
from sluice.client.cluster import Cluster
from sluice.client.config import TransactionProducerConfig
from sluice.client.framing import record_size, tail_size
from sluice.client.transport import ConnectionFactory
from sluice.config import TopicConfig
from sluice.protocol import messages as m
from sluice.protocol import transactions as tx
from sluice.protocol.records import HEADER_SIZE

__all__ = [
    "DelayedMessages",
    "DelayedProducer",
    "LocalTransactionState",
    "TransactionMessage",
    "TransactionProducer",
    "TransactionResult",
    "format_id",
    "parse_id",
    "split_delayed",
]

log = logging.getLogger("sluice.client.transaction")

format_id = tx.format_id
parse_id = tx.parse_id
_BACKOFF, _BACKOFF_MAX = 0.1, 1.0
SEQ_MOD = 1 << 31  # sequences wrap at 2**31 (storage/producers.py)
MAX_EPOCH = (1 << 15) - 1


class LocalTransactionState(enum.Enum):
    """What the application's local transaction says about a half message."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class TransactionMessage:
    """The message of a transaction, as ``local_transaction`` and
    ``check_local_transaction`` get it.  ``txn_id`` is ``topic/partition/offset`` of its
    half message; ``checks`` is 0 in ``local_transaction``, n in the n-th check."""

    txn_id: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    checks: int = 0


@dataclass(frozen=True)
class DelayedMessages:
    """What one ``send_delayed`` stored: ``count`` messages as one batch at ``offset`` of
    ``topic``-``partition``, due at ``deliver_at_ms``.  ``id`` (``topic/partition/offset``)
    names the batch to ``DelayedProducer.deliver_now`` and ``cancel``, and to ``sluice txn
    commit`` / ``rollback``; ``sluice txn list --delayed`` lists it by the same id."""

    id: str
    topic: str
    partition: int
    offset: int
    count: int
    deliver_at_ms: int


@dataclass(frozen=True)
class TransactionResult:
    """The outcome of ``send_in_transaction``.

    ``state``: ``"committed"`` (visible at ``offset``), ``"rolled_back"`` (never visible;
    ``offset`` is the rollback marker's) or ``"unknown"`` (left to check-back; ``offset``
    is -1).  ``local_state`` is what ``local_transaction`` returned.
    """

    txn_id: str
    topic: str
    partition: int
    half_offset: int
    state: str
    offset: int
    local_state: LocalTransactionState


LocalTransaction = Callable[[TransactionMessage], "LocalTransactionState | Awaitable[LocalTransactionState]"]


def _state_of(value) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    try:
        return LocalTransactionState(value)
    except ValueError:
        raise errors.ClientError(
            f"a local transaction returned {value!r}, not a LocalTransactionState; the half message "
            "is left to check-back"
        ) from None


class TransactionProducer:
    """Sends transactional messages for producer group ``group``; see the module docstring."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        config: TransactionProducerConfig | None = None,
        *,
        connection_factory: ConnectionFactory | None = None,
        **options,
    ) -> None:
        """``config``: client/config.py's ``TransactionProducerConfig``; keyword arguments
        ``options`` are settings too (``group=...`` …), over ``config``.  ``ConfigError``
        for a bad one, ``TypeError`` for a keyword that is no setting."""
        config = self.config = TransactionProducerConfig.of(config, **options)
        self.group = config.group
        self.check_local_transaction = config.check_local_transaction
        self.request_timeout = config.request_timeout_ms / 1000
        self.retry_timeout = config.retry_timeout_ms / 1000
        self.register_interval = config.register_interval_ms / 1000
        self._cluster = Cluster(
            bootstrap, connection_factory=connection_factory,
            connect_timeout=config.connect_timeout_ms / 1000, request_timeout=self.request_timeout,
        )
        self._registered: weakref.WeakSet = weakref.WeakSet()
        self._checking: set[str] = set()  # ids whose check runs here now
        self._tasks: set[asyncio.Task] = set()
        self._registrar: asyncio.Task | None = None
        self._closed = False
        self._identity: tuple[int, int] | None = None  # idempotent producer id, epoch of halves
        self._sequences: dict[tuple[str, int], int] = {}  # next half's sequence per partition
        self._sending: dict[tuple[str, int], asyncio.Lock] = {}  # one half in flight per partition

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect, and register the group with every broker (checks may come at once)."""
        await self._cluster.refresh()
        await self._register_all()
        self._registrar = asyncio.get_running_loop().create_task(self._keep_registered(), name="sluice-txn-register")

    async def close(self) -> None:
        """Stop answering checks and close the connections.  Idempotent."""
        self._closed = True
        tasks = [t for t in (self._registrar, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cluster.close()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _keep_registered(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(self.register_interval)
            rounds += 1
            try:
                if rounds % 5 == 0:  # brokers join and leave: learn them now and then
                    await self._cluster.refresh()
                await self._register_all()
            except asyncio.CancelledError:
                raise
            except errors.SluiceError as exc:
                log.debug("registering group %r: %s", self.group, exc)

    async def _register_all(self) -> None:
        """Register the group on a connection to every known broker that lacks it."""
        for node in list(self._cluster.brokers):
            try:
                conn = await self._cluster.connection(node)
                if conn in self._registered:
                    continue
                conn.on_push = self._on_push
                await conn.request(m.RegisterProducerRequest(group=self.group), (), self.request_timeout)
                self._registered.add(conn)
            except (errors.ConnectionClosed, errors.RequestTimedOut, errors.BrokerShuttingDown) as exc:
                self._cluster.node_failed(node)
                log.debug("cannot register group %r with broker %d: %s", self.group, node, exc)

    # ------------------------------------------------------------------ sending

    async def send_in_transaction(
        self,
        topic: str,
        value: bytes | None,
        local_transaction: LocalTransaction,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
    ) -> TransactionResult:
        """Store a half message, run ``local_transaction``, end the transaction with its
        answer; see the module docstring.  Raises what storing the half raised (nothing
        to end then; ``maybe_stored`` says whether a half may exist, which check-back then
        settles), or what ``local_transaction`` raised (the half is left to check-back)."""
        msg = await self.send_half(topic, value, key=key, headers=headers, partition=partition)
        result = local_transaction(msg)
        if inspect.isawaitable(result):
            result = await result
        return await self.finish(msg, _state_of(result))

    async def send_half(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
    ) -> TransactionMessage:
        """Step 1 alone: store the half message (``acks=all``, idempotently: see
        ``_store_half``); return its message."""
        if self._closed:
            raise errors.ClientClosed("the transaction producer is closed")
        hdrs = tuple((str(k), v) for k, v in (headers or ()))
        now = int(time.time() * 1000)
        p = await self._partition_for(topic, key, partition)
        offset = await self._store_half(topic, p, lambda producer: tx.half_batch(
            self.group, key, value, hdrs, now, producer,
        ))
        return TransactionMessage(tx.format_id(topic, p, offset), topic, p, offset, key, value, hdrs, now)

    async def send_delayed(
        self,
        topic: str,
        messages: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
        *,
        deliver_at_ms: int | None = None,
        delay_ms: int | None = None,
        partition: int | None = None,
    ) -> DelayedMessages:
        """Store ``messages`` (``(key, value, headers)``) as delayed messages: durable once
        this returns, invisible to every reader until ``deliver_at_ms`` (ms since the
        epoch) or ``delay_ms`` from now, then delivered into their partition (the first
        message's key chooses it, unless ``partition``).  One stored batch for all of them,
        so send the messages of one time together.  Returns where the batch is stored
        (``DelayedMessages``: its id, partition and offset)."""
        if self._closed:
            raise errors.ClientClosed("the transaction producer is closed")
        now = int(time.time() * 1000)
        if (deliver_at_ms is None) == (delay_ms is None):
            raise errors.ConfigError("give one of deliver_at_ms and delay_ms")
        for name, ms in (("deliver_at_ms", deliver_at_ms), ("delay_ms", delay_ms)):
            if ms is not None and type(ms) is not int:  # 2.0 * 1000 once stored a message never delivered
                raise TypeError(f"{name} must be an int (milliseconds), not {type(ms).__name__}")
        check_partition(partition)
        if delay_ms is not None and delay_ms < 0:
            raise errors.ConfigError(f"delay_ms must be at least 0, got {delay_ms}")
        at = deliver_at_ms if deliver_at_ms is not None else now + delay_ms
        if not now - tx.MAX_DELAY_MS <= at <= now + tx.MAX_DELAY_MS or at <= 0:
            raise errors.ConfigError(f"a delivery time must be within {tx.MAX_DELAY_MS // 86_400_000} days of now")
        if not messages:
            raise errors.ConfigError("no messages to send")
        for one in messages:
            if not (isinstance(one, tuple | list) and len(one) == 3):
                raise TypeError(f"messages are (key, value, headers) triples, not {one!r:.60}")
            wrong = argument_error(topic, one[1], one[0], one[2], partition, None)
            if wrong is not None:
                raise wrong
        recs = [(k, v, tuple((str(hk), hv) for hk, hv in (h or ()))) for k, v, h in messages]
        p = await self._partition_for(topic, recs[0][0], partition)
        offset = await self._store_half(topic, p, lambda producer: tx.delayed_batch(recs, at, now, producer))
        return DelayedMessages(tx.format_id(topic, p, offset), topic, p, offset, len(recs), at)

    async def _store_half(self, topic: str, p: int, build) -> int:
        """Store the half message ``build((producer id, epoch, sequence))`` makes in
        ``topic``-``p`` (``acks=all``); its offset.

        Halves are sent idempotently: this producer's id (INIT_PRODUCER_ID) and a sequence
        per partition, one half in flight per partition, so a retry after an unknown
        outcome (a lost connection, a timeout, a leader change) is stored once and answered
        with the first copy's offset.  A gap the broker reports (a half given up on was
        never stored) starts a new epoch at sequence 0."""
        deadline = time.monotonic() + self.retry_timeout
        tp = (topic, p)
        lock = self._sending.setdefault(tp, asyncio.Lock())
        async with lock:
            pid, epoch = await self._producer_identity()
            seq = self._sequences.get(tp, 0)
            batch = build((pid, epoch, seq))
            delay = _BACKOFF
            maybe_stored = False  # some attempt's outcome is unknown: this half may be stored
            while True:
                in_flight = False
                try:
                    conn = await self._leader(topic, p)
                    req = m.ProduceRequestV2(
                        partitions=[m.ProducePartition(topic=topic, partition=p, size=len(batch))],
                        acks=m.ACKS_ALL, timeout_ms=int(self.request_timeout * 1000),
                    )
                    in_flight = True
                    response, _ = await conn.request(req, (batch,), self.request_timeout + 5)
                    in_flight = False
                    result = response.partitions[0]
                    if result.error:
                        raise errors.error_for_code(result.error, result.message)
                    offset = result.batch_offsets[0] if result.batch_offsets else result.base_offset
                    if offset < 0:
                        raise errors.ClientError(f"half message {seq} of {tp} stored too long ago to locate")
                    self._sequences[tp] = (seq + 1) % SEQ_MOD
                    return offset
                except errors.OutOfOrderSequence:
                    # an earlier half given up on was never stored: a new epoch, from 0
                    maybe_stored = False  # nothing of this half under the old epoch either
                    pid, epoch = self._new_epoch()
                    seq = 0
                    batch = build((pid, epoch, seq))
                    if time.monotonic() + delay > deadline:
                        raise
                    continue
                except errors.BrokerError as exc:
                    if isinstance(exc, errors.NotLeader):
                        self._cluster.mark_stale(topic)
                    maybe_stored = maybe_stored or (in_flight or not exc.appended_nothing)
                    if not exc.retriable or time.monotonic() + delay > deadline:
                        self._give_up(tp, seq, maybe_stored)
                        raise errors.send_failure(exc, maybe_stored=maybe_stored) from exc
                except errors.ConnectionClosed as exc:
                    maybe_stored = maybe_stored or in_flight
                    if time.monotonic() + delay > deadline:
                        self._give_up(tp, seq, maybe_stored)
                        raise errors.send_failure(exc, maybe_stored=maybe_stored) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)

    async def _producer_identity(self) -> tuple[int, int]:
        if self._identity is None:
            resp, _ = await self._cluster.request(m.InitProducerIdRequest(), (), self.request_timeout)
            errors.raise_for_code(resp.error, resp.message)
            self._identity = (resp.producer_id, resp.producer_epoch)
        return self._identity

    def _new_epoch(self) -> tuple[int, int]:
        pid, epoch = self._identity
        self._identity = (pid, epoch + 1) if epoch < MAX_EPOCH else None
        self._sequences.clear()  # every partition starts the new epoch where it likes
        if self._identity is None:  # epochs exhausted: the next half asks for a new id
            raise errors.ClientError("producer epochs exhausted; the next half takes a new producer id")
        return self._identity

    def _give_up(self, tp, seq: int, maybe_stored: bool) -> None:
        """After a half failed for good: if it may be stored, the next half follows it
        (a gap, if it was not, starts a new epoch)."""
        if maybe_stored:
            self._sequences[tp] = (seq + 1) % SEQ_MOD

    async def finish(self, msg: TransactionMessage, state: LocalTransactionState) -> TransactionResult:
        """Step 3 alone: end the half of ``msg`` as ``state`` says (UNKNOWN: nothing)."""
        if state is LocalTransactionState.UNKNOWN:
            return TransactionResult(msg.txn_id, msg.topic, msg.partition, msg.offset, "unknown", -1, state)
        resp = await self.end_transaction(msg.txn_id, commit=state is LocalTransactionState.COMMIT)
        return TransactionResult(msg.txn_id, msg.topic, msg.partition, msg.offset, resp.state, resp.offset, state)

    async def end_transaction(self, txn_id: str, commit: bool, *, from_check: bool = False) -> m.EndTransactionResponse:
        """Commit or roll back a half message by id (``topic/partition/offset``), retrying
        retriable failures until ``retry_timeout_ms``.  ``TransactionEnded`` if it was
        ended the other way, ``UnknownTransaction`` if there is no such half message."""
        try:
            topic, p, offset = tx.parse_id(txn_id)
        except ValueError as exc:
            raise errors.ConfigError(str(exc)) from None
        return await end_transaction(self._cluster, topic, p, offset, commit, self.retry_timeout,
                                     self.request_timeout, from_check=from_check)

    # ------------------------------------------------------------------ check-back

    def _on_push(self, key: int, _version: int, push, _attachments) -> None:
        if key != m.Push.CHECK_TRANSACTION or self._closed or push.group != self.group:
            return
        txn_id = tx.format_id(push.topic, push.partition, push.offset)
        if txn_id in self._checking:
            return  # the last check of it is still running here
        self._checking.add(txn_id)
        task = asyncio.get_running_loop().create_task(self._check(txn_id, push))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, txn_id: str, push: m.CheckTransaction) -> None:
        try:
            check = self.check_local_transaction
            if check is None:
                log.warning("%s: checked back, but no check_local_transaction is set", txn_id)
                return
            msg = TransactionMessage(
                txn_id, push.topic, push.partition, push.offset, push.key, push.value,
                tuple((k, v) for k, v in push.headers), push.timestamp, push.checks,
            )
            try:
                if inspect.iscoroutinefunction(check):
                    state = _state_of(await check(msg))
                else:
                    state = _state_of(await asyncio.to_thread(check, msg))
            except Exception:  # noqa: BLE001 - the application's failure: asked again later
                log.exception("%s: check_local_transaction failed; treated as UNKNOWN", txn_id)
                return
            if state is LocalTransactionState.UNKNOWN:
                return
            try:
                await self.end_transaction(txn_id, commit=state is LocalTransactionState.COMMIT, from_check=True)
            except errors.SluiceError as exc:
                log.warning("%s: ending it after a check failed: %s", txn_id, exc)
        finally:
            self._checking.discard(txn_id)

    # ------------------------------------------------------------------ routing

    async def max_message_bytes(self, topic: str) -> int:
        """The largest batch ``topic`` stores (its ``max.message.bytes``, from metadata):
        what one ``send_delayed`` or half message may take, batch header included
        (``split_delayed`` splits messages to fit); a broker that does
        not say gets the default's."""
        return (await self._topic_info(topic)).max_message_bytes or TopicConfig.max_message_bytes

    async def _topic_info(self, topic: str):
        info = self._cluster.topic(topic)
        if info is None:
            await self._cluster.refresh([topic])
            info = self._cluster.topic(topic)
            if info is None:
                err = self._cluster.unknown.get(topic)
                raise err if err is not None else errors.UnknownTopic(f"unknown topic {topic!r}")
        return info

    async def _partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        n = (await self._topic_info(topic)).partitions
        if partition is not None:
            if not 0 <= partition < n:
                raise errors.unknown_partition(topic, partition, n)
            return partition
        if key is not None:
            return _crc32c.crc32c(key) % n
        return random.randrange(n)

    async def _leader(self, topic: str, partition: int):
        return await leader_connection(self._cluster, topic, partition)


async def leader_connection(cluster: Cluster, topic: str, partition: int):
    """The connection to the leader of ``topic``-``partition`` (metadata asked when unknown)."""
    leader = cluster.leader(topic, partition)
    if leader < 0:
        await cluster.refresh([topic])
        info = cluster.topic(topic)
        if info is None:
            err = cluster.unknown.get(topic)
            raise err if err is not None else errors.UnknownTopic(f"unknown topic {topic!r}")
        if not 0 <= partition < info.partitions:
            raise errors.unknown_partition(topic, partition, info.partitions)
        leader = cluster.leader(topic, partition)
        if leader < 0:
            raise errors.NotLeader(f"{topic}-{partition} has no leader now")
    return await cluster.connection(leader)


async def end_transaction(
    cluster: Cluster, topic: str, partition: int, offset: int, commit: bool,
    retry_timeout: float, request_timeout: float, *, from_check: bool = False,
) -> m.EndTransactionResponse:
    """END_TRANSACTION at the partition's leader, retried on retriable errors (moved
    leader, lost connection, a broker restarting, a timeout) until ``retry_timeout``.
    Shared by ``TransactionProducer`` and the admin client (``sluice txn``)."""
    deadline = time.monotonic() + retry_timeout
    delay = _BACKOFF
    req = m.EndTransactionRequest(
        topic=topic, partition=partition, offset=offset, commit=commit, from_check=from_check,
        timeout_ms=int(request_timeout * 1000),
    )
    while True:
        try:
            conn = await leader_connection(cluster, topic, partition)
            response, _ = await conn.request(req, (), request_timeout + 5)
            return response
        except (errors.BrokerError, errors.ConnectionClosed) as exc:
            if isinstance(exc, errors.NotLeader | errors.ConnectionClosed):
                cluster.mark_stale(topic)
            if not exc.retriable or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, _BACKOFF_MAX)


class DelayedProducer(TransactionProducer):
    """Sends delayed messages (``send_delayed``): a ``TransactionProducer`` of the producer
    group ``sluice.delay``, whose half messages the brokers commit when they fall due."""

    def __init__(self, bootstrap: str | Sequence[str], **config) -> None:
        super().__init__(bootstrap, group=tx.DELAY_GROUP, **config)

    async def deliver_now(self, delayed: DelayedMessages | str) -> m.EndTransactionResponse:
        """Deliver pending delayed messages at once (``delayed``: what ``send_delayed``
        returned, or its id).  ``TransactionEnded`` if they were cancelled;
        ``UnknownTransaction`` if there is no such stored batch."""
        return await self.end_transaction(_delayed_id(delayed), commit=True)

    async def cancel(self, delayed: DelayedMessages | str) -> m.EndTransactionResponse:
        """Cancel pending delayed messages: they are never delivered.  ``TransactionEnded``
        if they were delivered already (they fell due, or ``deliver_now``)."""
        return await self.end_transaction(_delayed_id(delayed), commit=False)


def _delayed_id(delayed: DelayedMessages | str) -> str:
    return delayed.id if isinstance(delayed, DelayedMessages) else delayed


def split_delayed(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    deliver_at_ms: int,
    max_batch_bytes: int,
    max_count: int | None = None,
) -> list[list]:
    """``records`` in order, in runs whose ``tx.delayed_batch`` (due at ``deliver_at_ms``)
    is at most ``max_batch_bytes`` (the topic's ``max.message.bytes``) and, with
    ``max_count``, holds at most that many records.  Sizes are exact: each record as it
    would be encoded at its place in its run, with the headers ``delayed_batch`` adds.  A
    record too large for a batch on its own is a run of its own, for the broker to refuse."""
    added = [(tx.GROUP_HEADER, tx.DELAY_GROUP.encode()), (tx.DELIVER_AT_HEADER, str(deliver_at_ms).encode())]
    room = max_batch_bytes - HEADER_SIZE
    runs: list[list] = []
    run: list = []
    size = 0
    for rec in records:
        key, value, headers = rec
        tail = tail_size(key, value, [*headers, *added])
        if run and (size + record_size(tail, 0, len(run)) > room or max_count is not None and len(run) >= max_count):
            runs.append(run)
            run, size = [], 0
        size += record_size(tail, 0, len(run))
        run.append(rec)
    if run:
        runs.append(run)
    return runs
