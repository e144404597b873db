"""``SyncProducer``: the blocking ``Producer``, whose ``send`` queues a record for the
producer's loop and returns at once a future of its metadata.

Records sent and not handed to the loop yet wait in an outbox (client/outbox.py, compiled
in _coutbox.c, whose ``send`` is this facade's ``send`` in C for the common record); a
hand-over on the loop buffers them in order.  The facade gives the outbox the two calls it
makes back into it (``_buffer_all`` and ``_schedule_hand_over``) when it builds it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Iterable, Sequence

from sluice import errors
from sluice.client.framing import tail_size
from sluice.client.loop_thread import LoopThread
from sluice.client.outbox import Outbox as _PyOutbox
from sluice.client.producer import Producer
from sluice.client.record_future import FutureGroup, RecordFuture
from sluice.client.sync.base import SyncBase
from sluice.protocol import records

__all__ = ["SyncProducer"]

_Outbox = records._C.Outbox if records._C is not None else _PyOutbox


class SyncProducer(SyncBase):
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
        """As ``SyncBase._ensure``; every call of a producer sends, so its ``ClientClosed``
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
        """Buffer every record sent before, then close as ``SyncBase.close`` does."""
        with self._lock:
            client, lt = self._client, self._lt
        if client is not None:
            try:
                lt.run(self._hand_over_and_buffer(client))
            except errors.SluiceError:
                pass  # closed meanwhile by another thread: close() below fails what is left
        super().close()



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

