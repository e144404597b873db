"""Blocking facades over the asyncio clients, for the CLI, scripts and Spark executors.

Each facade owns a private event loop running in a daemon thread (client/loop_thread.py)
and forwards calls with ``asyncio.run_coroutine_threadsafe``; the asyncio client is created inside that loop on first
use.  The facades are safe to call from any thread (calls are serialised onto the loop).
``close()`` is final: calls still blocked in other threads then fail with ``ClientClosed``,
and so does every later call (a closed facade never reopens).  They pickle as their
configuration only: an unpickled facade opens its own connections on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from sluice import errors
from sluice.client.admin import Admin
from sluice.client.consumer import Consumer
from sluice.client.framing import tail_size
from sluice.client.loop_thread import LoopThread
from sluice.client.outbox import Outbox as _PyOutbox
from sluice.client.producer import Producer
from sluice.client.record_future import FutureGroup, RecordFuture
from sluice.client.subscriber import Message, Subscriber
from sluice.client.transaction import TransactionProducer, _state_of
from sluice.protocol import records

__all__ = ["SyncProducer", "SyncConsumer", "SyncAdmin", "SyncTransactionProducer"]

_Outbox = records._C.Outbox if records._C is not None else _PyOutbox


class _SyncBase:
    _client_cls: type
    _thread_name = "sluice-client"

    def __init__(self, bootstrap, **config) -> None:
        # The client itself is made on first use (in its loop thread), but its settings are
        # checked now: a bad one (ConfigError, TypeError) fails here, not at the first call.
        self._client_cls(bootstrap, **config)
        self._bootstrap = bootstrap
        self._config = config
        self._lt: LoopThread | None = None
        self._client = None
        self._closed = False
        self._lock = threading.Lock()  # guards _lt, _client, _closed

    def __getstate__(self):
        return {"bootstrap": self._bootstrap, "config": self._config}

    def __setstate__(self, state) -> None:
        self.__init__(state["bootstrap"], **state["config"])

    def _ensure(self) -> tuple:
        """``(client, loop thread)``, created on first use; ``ClientClosed`` once closed."""
        lt, client = self._lt, self._client  # _lt is set last, under the lock
        if lt is not None and not self._closed:
            return client, lt
        with self._lock:
            if self._closed:
                raise errors.ClientClosed(f"{type(self).__name__} is closed")
            if self._client is None:
                lt = LoopThread(self._thread_name)
                try:
                    self._client = lt.run(self._create())
                except BaseException:
                    lt.stop()
                    raise
                self._lt = lt
                self._bind(self._client)
            return self._client, self._lt

    def _bind(self, client) -> None:
        """``client`` now runs, in the loop thread ``_lt`` (called under ``_lock``)."""

    def _unbind(self) -> None:
        """The facade closes: its client is about to go (called under ``_lock``)."""

    async def _create(self):
        client = self._client_cls(self._bootstrap, **self._config)
        await client.start()
        return client

    def _call(self, coro_fn, *args, **kw):
        client, lt = self._ensure()
        return lt.run(coro_fn(client, *args, **kw))

    def close(self) -> None:
        """Close the client (flushing a producer) and stop the loop thread.  Idempotent.

        Calls blocked in other threads fail with ``ClientClosed``; so do later calls.
        """
        with self._lock:
            self._unbind()
            self._closed = True
            client, lt = self._client, self._lt
            self._client = self._lt = None
        if client is not None:
            try:
                lt.run(client.close())
            finally:
                lt.stop()

    def __enter__(self):
        self._ensure()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncProducer(_SyncBase):
    """Blocking ``Producer``: ``send`` returns at once a ``concurrent.futures.Future`` of
    the record's ``RecordMetadata``.

    ``send`` hands records to the loop thread in chunks (one wake-up of the loop for all
    records sent meanwhile) and does not wait for them to be buffered, except while buffer
    memory is full (it blocks until the record is buffered, up to ``max_block_ms``), and
    for a record to a topic not seen yet or near the topic's size limit: that one is
    buffered before ``send`` returns, and ``send`` raises its ``UnknownTopic`` or
    ``MessageTooLarge`` as before.
    Records of one thread keep their send order.  An error that keeps a record from being
    buffered (``MessageTooLarge``, ``UnknownTopic``, ``BufferExhausted``, an encoding error)
    fails its future, and the next ``flush()`` raises the first such error, so a plain loop
    of sends and a flush sees it.  ``flush()`` and ``close()`` first hand over and buffer
    every record sent before them.

    Takes every ``Producer`` setting, among them the idempotence ones:
    ``enable_idempotence``, ``max_in_flight_per_partition``, and an explicit identity
    ``producer_id`` / ``producer_epoch`` (checked when the producer is created on first
    use).  A pickled facade carries its identity: each unpickled copy writes as the same
    producer, so give each writer its own id or epoch."""

    _client_cls = Producer
    _thread_name = "sluice-producer"

    def __init__(self, bootstrap, **config) -> None:
        super().__init__(bootstrap, **config)
        self._unbuffered: list[BaseException] = []  # errors for the next flush to raise
        self._future_group = FutureGroup()  # what the RecordFutures share
        # Records sent, not handed to the loop yet (see client/outbox.py).  Sent minus handed
        # bytes of values is what it holds (approximately, with several sending threads
        # going the Python way: a sender's += may be lost; it only informs backpressure).
        self._outbox = _Outbox(
            self, SyncProducer.send, deque(), RecordFuture, self._future_group, _MARGIN,
            self._buffer_all, self._schedule_hand_over,
        )
        if _Outbox is not _PyOutbox and type(self).send is SyncProducer.send:  # a subclass's own send stays
            self.send = self._outbox.send

    async def _create(self):
        client = await super()._create()
        client.on_unbuffered = self._unbuffered.append
        return client

    def _bind(self, client: Producer) -> None:
        self._outbox.bind(client)  # the compiled send goes through it from now on

    def _unbind(self) -> None:
        self._outbox.unbind()

    def _ensure(self) -> tuple:
        """As ``_SyncBase._ensure``; every call of a producer sends, so its ``ClientClosed``
        is a send refused before anything was buffered (``maybe_stored`` False)."""
        try:
            return super()._ensure()
        except errors.ClientClosed as exc:
            errors.unbuffered(exc)
            raise

    def send(
        self, topic: str, value: bytes | None, *, key: bytes | None = None, headers=None,
        partition: int | None = None, timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future:
        """Queue one record for the producer's loop; return a future of its metadata."""
        client, lt = self._ensure()
        if not _surely_fits(client, topic, key, value, headers):
            # topic not known yet, or the record near the size limit: wait until it is
            # buffered (after every record before it), so that its errors raise here
            return lt.run(self._hand_over_then(client, _chained_send, topic, value, key=key, headers=headers,
                                               partition=partition, timestamp_ms=timestamp_ms))
        cf = RecordFuture(self._future_group)
        outbox = self._outbox
        outbox.items.append((topic, value, key, headers, partition, timestamp_ms, cf))
        outbox.sent_bytes += len(value) if value is not None else 0
        mem = client.state.memory
        if mem.used + outbox.sent_bytes - outbox.handed_bytes > mem.limit:
            self._buffer_all(client)
        elif not outbox.handing:
            outbox.handing = True
            self._schedule_hand_over(client)
        return cf

    def _buffer_all(self, client: Producer) -> None:
        """Block until every record sent before is buffered (buffer memory is short)."""
        self._loop_thread().run(self._hand_over_and_buffer(client))

    def _schedule_hand_over(self, client: Producer) -> None:
        """Hand every record sent over to the loop soon (``_hand_over``), without waiting."""
        self._loop_thread().call_soon(self._outbox.hand_over, client)

    def _loop_thread(self) -> LoopThread:
        lt = self._lt
        if lt is None:  # closed by another thread meanwhile
            raise errors.unbuffered(errors.ClientClosed(f"{type(self).__name__} is closed"))
        return lt

    def _hand_over(self, client: Producer) -> None:
        """On the loop: buffer (or queue in the producer's waiting line) every record sent."""
        self._outbox.hand_over(client)

    async def _hand_over_then(self, client: Producer, fn, *args, **kw):
        self._hand_over(client)
        await client.state.line.drained()
        return await fn(client, *args, **kw)

    async def _hand_over_and_buffer(self, client: Producer) -> None:
        self._hand_over(client)
        await client.state.line.drained()

    def _failed_immediately(self) -> BaseException | None:
        errs = self._unbuffered.copy()  # in place: the producer appends to this list
        del self._unbuffered[: len(errs)]
        return errs[0] if errs else None

    def send_many(self, topic: str, values: Sequence[bytes], **kw) -> concurrent.futures.Future:
        return self._call(_chained_send_many, topic, values, **kw)

    def send_batch(self, messages: Iterable, topic: str | None = None) -> concurrent.futures.Future:
        """Buffer many records in one hop onto the loop; return one future for the lot.

        With ``topic``, each message is a value (``bytes`` or None) or a ``(key, value)``
        pair.  Without it, each message is a tuple ``(topic, value[, key[, headers[,
        partition]]])`` (trailing fields may be left out or None).  Anything else raises
        ``ConfigError`` naming the message, before any record is buffered.  Each record goes
        through ``Producer.send``: its own partitioning, size checks and memory wait.  The
        future resolves to the number of records once every one is acknowledged, or fails
        with the first failure.  Raises at once where ``send`` would; the records buffered
        before the failing one are still sent.
        """
        return self._call(_send_batch, [_message(i, m, topic) for i, m in enumerate(messages)])

    def send_each(self, messages: Iterable[tuple]) -> list:
        """Buffer many records in one hop onto the loop, each on its own.

        Each message is ``(topic, value, key, headers, partition)``.  Returns, per message
        in order, a ``concurrent.futures.Future`` of its ``RecordMetadata``, or the
        ``SluiceError`` ``send`` raised for it at once (nothing of that one was buffered;
        the others still are).
        """
        return self._call(_send_each, messages)

    def flush(self) -> None:
        """Buffer every record sent before, send everything and wait until it is acked or
        failed; then raise the first error that kept a record sent since the last flush
        from being buffered (its future carries it too)."""
        self._call(self._flush_all)
        exc = self._failed_immediately()
        if exc is not None:
            raise exc

    async def _flush_all(self, client: Producer) -> None:
        self._hand_over(client)
        await client.flush()

    def close(self) -> None:
        """Buffer every record sent before, then close as ``_SyncBase.close`` does."""
        with self._lock:
            client, lt = self._client, self._lt
        if client is not None:
            try:
                lt.run(self._hand_over_and_buffer(client))
            except errors.SluiceError:
                pass  # closed meanwhile by another thread: close() below fails what is left
        super().close()


class SyncTransactionProducer(_SyncBase):
    """Blocking ``TransactionProducer``.  ``local_transaction`` runs in the calling thread
    (between storing the half message and ending it); ``check_local_transaction`` runs in
    a worker thread of the client.  It starts (registers its group for check-back) on
    first use or on ``with``."""

    _client_cls = TransactionProducer
    _thread_name = "sluice-txn-producer"

    def send_in_transaction(self, topic: str, value: bytes | None, local_transaction, **kw):
        msg = self._call(TransactionProducer.send_half, topic, value, **kw)
        state = _state_of(local_transaction(msg))
        return self._call(TransactionProducer.finish, msg, state)

    def end_transaction(self, txn_id: str, commit: bool):
        return self._call(TransactionProducer.end_transaction, txn_id, commit)


async def _chained(afut: asyncio.Future) -> concurrent.futures.Future:
    cf: concurrent.futures.Future = concurrent.futures.Future()
    cf.set_running_or_notify_cancel()

    def copy(f: asyncio.Future) -> None:
        if f.cancelled():
            cf.set_exception(errors.ClientClosed("send cancelled"))
        elif f.exception() is not None:
            cf.set_exception(f.exception())
        else:
            cf.set_result(f.result())

    afut.add_done_callback(copy)
    return cf


def _surely_fits(client: Producer, topic: str, key, value, headers) -> bool:
    """Whether a record can be handed over without waiting for its errors: its topic's
    metadata is known and it is well within the topic's size limit (a read of the loop's
    metadata from another thread: a stale answer only sends the record the blocking way).
    A record of bytes without headers is sized from the producer's route of the topic."""
    state = client.state
    info = state.topics.get(topic)
    if info is None:
        return False
    route = state.routes.get(topic)
    if (
        route is not None and route[0] is info and headers is None
        and value.__class__ is bytes and (key is None or key.__class__ is bytes)
    ):
        return len(value) + (0 if key is None else len(key)) + _MARGIN <= route[2]
    try:
        tail = tail_size(key, value, headers)
    except (TypeError, AttributeError):
        return False  # let send() raise it
    return tail + _MARGIN <= state.max_batch_bytes(info)


# bytes of a record and its batch beside its key, value and headers, with room to spare
_MARGIN = 64 + records.HEADER_SIZE


async def _chained_send(p: Producer, topic, value, **kw):
    return await _chained(await p.send(topic, value, **kw))


async def _chained_send_many(p: Producer, topic, values, **kw):
    return await _chained(await p.send_many(topic, values, **kw))


def _message(index: int, msg, topic: str | None) -> tuple:
    """One ``send_batch`` message as ``(topic, value, key, headers, partition)``."""
    if topic is not None:
        if msg is None or isinstance(msg, bytes | bytearray | memoryview):
            return topic, msg, None, None, None
        if isinstance(msg, tuple) and len(msg) == 2:
            return topic, msg[1], msg[0], None, None
        raise errors.ConfigError(
            f"send_batch(topic=...) takes values or (key, value) pairs; message {index} is "
            f"{type(msg).__name__}{f' of {len(msg)} items' if isinstance(msg, tuple) else ''}"
        )
    if isinstance(msg, tuple) and 2 <= len(msg) <= 5 and isinstance(msg[0], str):
        return msg if len(msg) == 5 else (*msg, *(None,) * (5 - len(msg)))
    raise errors.ConfigError(
        f"send_batch takes (topic, value[, key[, headers[, partition]]]) tuples, or values "
        f"and (key, value) pairs with topic=...; message {index} is {msg!r:.60}"
    )


async def _send_batch(p: Producer, messages):
    futs = [
        await p.send(topic, value, key=key, headers=headers, partition=partition)
        for topic, value, key, headers, partition in messages
    ]
    return await _chained(asyncio.ensure_future(_count(asyncio.gather(*futs))))


async def _send_each(p: Producer, messages) -> list:
    out: list = []
    for topic, value, key, headers, partition in messages:
        try:
            out.append(await _chained(await p.send(topic, value, key=key, headers=headers, partition=partition)))
        except errors.SluiceError as exc:
            out.append(exc)
    return out


async def _count(fut) -> int:
    return len(await fut)


def _materialized(items):
    """An argument a consumer method iterates, listed in the calling thread (a generator
    is not shared with the loop thread); a str, bytes or tuple as is, so that ``Consumer``
    refuses a bare name or pair (``TypeError``) instead of taking its letters."""
    return items if isinstance(items, str | bytes | tuple) else list(items)


class SyncConsumer(_SyncBase):
    """Blocking ``Consumer``.  ``assign`` / ``subscribe`` / ``seek`` may be called before
    first use; iteration yields records, blocking up to ``poll_timeout_ms`` per poll.

    Iteration advances the position past each record as it is yielded, never further:
    after a ``break``, ``position`` and ``commit`` stand right after the last record the
    loop body saw, and ``getmany`` returns the records iteration had fetched but not
    yielded.  A seek (or new assignment) made through this facade during iteration drops
    the records fetched before it.  Iteration ends when the consumer is closed.
    """

    _client_cls = Consumer
    _thread_name = "sluice-consumer"

    def __init__(self, bootstrap, **config) -> None:
        super().__init__(bootstrap, **config)
        self._generation = 0  # bumped by calls that move positions; iteration re-fetches

    def assign(self, partitions) -> None:
        self._generation += 1
        self._call(_run_sync, Consumer.assign, _materialized(partitions))

    def subscribe(self, topics) -> None:
        self._generation += 1
        self._call(_run_sync, Consumer.subscribe, _materialized(topics))

    def assignment(self) -> list:
        return self._call(_run_sync, Consumer.assignment)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._generation += 1
        self._call(_run_sync, Consumer.seek, topic, partition, offset)

    def position(self, tp):
        return self._call(_run_sync, Consumer.position, tuple(tp))

    def seek_to_beginning(self, *tps) -> None:
        self._generation += 1
        self._call(Consumer.seek_to_beginning, *tps)

    def seek_to_end(self, *tps) -> None:
        self._generation += 1
        self._call(Consumer.seek_to_end, *tps)

    def seek_to_time(self, timestamp_ms: int, *tps) -> None:
        self._generation += 1
        self._call(Consumer.seek_to_time, timestamp_ms, *tps)

    def start(self) -> None:
        """Connect to the bootstrap brokers now (the first call that needs them does
        otherwise), as ``await Consumer.start()``."""
        self._call(Consumer.start)

    def getmany(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        self._generation += 1
        return self._call(Consumer.getmany, timeout_ms, max_records)

    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        """The records ready, waiting up to ``timeout_ms`` for some: ``getmany``."""
        return self.getmany(timeout_ms, max_records)

    def commit(self, offsets=None) -> None:
        self._call(Consumer.commit, offsets)

    def committed(self, tp):
        return self._call(Consumer.committed, tuple(tp))

    def __iter__(self) -> Iterator:
        while True:
            try:
                client, lt = self._ensure()
                chunk = lt.run(client._next_chunk(500))
            except errors.ClientClosed:
                return
            generation = self._generation
            for rec in chunk:
                if self._generation != generation:
                    break  # sought meanwhile: these records are stale
                try:
                    # FIFO with later calls from this thread: position() or commit() in
                    # the loop body already see this record as consumed.
                    lt.call_soon(client._handed_out, rec)
                except errors.ClientClosed:
                    return
                yield rec


async def _run_sync(client, fn, *args):
    return fn(client, *args)


class SyncAdmin(_SyncBase):
    """Blocking ``Admin``."""

    _client_cls = Admin
    _thread_name = "sluice-admin"

    def create_topic(self, name: str, partitions: int = 1, config=None, replication_factor: int = 0) -> None:
        self._call(Admin.create_topic, name, partitions, config, replication_factor)

    def delete_topic(self, name: str) -> None:
        self._call(Admin.delete_topic, name)

    def list_topics(self, include_internal: bool = False):
        return self._call(Admin.list_topics, include_internal)

    def describe_topic(self, name: str):
        return self._call(Admin.describe_topic, name)

    def list_offsets(self, topic: str, partitions=None, timestamp: int = -1) -> dict[int, int]:
        return self._call(Admin.list_offsets, topic, partitions, timestamp)

    def alter_topic_config(self, name: str, config=None, *, delete=(), validate_only: bool = False) -> None:
        self._call(Admin.alter_topic_config, name, config, delete=delete, validate_only=validate_only)

    def add_partitions(self, name: str, *, total=None, count=None, validate_only: bool = False) -> int:
        return self._call(Admin.add_partitions, name, total=total, count=count, validate_only=validate_only)

    def cluster_status(self):
        return self._call(Admin.cluster_status)

    def list_transactions(self, topics=None, delayed: bool = False) -> list:
        return self._call(Admin.list_transactions, topics, delayed)

    def end_transaction(self, txn_id: str, commit: bool):
        return self._call(Admin.end_transaction, txn_id, commit)

    def elect_leaders(self, topics=None) -> list:
        return self._call(Admin.elect_leaders, topics)

    def rebalance(self, topics=None, *, reassign: bool = True):
        return self._call(Admin.rebalance, topics, reassign=reassign)

    def list_groups(self) -> list:
        return self._call(Admin.list_groups)

    def describe_group(self, group: str):
        return self._call(Admin.describe_group, group)

    def delete_group(self, group: str) -> None:
        self._call(Admin.delete_group, group)

    def reset_group_offsets(self, group: str, topic: str, **kw) -> list:
        """See ``Admin.reset_group_offsets`` (keyword arguments ``to``, ``shift_by``,
        ``partitions``, ``dry_run``)."""
        return self._call(Admin.reset_group_offsets, group, topic, **kw)

    def create_subscription(self, topic: str, name: str, config=None, **kw) -> None:
        self._call(Admin.create_subscription, topic, name, config, **kw)

    def delete_subscription(self, topic: str, name: str) -> None:
        self._call(Admin.delete_subscription, topic, name)

    def seek_subscription(self, topic: str, name: str, to) -> dict[int, int]:
        return self._call(Admin.seek_subscription, topic, name, to)

    def describe_subscription(self, topic: str, name: str | None = None) -> list:
        return self._call(Admin.describe_subscription, topic, name)

    def list_subscriptions(self, topic: str | None = None) -> dict:
        return self._call(Admin.list_subscriptions, topic)


class SyncSubscriber:
    """Blocking ``Subscriber`` (takes the same arguments), for scripts and the command
    line: it runs in a private event loop thread (``LoopThread``).  Messages it returns
    may be acked, nacked and touched from any thread."""

    def __init__(self, bootstrap, topic: str, subscription: str, **config) -> None:
        self._lt = LoopThread("sluice-subscriber")

        async def create() -> Subscriber:
            sub = Subscriber(bootstrap, topic, subscription, **config)
            await sub.start()
            return sub

        try:
            self._sub = self._lt.run(create())
        except BaseException:
            self._lt.stop()
            raise
        self._closed = False

    @property
    def created(self) -> set[int]:
        """Partitions where subscribing created the subscription (``Subscriber.created``)."""
        return set(self._sub.created)

    def get(self, timeout: float | None = None) -> Message | None:
        return self._lt.run(self._sub.get(timeout))

    def getmany(self, max_records: int = 1000, timeout: float = 0) -> list[Message]:
        return self._lt.run(self._sub.getmany(max_records, timeout))

    def __iter__(self):
        while (msg := self.get()) is not None:
            yield msg

    def flush(self) -> None:
        self._lt.run(self._sub.flush())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._sub.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> SyncSubscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
