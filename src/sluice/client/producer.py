"""The asyncio producer: settings, partitioner, accumulator front end (DESIGN §4).

Records are appended to an open batch per partition (client/accumulator.py); a batch closes
when it reaches ``batch_size`` or ``linger_ms`` after it opened.  One sender task
(client/sender.py) drains closed batches into produce requests, many partitions per
request, retries and completes them, keeping each partition's order across retries.  Every
batch has one deadline, creation + ``delivery_timeout_ms``, that bounds accumulator time,
flight and retries.

**Idempotence** (``enable_idempotence``, on by default): the producer gets a producer id
from a broker (``INIT_PRODUCER_ID``) and stamps each batch with it, an epoch and a
per-partition sequence (client/sequences.py); the broker stores each batch once however
often it is retried, answering a retried batch with the offset of its first copy.  So a
send that succeeds was stored exactly once, in send order, and up to five batches per
partition can be in flight at once.  Callers that derive their own identity (the Spark sink)
pass ``producer_id`` and ``producer_epoch``; a newer epoch of one id fences the older.

The per-record path, ``send`` / ``send_nowait``: a record that can be buffered at once is
appended to its open batch before the call returns (encoded inline from varint tables, its
sink, a future or a callback, stored beside it; a batch resolves its records in one loop):
by the compiled ``Appender`` for the common record, else by the ``RecordAppender``
(client/appender.py).
A record that must wait for topic metadata or buffer memory queues in its topic's waiting
line, buffered in send order by one task per line.

The bulk path, ``send_many``, encodes keyless records with ``records.encode_keyless_records``
and splits them into batches with C-level helpers (``accumulate``, ``bisect``): no Python work
per record beyond that encoder, and one future for the lot.

Concurrency: a ``Producer`` belongs to the event loop that ran ``start()``; its methods are
not thread-safe (use ``client.sync.SyncProducer`` from threads).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import add, methodcaller
from types import MethodType

import crc32c as _crc32c

from sluice import errors
from sluice.client.accumulator import Accumulator, Bulk, MemoryPool, RecordMetadata
from sluice.client.appender import PLAIN_SLACK, TURN, TURN_BYTES, TURN_RECORDS, RecordAppender
from sluice.client.arguments import check_partition, clarified, values_error
from sluice.client.cluster import Cluster
from sluice.client.config import ProducerConfig
from sluice.client.framing import Callback, record_size, zz_len
from sluice.client.identity import backoff_delay
from sluice.client.ordering import InOrderCallbacks
from sluice.client.partitioning import Partitioning, default_partitioner
from sluice.client.sender import Sender
from sluice.client.state import ProducerState
from sluice.client.transport import ConnectionFactory
from sluice.client.waiting_line import WaitingLine
from sluice.config import check_topic_name
from sluice.protocol import records

__all__ = ["Producer", "RecordMetadata", "InOrderCallbacks", "default_partitioner"]

_MAX_KEYLESS = 32768  # encode_keyless_records' offset-delta table size
# Upper bound of a record's framing around its value in the bulk path: length varint,
# attributes, timestamp delta, offset delta, null key, value length varint, header count.
_BULK_OVERHEAD = 16
# A pending future of one send on a loop: the compiled SendFuture (asyncio.Future's contract
# at a fraction of its cost, see _cfuture.c), or the loop's own future.
_send_future = records._C.SendFuture if records._C is not None else methodcaller("create_future")


def _tell(buffered: asyncio.Future, fut: asyncio.Future) -> None:
    if not buffered.done():  # its sender may have given up on it: the record stays buffered
        buffered.set_result(fut)


def _python_path(*record) -> bool:
    """``Producer._append_common`` without the compiled codec: every record goes the
    Python way (``RecordAppender.append``)."""
    return False


class Producer:
    """Sends records to topics; see the module docstring for the moving parts.

    ``send`` returns an awaitable of (once the record is buffered) a future that resolves
    to a ``RecordMetadata`` when the broker acknowledges it, or fails with the broker's error,
    ``DeliveryTimeout`` or ``ClientClosed``.  ``close()`` flushes first.

    With idempotence a record's offset is -1 when the broker answered its batch as a
    duplicate of one stored too long ago to remember where (stored once, offset unknown;
    it takes more than 5 batches of the partition in flight, which the producer never
    sends, or a broker that forgot).
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        config: ProducerConfig | None = None,
        *,
        connection_factory: ConnectionFactory | None = None,
        **options,
    ) -> None:
        """``config``: the settings (client/config.py's ``ProducerConfig``); keyword
        arguments ``options`` are settings too, over ``config`` or the defaults
        (``Producer(bootstrap, acks="all", linger_ms=1)``).  ``ConfigError`` for a bad
        one, ``TypeError`` for a keyword that is no setting."""
        config = self.config = ProducerConfig.of(config, **options)
        self.acks = config.acks_code
        self.batch_size = int(config.batch_size)
        self.linger = config.linger_ms / 1000
        self.max_block = config.max_block_ms / 1000
        self.unknown_topic_wait = config.unknown_topic_wait_ms / 1000
        self.backoff = config.retry_backoff_ms / 1000
        self.backoff_max = config.retry_backoff_max_ms / 1000
        self.delivery_timeout = config.delivery_timeout_ms / 1000
        self.request_timeout = config.request_timeout_ms / 1000
        self.partitioner = partitioner = config.partitioner
        self.enable_idempotence = config.idempotent
        self.max_in_flight_per_partition = config.in_flight_per_partition
        self.producer_identity = config.identity
        self._cluster = Cluster(
            bootstrap,
            connection_factory=connection_factory,
            connect_timeout=config.connect_timeout_ms / 1000,
            request_timeout=self.request_timeout,
        )
        self._memory = MemoryPool(int(config.buffer_memory))
        self._acc = Accumulator(self.linger, self.delivery_timeout)
        # which partition each record goes to (client/partitioning.py)
        self._partitioning = parts = Partitioning(
            self._cluster, self._acc, partitioner, self.batch_size, config.refused_partition_avoid_ms / 1000
        )
        self._sticky = parts.sticky
        # per topic: sends waiting for metadata or memory, in send order, and the task
        # that buffers them (a waiting topic holds up no other)
        self._line = WaitingLine(self)
        # what the sender, the compiled path and the sync facade share (client/state.py)
        self.state = state = ProducerState(config, self._cluster, self._acc, self._memory, self._line, self._sticky)
        # one record into its partition's open batch, the Python way (client/appender.py)
        self._appender = appender = RecordAppender(
            state, parts, self._check_open, self.batch_size, keyless_sticky=partitioner is None
        )
        self._append_now = appender.append
        # told each error that kept a record of submit() from being buffered (sync facade)
        self.on_unbuffered: Callable[[BaseException], object] | None = None
        self._sender = Sender(
            state, forced=self._forced, refuse_sends=self._refuse_sends,
            leave_leaderless=parts.leave_leaderless, partition_refused=parts.partition_refused,
        )
        # The per-record path of the common record, in C with the compiled codec: it reads
        # (and never replaces) the state's dicts; False sends the record the Python way.  Its
        # ``send`` is this class's ``send`` in C, calling back ``send`` or ``_send_rest``.
        self._append_common: Callable[..., bool] = _python_path
        if records._C is not None:
            state.appender = compiled = records._C.Appender(
                state, appender.batch_full, MethodType(Producer.send, self), self._send_rest, self._buffered_later,
                _crc32c.crc32c, partitioner is not None,
                records.HEADER_SIZE, PLAIN_SLACK, TURN_BYTES, TURN_RECORDS,
            )
            self._append_common = compiled.append
            if type(self).send is Producer.send:  # a subclass's own send stays its send
                self.send = compiled.send
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._closer: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect to the bootstrap brokers and start the sender task."""
        if self._closing:
            raise errors.ClientClosed("producer is closed")
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        await self._cluster.refresh([])
        self._sender.metadata_at = time.monotonic()
        self._started = True
        self._sender.start(self._loop)
        if self.state.appender is not None:
            self.state.appender.loop = self._loop  # the compiled send takes sends from now on

    async def close(self) -> None:
        """Flush everything buffered, wait for acks, then stop.  Idempotent.

        Sends still waiting for metadata or buffer memory fail with ``ClientClosed``.  When
        close ends, every record future is resolved or failed: records not acknowledged by
        then fail with ``ClientClosed`` (the broker may still have stored one that was in
        flight).  That holds also when close() is cancelled or times out mid-flush.
        """
        if self._closed:
            if self._closer is not None:
                await asyncio.shield(self._closer)
            return
        self._closing = True
        self._refuse_sends()
        self._memory.fail_waiters(errors.ClientClosed("producer closed while the send waited for memory"))
        try:
            if self._started:
                await self.flush()
        finally:
            if not self._closed:
                self._abort(errors.ClientClosed("producer closed before the record was acknowledged"))
            await asyncio.shield(self._closer)

    def _abort(self, exc: errors.ClientClosed) -> None:
        """Synchronously fail every record not acknowledged yet and stop every task; the
        awaitable rest of the shutdown runs in ``self._closer``."""
        self._closed = self._closing = True
        self._refuse_sends()
        release = self._sender.release
        self._acc.fail_all(exc, release)  # open and queued batches
        for b in list(self._acc.incomplete):  # in flight: the answer will not be awaited
            self._acc.finish(b, exc, release)
        self._line.fail(exc)
        tasks = self._sender.tasks()
        for t in tasks:
            t.cancel()
        self._closer = asyncio.get_running_loop().create_task(self._finish_close(tasks))

    async def _finish_close(self, tasks: list[asyncio.Task]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cluster.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _refuse_sends(self) -> None:
        """Closing or fenced: from now on every send takes the Python path, which refuses it."""
        self._appender.refusing = True
        if self.state.appender is not None:
            self.state.appender.loop = None

    def _check_open(self) -> None:
        """Raise, before a send buffers anything, when the producer cannot send."""
        if self._closing or self._closed:
            raise errors.unbuffered(errors.ClientClosed("producer is closed"))
        if not self._started:
            raise errors.unbuffered(errors.ClientError("producer not started: await start() first"))
        fenced = self._sender.fenced
        if fenced is not None:
            raise errors.unbuffered(errors.annotated(fenced, "(this producer was fenced; nothing was buffered)"))

    def _forced(self) -> bool:
        """Close lingering batches at once (a flush or close is waiting)?"""
        return self._flushing > 0 or self._closing

    # ------------------------------------------------------------------ metadata

    async def _topic(self, topic: str):
        """Metadata of ``topic``, refreshing until it is known.

        A broker that cannot be reached is waited for up to ``max_block_ms`` (bounded by the
        delivery timeout); a topic the broker says does not exist, only up to
        ``unknown_topic_wait_ms`` (it may be being created), then ``UnknownTopic``.
        """
        info = self._cluster.topics.get(topic)
        if info is not None:
            return info
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        check_topic_name(topic, internal_ok=True)  # a name no topic can have: at once
        started = time.monotonic()
        wait = min(self.max_block, self.delivery_timeout)
        attempt = 0
        last: Exception | None = None
        while True:
            try:
                await self._cluster.refresh([*self._cluster.topics, topic])
            except errors.SluiceError as exc:
                if not exc.retriable:
                    raise
                last = exc
            info = self._cluster.topics.get(topic)
            if info is not None and info.partitions > 0:
                return info
            last = self._cluster.unknown.get(topic, last)
            if last is not None and not last.retriable:
                raise last
            delay = backoff_delay(self.backoff, self.backoff_max, attempt)
            attempt += 1
            if isinstance(last, errors.UnknownTopic):
                wait = min(wait, self.unknown_topic_wait)
            left = started + wait - time.monotonic()
            if left <= 0:
                if isinstance(last, errors.UnknownTopic):
                    raise errors.unknown_topic_after(topic, wait)
                raise errors.UnknownTopic(
                    f"no metadata for topic {topic!r} within {wait:g}s"
                    + (f" (last error: {last})" if last else "")
                )
            await asyncio.sleep(min(delay, left))  # the last try comes when the wait ends
            if self._closing:
                raise errors.ClientClosed("producer closed while the send waited for metadata")

    async def _usable_topic(self, topic: str, partition: int | None = None):
        """Metadata of ``topic`` (waiting for it if new); it must have partitions.  A
        ``partition`` beyond those known refreshes the metadata once: the topic may have
        grown since."""
        info = self._cluster.topics.get(topic)
        if info is None:
            info = await self._topic(topic)
            self._check_open()
        if partition is not None and partition >= info.partitions:
            try:
                await self._cluster.refresh([*self._cluster.topics, topic])
            except errors.SluiceError:
                pass  # unreachable now: the send is refused on what is known
            self._check_open()
            info = self._cluster.topics.get(topic) or await self._topic(topic)
        if info.partitions <= 0:
            raise errors.UnknownPartition(f"topic {topic!r} has no partitions")
        return info

    def _max_batch_bytes(self, info) -> int:
        return self.state.max_batch_bytes(info)

    # ------------------------------------------------------------------ sending

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future:
        """Buffer one record; return an awaitable of the future of its ``RecordMetadata``
        (``await (await producer.send(...))`` waits for the acknowledgement).

        When the record can be buffered at once (topic metadata known, buffer memory free,
        no earlier send waiting) it is, before ``send`` returns: no coroutine, task or loop
        round trip, and the awaitable returned is a future done already, but for one send in
        512 records or 256 KiB of records and the send that fills a batch: that one is done
        on the loop's next turn, so that a loop awaiting each send lets the sender and other
        tasks run as it goes.  Otherwise it waits in line behind earlier waiting sends, in send order:
        for metadata of a topic not seen yet, and for buffer memory (up to
        ``max_block_ms``, then ``BufferExhausted``).

        Awaiting it raises ``MessageTooLarge`` when the record cannot fit in a batch the
        topic accepts, ``ClientClosed`` when the producer is closed, also while waiting, and
        what the encoding raises (e.g. ``TypeError`` for a value that is not bytes).  When it
        raises, nothing was buffered; cancelling it while it waits buffers nothing.

        With the compiled codec a producer's ``send`` is this method's C twin
        (``_crecords.Appender.send``): it buffers a record of bytes without headers whose
        partition has an open batch with room, and hands every other call to this method.
        Its futures (the awaitable and the record's) are then ``_crecords.SendFuture`` objects:
        asyncio.Future's contract, taken by tasks, ``asyncio.gather``, ``wait``, ``wait_for``
        and ``shield`` as an asyncio.Future is, at a fraction of its cost (a batch's
        acknowledgement resolves them in C and each builds its ``RecordMetadata`` when
        asked for it), but not instances of asyncio.Future.
        """
        loop = self._loop
        if loop is None:
            self._check_open()  # raises: not started, or closed
        fut = _send_future(loop)
        buffered = _send_future(loop)
        try:
            common = not (self._closing or self._sender.fenced is not None) and self._append_common(
                topic, value, key, headers, partition, timestamp_ms, fut
            )
        except Exception as exc:  # nothing was buffered
            buffered.set_exception(errors.unbuffered(clarified(exc, topic, value, key, headers, partition, timestamp_ms)))
            return buffered
        if common == TURN:
            return self._buffered_later(buffered, fut)
        if common:
            buffered.set_result(fut)
            return buffered
        return self._send_rest(topic, value, key, headers, partition, timestamp_ms, fut, buffered)

    def _send_rest(self, topic, value, key, headers, partition, timestamp_ms, fut, buffered) -> asyncio.Future:
        """``send`` of a record the common path did not take: buffer it now, or in line;
        return ``buffered``, told ``fut`` once it is buffered or the error that kept it out."""
        try:
            appended = topic not in self._line.lanes and self._append_now(
                topic, value, key, headers, partition, timestamp_ms, fut
            )
        except Exception as exc:  # nothing was buffered
            buffered.set_exception(errors.unbuffered(clarified(exc, topic, value, key, headers, partition, timestamp_ms)))
            return buffered
        if not appended:
            self._line.add((topic, value, key, headers, partition, timestamp_ms, fut, buffered))
        elif appended == TURN:
            self._buffered_later(buffered, fut)
        else:
            buffered.set_result(fut)
        return buffered

    def _buffered_later(self, buffered: asyncio.Future, fut: asyncio.Future) -> asyncio.Future:
        """Tell ``buffered`` its record's ``fut`` on the loop's next turn (see appender.TURN_BYTES)."""
        self._loop.call_soon(_tell, buffered, fut)
        return buffered

    def send_nowait(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callable[[RecordMetadata | None, BaseException | None], object] | None = None,
    ) -> asyncio.Future | None:
        """Buffer one record without waiting, for pipelines that do not await each send.

        Without ``callback``, return the record's future of its ``RecordMetadata`` (many of
        them can be awaited together with ``asyncio.gather``; a ``SendFuture`` with the
        compiled codec, as with ``send``).  With ``callback``, return
        None and call ``callback(metadata, None)`` once the record is acknowledged, or
        ``callback(None, error)`` once it failed; it runs on the producer's loop and must
        not block.

        Every error ``send`` would raise goes to the future or the callback instead (an
        error found at once, before this method returns: nothing of that record was
        buffered).  A record that must wait (metadata, buffer memory) waits in line in send
        order, as with ``send``, but this method does not: a loop that never awaits feels
        no backpressure (await ``flush()`` or a ``send`` now and then).  Records sent so
        and not acknowledged yet are failed by ``close()`` like any other.
        """
        loop = self._loop
        if loop is None:
            self._check_open()
        sink = _send_future(loop) if callback is None else Callback(callback)
        self.submit(topic, value, key, headers, partition, timestamp_ms, sink)
        return sink if callback is None else None

    def submit(self, topic, value, key, headers, partition, timestamp_ms, sink) -> None:
        """``send_nowait``'s core, for facades that bring their own ``sink``: an object with
        ``done()``, ``set_result(metadata)`` and ``set_exception(error)`` (an asyncio or
        concurrent future).  An error that keeps the record from being buffered goes to the
        sink and to ``on_unbuffered`` when set.  Call only on the producer's loop."""
        try:
            if (
                self._closing or self._sender.fenced is not None
                or not self._append_common(topic, value, key, headers, partition, timestamp_ms, sink)
            ) and (topic in self._line.lanes or not self._append_now(topic, value, key, headers, partition, timestamp_ms, sink)):
                self._line.add((topic, value, key, headers, partition, timestamp_ms, sink, None))
        except Exception as exc:  # nothing was buffered
            self.unbuffered(sink, clarified(exc, topic, value, key, headers, partition, timestamp_ms))

    def unbuffered(self, sink, exc: BaseException) -> None:
        """A record of ``submit`` could not be buffered (nothing of it was): mark ``exc``
        so (``errors.unbuffered``), fail ``sink`` with it unless it is done, and tell
        ``on_unbuffered`` when set.  The waiting line and the sync facade's compiled outbox
        report such a record here too.  Call only on the producer's loop."""
        errors.unbuffered(exc)
        if not sink.done():
            sink.set_exception(exc)
        if self.on_unbuffered is not None:
            self.on_unbuffered(exc)

    async def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        partition: int | None = None,
        key: bytes | None = None,
    ) -> asyncio.Future:
        """Buffer many records for one partition; return one future for the lot.

        The bulk path.  All records go to one partition: ``partition``, else the key's, else
        the topic's sticky partition.  Without a key the records are keyless and header-less
        and encoded in bulk; with a key every record carries it.  They are split into batches
        of at most ``batch_size`` that are sent at once (no linger).

        All or nothing: the memory of the whole call is reserved up front, so either every
        record is buffered and the future returned, or the call raises and none is
        (``BufferExhausted``, ``ClientClosed``, ``MessageTooLarge``, an encoding error).  A
        call needing more than ``buffer_memory`` raises ``ConfigError``: split it.

        The future resolves to ``(partition, base_offset)`` when the records got consecutive
        offsets (the usual case), else to the list of their offsets in send order.  With
        ``acks="none"`` it resolves to ``(partition, -1)``.  Records of one call stay in order;
        a concurrent ``send`` to the same partition may land between two of its batches.
        """
        try:
            return await self._send_many(topic, values, partition, key)
        except errors.SluiceError as exc:
            errors.unbuffered(exc)  # it raises only when none of the records was buffered
            raise
        except (TypeError, ValueError) as exc:
            better = values_error(values) or clarified(exc, topic, None, key, None, partition)
            if better is exc:
                raise
            raise better from None

    async def _send_many(
        self, topic: str, values: Sequence[bytes], partition: int | None, key: bytes | None
    ) -> asyncio.Future:
        self._check_open()
        check_partition(partition)
        count = len(values)
        if count == 0:
            fut = self._loop.create_future()
            fut.set_result((partition if partition is not None else -1, -1))
            return fut
        info = await self._usable_topic(topic, partition)
        n = info.partitions
        limit = self._max_batch_bytes(info)
        if partition is None:
            sticky = key is None and self.partitioner is None
            partition = self._partitioning.partition_for(topic, key, n)
        else:
            sticky = False
            if not 0 <= partition < n:
                raise errors.unknown_partition(topic, partition, n)
        lens = list(map(len, values))
        biggest = max(lens)
        klen = len(key) if key is not None else 0
        key_tail = 1 if key is None else zz_len(klen) + klen
        alone = record_size(key_tail + zz_len(biggest) + biggest + 1, 0, 0)
        if alone + records.HEADER_SIZE > limit and self._line.limit_may_be_stale(topic):
            await self._line.ask_limit(topic)  # it may have been raised since
            limit = self._max_batch_bytes(self._cluster.topics.get(topic) or info)
        if alone + records.HEADER_SIZE > limit:
            raise errors.MessageTooLarge(
                f"a record of {alone} bytes (plus a {records.HEADER_SIZE}-byte batch header) "
                f"exceeds the {limit}-byte limit of {topic!r}"
            )
        overhead = _BULK_OVERHEAD + klen + (4 if klen else 0)
        bytes_per_batch = min(self.batch_size, limit) - records.HEADER_SIZE
        # cum[i] bounds the encoded size of values[:i]; C-level, no Python per record.
        cum = list(accumulate(map(add, lens, repeat(overhead)), initial=0))
        spans = []
        i = 0
        while i < count:
            j = bisect_right(cum, cum[i] + bytes_per_batch, i + 1) - 1
            j = min(max(j, i + 1), i + _MAX_KEYLESS)
            spans.append((i, j))
            i = j
        total = cum[count]
        mem = self._memory
        if mem.used + total > mem.limit or mem.waiters:
            await mem.acquire(total, self.max_block)
        else:
            mem.used += total
        try:
            if self._closing:
                raise errors.ClientClosed("producer closed while the send waited for memory")
            bodies = []
            for i, j in spans:
                chunk = values[i:j]
                if key is not None:
                    bodies.append(
                        b"".join([records.encode_record(d, 0, key, v) for d, v in enumerate(chunk)])
                    )
                else:
                    bodies.append(records.encode_keyless_records(chunk))
        except BaseException:
            mem.release(total)
            raise
        # Everything is encoded and paid for; from here nothing awaits or raises.
        acc = self._acc
        open_batch = acc.open.get((topic, partition))
        if open_batch is not None:
            acc.close(open_batch)  # records sent before this call go first
        fut = self._loop.create_future()
        bulk = Bulk(fut, partition)
        bulk.expect(len(spans))
        ts = int(time.time() * 1000)
        for (i, j), body in zip(spans, bodies, strict=True):
            acc.add_closed(topic, partition, body, j - i, ts, cum[j] - cum[i], bulk)
        if sticky:
            self._partitioning.switch_sticky(topic, n, partition)
        return fut

    async def flush(self) -> None:
        """Send everything buffered now (ignoring linger) and wait until all of it is acked
        or failed, sends waiting in line included (they are buffered first).  Does not raise
        for failed records: their futures carry the errors."""
        if not self._started:
            return
        self._flushing += 1
        self._sender.wake()
        try:
            await self._line.drained()
            for batch in list(self._acc.incomplete):
                await batch.wait_done(self._loop)
        finally:
            self._flushing -= 1
