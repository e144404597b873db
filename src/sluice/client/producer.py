"""The asyncio producer: accumulator, partitioner, sender (DESIGN §4).

Records are appended to an open batch per partition (the accumulator); a batch closes when
it reaches ``batch_size`` or ``linger_ms`` after it opened.  One sender task drains closed
batches into ``ProduceRequest`` frames, many partitions per request, and keeps **at most one
request in flight per partition**: that alone keeps per-partition order across retries
(failed batches go back to the front of their queue).  Every batch has one deadline,
creation + ``delivery_timeout_ms``, that bounds accumulator time, flight and retries.

The bulk path, ``send_many``, encodes keyless records with ``records.encode_keyless_records``
and splits them into batches with C-level helpers (``accumulate``, ``bisect``): no Python work
per record beyond that encoder, and one future for the lot.

Concurrency: a ``Producer`` belongs to the event loop that ran ``start()``; its methods are
not thread-safe (use ``client.sync.SyncProducer`` from threads).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import add

import crc32c as _crc32c

from sluice import errors
from sluice.client.accumulator import Accumulator, Batch, Bulk, MemoryPool, RecordMetadata
from sluice.client.ordering import InOrderCallbacks
from sluice.client.transport import Cluster, ConnectionFactory
from sluice.protocol import messages, records

__all__ = ["Producer", "RecordMetadata", "InOrderCallbacks", "default_partitioner"]

_ACKS = {"none": messages.ACKS_NONE, "leader": messages.ACKS_LEADER, "all": messages.ACKS_ALL}
_MAX_KEYLESS = 32768  # encode_keyless_records' offset-delta table size
# Upper bound of a record's framing around its value in the bulk path: length varint,
# attributes, timestamp delta, offset delta, null key, value length varint, header count.
_BULK_OVERHEAD = 16
# Bytes a record can grow by between its size in a batch of its own (deltas 0) and its size
# in any batch: timestamp delta (up to 10 bytes, not 1), offset delta, length varint.
_DELTA_SLACK = 16

log = logging.getLogger(__name__)


def _zz_len(n: int) -> int:
    """Bytes of the zig-zag varint of ``n`` (``records.encode_varint``)."""
    u = n << 1 if n >= 0 else (~n << 1) | 1
    return (u.bit_length() + 6) // 7 or 1


def _tail_size(key: bytes | None, value: bytes | None, headers) -> int:
    """Exact bytes of an encoded record after its offset delta: key, value, headers.

    Mirrors ``records.encode_record``; ``_record_size`` adds the framing around it.
    """
    n = 1 if key is None else _zz_len(len(key)) + len(key)
    n += 1 if value is None else _zz_len(len(value)) + len(value)
    if headers:
        n += _zz_len(len(headers))
        for hk, hv in headers:
            kl = len(hk.encode())
            n += _zz_len(kl) + kl + (1 if hv is None else _zz_len(len(hv)) + len(hv))
    else:
        n += 1
    return n


def _record_size(tail: int, timestamp_delta: int, offset_delta: int) -> int:
    """Exact ``len(records.encode_record(offset_delta, timestamp_delta, ...))``."""
    body = 1 + _zz_len(timestamp_delta) + _zz_len(offset_delta) + tail
    return _zz_len(body) + body


def _deadline(batch: Batch) -> float:
    return batch.deadline


def default_partitioner(key: bytes, partitions: int) -> int:
    """Partition of a keyed record: CRC-32C of the key modulo the partition count."""
    return _crc32c.crc32c(key) % partitions


def _positive(name: str, value, minimum: float = 1) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum:
        raise errors.ConfigError(f"{name} must be a number >= {minimum}, got {value!r}")


class Producer:
    """Sends records to topics; see the module docstring for the moving parts.

    ``send`` returns (once the record is buffered) a future that resolves to a
    ``RecordMetadata`` when the broker acknowledges it, or fails with the broker's error,
    ``DeliveryTimeout`` or ``ClientClosed``.  ``close()`` flushes first.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        acks: str = "all",
        batch_size: int = 262144,
        linger_ms: float = 5,
        buffer_memory: int = 64 * 1024 * 1024,
        max_block_ms: float = 60000,
        unknown_topic_wait_ms: float = 1000,
        compression: str = "none",
        max_in_flight: int = 16,
        retries: int | None = None,
        retry_backoff_ms: float = 100,
        retry_backoff_max_ms: float = 1000,
        delivery_timeout_ms: float = 120000,
        request_timeout_ms: float = 30000,
        max_request_size: int = 16 * 1024 * 1024,
        partitioner: Callable[[bytes | None, int], int] | None = None,
        connect_timeout_ms: float = 10000,
        metadata_max_age_ms: float = 30000,
        connection_factory: ConnectionFactory | None = None,
    ) -> None:
        """``acks``: ``"all"`` (the default, as Kafka's since 3.0): a send is acknowledged
        once every in-sync replica has it (the partition's high watermark passed it);
        ``"leader"``: once the leader appended it; ``"none"``: not at all.  With one broker
        ``"all"`` and ``"leader"`` answer at the same moment.

        ``metadata_max_age_ms``: how often metadata of the topics sent to is refreshed,
        which picks up new partitions and changed size limits."""
        if acks not in _ACKS:
            raise errors.ConfigError(f"acks must be one of {sorted(_ACKS)}, got {acks!r}")
        if compression not in records.COMPRESSION_CODES:
            raise errors.ConfigError(
                f"compression must be one of {sorted(records.COMPRESSION_CODES)}, got {compression!r}"
            )
        _positive("batch_size", batch_size, records.HEADER_SIZE + 1)
        _positive("linger_ms", linger_ms, 0)
        _positive("buffer_memory", buffer_memory, 1)
        _positive("max_block_ms", max_block_ms, 0)
        _positive("unknown_topic_wait_ms", unknown_topic_wait_ms, 0)
        _positive("max_in_flight", max_in_flight, 1)
        if retries is not None:
            _positive("retries", retries, 0)
        _positive("retry_backoff_ms", retry_backoff_ms, 0)
        _positive("retry_backoff_max_ms", retry_backoff_max_ms, 0)
        _positive("delivery_timeout_ms", delivery_timeout_ms, 1)
        _positive("request_timeout_ms", request_timeout_ms, 1)
        _positive("max_request_size", max_request_size, records.HEADER_SIZE + 1)
        _positive("connect_timeout_ms", connect_timeout_ms, 1)
        _positive("metadata_max_age_ms", metadata_max_age_ms, 1)
        if retry_backoff_max_ms < retry_backoff_ms:
            raise errors.ConfigError("retry_backoff_max_ms must be >= retry_backoff_ms")
        if batch_size > buffer_memory:
            raise errors.ConfigError("batch_size must not exceed buffer_memory")
        if partitioner is not None and not callable(partitioner):
            raise errors.ConfigError("partitioner must be a callable (key, partitions) -> int")
        self.acks = _ACKS[acks]
        self.batch_size = int(batch_size)
        self.linger = linger_ms / 1000
        self.max_block = max_block_ms / 1000
        self.unknown_topic_wait = unknown_topic_wait_ms / 1000
        self.codec = records.COMPRESSION_CODES[compression]
        self.max_in_flight = int(max_in_flight)
        self.retries = retries
        self.backoff = retry_backoff_ms / 1000
        self.backoff_max = retry_backoff_max_ms / 1000
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.request_timeout = request_timeout_ms / 1000
        self.max_request_size = int(max_request_size)
        self.partitioner = partitioner
        self.metadata_max_age = metadata_max_age_ms / 1000
        self._metadata_at = 0.0  # monotonic time of the last metadata refresh
        self._cluster = Cluster(
            bootstrap,
            connection_factory=connection_factory,
            connect_timeout=connect_timeout_ms / 1000,
            request_timeout=self.request_timeout,
        )
        self._memory = MemoryPool(int(buffer_memory))
        self._acc = Accumulator(self.linger, self.delivery_timeout)
        self._sticky: dict[str, int] = {}
        self._inflight_tps: set[tuple[str, int]] = set()
        self._inflight_nodes: dict[int, int] = {}
        self._retry_at: dict[tuple[str, int], float] = {}
        self._failures: dict[tuple[str, int], int] = {}  # consecutive failed attempts
        self._requests: set[asyncio.Task] = set()
        self._sender: asyncio.Task | None = None
        self._refresh_task: asyncio.Task | None = None
        self._waiter: asyncio.Future | None = None
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
        if self._sender is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._acc.on_ready = self._wake
        await self._cluster.refresh([])
        self._metadata_at = time.monotonic()
        self._sender = self._loop.create_task(self._run_sender(), name="sluice-producer-sender")

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
        self._memory.fail_waiters(errors.ClientClosed("producer closed while the send waited for memory"))
        try:
            if self._sender is not None:
                await self.flush()
        finally:
            if not self._closed:
                self._abort(errors.ClientClosed("producer closed before the record was acknowledged"))
            await asyncio.shield(self._closer)

    def _abort(self, exc: errors.ClientClosed) -> None:
        """Synchronously fail every record not acknowledged yet and stop every task; the
        awaitable rest of the shutdown runs in ``self._closer``."""
        self._closed = self._closing = True
        self._acc.fail_all(exc, self._release)  # open and queued batches
        for b in list(self._acc.incomplete):  # in flight: the answer will not be awaited
            self._acc.finish(b, exc, self._release)
        tasks = [t for t in (self._sender, self._refresh_task, *self._requests) if t is not None]
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

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise errors.ClientClosed("producer is closed")
        if self._sender is None:
            raise errors.ClientError("producer not started: await start() first")

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
            delay = self._backoff_delay(attempt)
            attempt += 1
            if isinstance(last, errors.UnknownTopic):
                wait = min(wait, self.unknown_topic_wait)
            if time.monotonic() + delay - started > wait:
                if isinstance(last, errors.UnknownTopic):
                    raise errors.UnknownTopic(
                        f"topic {topic!r} does not exist (waited {wait * 1000:g} ms: "
                        f"unknown_topic_wait_ms)"
                    )
                raise errors.UnknownTopic(
                    f"no metadata for topic {topic!r} within {wait:g}s"
                    + (f" (last error: {last})" if last else "")
                )
            await asyncio.sleep(delay)
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
        limit = self.max_request_size
        if info.max_message_bytes > 0:
            limit = min(limit, info.max_message_bytes)
        return limit

    def _request_refresh(self) -> None:
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = self._loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        topics = set(self._cluster.topics) | self._acc.topics()
        try:
            await self._cluster.refresh(sorted(topics))
        except errors.SluiceError:
            await asyncio.sleep(self.backoff)  # broker down: pace the next attempt
        finally:
            self._metadata_at = time.monotonic()  # a failed refresh is not repeated at once either
            self._wake()

    # ------------------------------------------------------------------ partitioning

    def _partition_for(self, topic: str, key: bytes | None, n: int) -> int:
        if self.partitioner is not None:
            p = self.partitioner(key, n)
            if not 0 <= p < n:
                raise errors.UnknownPartition(f"partitioner returned {p} for {n} partitions")
            return p
        if key is not None:
            return _crc32c.crc32c(key) % n
        p = self._sticky.get(topic)
        if p is None or p >= n:
            p = self._sticky[topic] = random.randrange(n)
        return p

    def _switch_sticky(self, topic: str, n: int, old: int) -> int:
        p = random.randrange(n - 1) if n > 1 else 0
        if n > 1 and p >= old:
            p += 1  # never pick the partition whose batch just filled
        self._sticky[topic] = p
        return p

    # ------------------------------------------------------------------ sending

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future:
        """Buffer one record; return a future of its ``RecordMetadata``.

        Waits only for metadata of a topic not seen yet and for buffer memory (up to
        ``max_block_ms``, then ``BufferExhausted``).  Raises ``MessageTooLarge`` at once when
        the record cannot fit in a batch the topic accepts, and ``ClientClosed`` when the
        producer is closed, also while waiting.  When it raises, nothing was buffered.
        """
        self._check_open()
        info = await self._usable_topic(topic, partition)
        n = info.partitions
        limit = self._max_batch_bytes(info)
        tail = _tail_size(key, value, headers)
        alone = _record_size(tail, 0, 0)  # exact size in a batch of its own
        if alone + records.HEADER_SIZE > limit:
            raise errors.MessageTooLarge(
                f"record of {alone} bytes (plus a {records.HEADER_SIZE}-byte batch header) "
                f"exceeds the {limit}-byte limit of {topic!r}"
            )
        if partition is None:
            partition = self._partition_for(topic, key, n)
            sticky = key is None and self.partitioner is None
        else:
            if not 0 <= partition < n:
                raise errors.UnknownPartition(f"{topic!r} has {n} partitions, not {partition}")
            sticky = False
        reserve = alone + _DELTA_SLACK
        mem = self._memory
        if mem.used + reserve > mem.limit or mem.waiters:
            await mem.acquire(reserve, self.max_block)
        else:
            mem.used += reserve
        try:
            if self._closing:
                raise errors.ClientClosed("producer closed while the send waited for memory")
            if timestamp_ms is None:
                timestamp_ms = int(time.time() * 1000)
            return self._append(
                topic, partition, n, sticky, limit, key, value, headers, timestamp_ms, tail, reserve
            )
        except BaseException:
            mem.release(reserve)
            raise

    def _append(
        self, topic, partition, n, sticky, limit, key, value, headers, ts, tail, reserve
    ) -> asyncio.Future:
        """Put one record (known to fit in a batch of its own) in its partition's open batch.

        The record is encoded, once, before the accumulator changes, so an encoding error
        leaves no empty open batch behind.  Synchronous: no await between choice and append.
        """
        acc = self._acc
        cap = min(self.batch_size, limit) - records.HEADER_SIZE  # record bytes per batch
        batch = acc.open.get((topic, partition))
        if batch is not None and batch.size + _record_size(tail, ts - batch.base_ts, batch.count) > cap:
            acc.close(batch)
            batch = None
            if sticky:
                partition = self._switch_sticky(topic, n, partition)
                batch = acc.open.get((topic, partition))
                if batch is not None and (
                    batch.size + _record_size(tail, ts - batch.base_ts, batch.count) > cap
                ):
                    acc.close(batch)
                    batch = None
        if batch is None:
            rec = records.encode_record(0, 0, key, value, headers)
            batch = acc.new_batch(topic, partition, ts)
        else:
            rec = records.encode_record(batch.count, ts - batch.base_ts, key, value, headers)
        fut = self._loop.create_future()
        batch.append(rec, fut, ts, reserve)
        if batch.size >= cap:
            acc.close(batch)
            if sticky:
                self._switch_sticky(topic, n, partition)
        return fut

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
        self._check_open()
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
            partition = self._partition_for(topic, key, n)
        else:
            sticky = False
            if not 0 <= partition < n:
                raise errors.UnknownPartition(f"{topic!r} has {n} partitions, not {partition}")
        lens = list(map(len, values))
        biggest = max(lens)
        klen = len(key) if key is not None else 0
        key_tail = 1 if key is None else _zz_len(klen) + klen
        alone = _record_size(key_tail + _zz_len(biggest) + biggest + 1, 0, 0)
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
            self._switch_sticky(topic, n, partition)
        return fut

    async def flush(self) -> None:
        """Send everything buffered now (ignoring linger) and wait until all of it is acked
        or failed.  Does not raise for failed records: their futures carry the errors."""
        if self._sender is None:
            return
        pending = list(self._acc.incomplete)
        if not pending:
            return
        self._flushing += 1
        self._wake()
        try:
            for batch in pending:
                await batch.wait_done(self._loop)
        finally:
            self._flushing -= 1

    # ------------------------------------------------------------------ memory

    def _release(self, batch: Batch) -> None:
        self._memory.release(batch.reserved)

    # ------------------------------------------------------------------ sender task

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _run_sender(self) -> None:
        loop = self._loop
        acc = self._acc
        while True:
            now = time.monotonic()
            acc.expire(now, self._release)
            wake_at = acc.close_lingered(now, force=self._flushing > 0 or self._closing)
            wake_at = self._dispatch(now, wake_at)
            wake_at = self._refresh_when_old(now, wake_at)
            self._waiter = loop.create_future()
            handle = None
            if wake_at is not None:
                handle = loop.call_at(
                    loop.time() + max(0.0, wake_at - time.monotonic()), self._wake
                )
            try:
                await self._waiter
            finally:
                self._waiter = None
                if handle is not None:
                    handle.cancel()

    def _refresh_when_old(self, now: float, wake_at: float | None) -> float | None:
        """Refresh metadata ``metadata_max_age_ms`` after the last refresh (new partitions,
        changed limits) if any topic is known; return the next wake-up time."""
        if not self._cluster.topics:
            return wake_at
        due = self._metadata_at + self.metadata_max_age
        if now >= due:
            self._request_refresh()
            due = now + self.metadata_max_age
        return due if wake_at is None else min(wake_at, due)

    def _dispatch(self, now: float, wake_at: float | None) -> float | None:
        """Turn ready batches into requests, within the per-partition and per-connection
        in-flight limits; return the next time something becomes due."""
        by_node: dict[int, list[tuple[str, int]]] = {}
        need_refresh = False
        cluster = self._cluster
        for tp, q in self._acc.queues.items():
            if not q:
                continue
            if tp in self._inflight_tps:  # waits for its request; expire() at its deadline
                deadline = q[0].deadline
                wake_at = deadline if wake_at is None else min(wake_at, deadline)
                continue
            retry_at = self._retry_at.get(tp)
            if retry_at is not None:
                if retry_at > now:
                    due = min(retry_at, q[0].deadline)  # expire() fails the head at its deadline
                    wake_at = due if wake_at is None else min(wake_at, due)
                    continue
                del self._retry_at[tp]
            node = cluster.leader(*tp)
            if node < 0:
                need_refresh = True
                for b in q:
                    b.last_error = b.last_error or errors.NotLeader(f"no leader known for {tp}")
                deadline = q[0].deadline
                wake_at = deadline if wake_at is None else min(wake_at, deadline)
                continue
            by_node.setdefault(node, []).append(tp)
        if need_refresh:
            self._request_refresh()
        for node, tps in by_node.items():
            while tps and self._inflight_nodes.get(node, 0) < self.max_in_flight:
                req_batches = self._take_request(tps)
                self._inflight_nodes[node] = self._inflight_nodes.get(node, 0) + 1
                task = self._loop.create_task(self._send_request(node, req_batches))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
        return wake_at

    def _take_request(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], list[Batch]]:
        """Pop the queued batches of as many partitions as fit in ``max_request_size``
        (the first batch always goes, whatever its size); mark those partitions in flight."""
        out: dict[tuple[str, int], list[Batch]] = {}
        total = 0
        queues = self._acc.queues
        codec, cap = self.codec, self.max_request_size
        while tps:
            tp = tps[0]
            q = queues[tp]
            taken: list[Batch] = []
            while q:
                size = len(q[0].build(codec))
                if total and total + size > cap:
                    break
                taken.append(q.popleft())
                total += size
            if taken:
                out[tp] = taken
                self._inflight_tps.add(tp)
            if q:
                if taken:
                    tps.pop(0)  # the rest waits for this partition's request to finish
                break  # the request is full
            tps.pop(0)
        return out

    async def _send_request(self, node: int, batches: dict[tuple[str, int], list[Batch]]) -> None:
        """One produce request: every batch it holds ends acknowledged, failed or requeued,
        whatever is raised (a bug, a foreign error, cancellation by ``close``)."""
        flat = [b for bs in batches.values() for b in bs]
        try:
            try:
                response = await self._exchange(node, batches, flat)
            except BaseException:
                for b in flat:
                    b.settle(known=False)  # written or not, no answer was read
                raise
            if response is None:  # acks=none: written is all we will know
                for b in flat:
                    b.settle(known=False)
                    self._complete(b, -1, -1)
            else:
                self._on_response(batches, response)
        except asyncio.CancelledError:
            # only close() cancels requests, and it has failed these batches already
            self._abandon(batches, errors.ClientClosed("producer closed before the broker answered"))
            raise
        except errors.SluiceError as exc:
            if isinstance(exc, errors.ConnectionClosed | errors.RequestTimedOut):
                self._cluster.node_failed(node)  # metadata is asked elsewhere first
            self._on_request_error(batches, exc)
        except OSError as exc:
            self._cluster.node_failed(node)
            self._on_request_error(batches, errors.ConnectionClosed(str(exc)))
        except Exception as exc:
            log.exception("produce request to broker %s failed unexpectedly", node)
            self._abandon(batches, exc)
        finally:
            self._inflight_nodes[node] -= 1
            for tp in batches:
                self._inflight_tps.discard(tp)
            self._wake()

    async def _exchange(self, node: int, batches: dict[tuple[str, int], list[Batch]], flat):
        """Send one request and return its response (None with ``acks="none"``).

        The request itself is bounded by ``connect_timeout_ms`` and ``request_timeout_ms``
        alone (a timeout closes its connection, see ``Connection.request``), never shrunk by
        the batches' deadlines (the broker is told the earliest of them, as the request's
        ``timeout_ms``, so that it answers by then): a batch whose delivery deadline passes meanwhile fails on
        its own (its records may have been stored) while the request runs on, and its
        partition stays in flight until the request ends, so no second copy is sent beside it.
        """
        partitions = []
        attachments = []
        for (topic, partition), bs in batches.items():
            size = 0
            for b in bs:
                attachments.append(b.data)
                size += len(b.data)
            partitions.append(messages.ProducePartition(topic=topic, partition=partition, size=size))
        # The broker holds acks=all writes no longer than the batches' delivery deadline
        # (seed 000: each waiting write carries its own deadline, nothing waits past it).
        now = time.monotonic()
        wait = min(self.request_timeout, min(b.deadline for b in flat) - now)
        request = messages.ProduceRequest(
            partitions=partitions, acks=self.acks, timeout_ms=max(1, int(wait * 1000))
        )
        task = self._loop.create_task(self._deliver(node, request, attachments, flat))
        by_deadline = sorted(flat, key=_deadline)
        i = 0
        try:
            while True:
                now = time.monotonic()
                while i < len(by_deadline) and by_deadline[i].deadline <= now:
                    b = by_deadline[i]
                    self._acc.finish(b, b.timeout_error(self.delivery_timeout), self._release)
                    i += 1
                timeout = by_deadline[i].deadline - now if i < len(by_deadline) else None
                await asyncio.wait((task,), timeout=timeout)
                if task.done():
                    return task.result()
        finally:
            if not task.done():
                task.cancel()

    async def _deliver(self, node: int, request, attachments, flat: list[Batch]):
        """Connect and write (marking ``flat`` in flight only once the bytes go out), then
        await the answer."""
        conn = await self._cluster.connection(node)
        if self.acks == messages.ACKS_NONE:
            await conn.drain()
        if conn.closed:
            raise errors.ConnectionClosed(f"connection to broker {node} closed before sending")
        for b in flat:
            b.in_flight = True
        if self.acks == messages.ACKS_NONE:
            conn.send_noreply(request, attachments)
            return None
        response, _ = await conn.request(request, attachments, self.request_timeout, check=False)
        return response

    def _on_response(self, batches, response: messages.ProduceResponse) -> None:
        if response.error:  # the whole request was answered with one error
            exc = errors.error_for_code(response.error, response.message)
            for tp, bs in batches.items():
                self._on_partition_error(tp, bs, exc)
            return
        results = {(r.topic, r.partition): r for r in response.partitions}
        for tp, bs in batches.items():
            r = results.get(tp)
            if r is None:
                exc = errors.UnknownServerError(f"no result for {tp} in the produce response")
                self._on_partition_error(tp, bs, exc)
            elif r.error:
                self._on_partition_error(tp, bs, errors.error_for_code(r.error, r.message))
            else:
                self._failures.pop(tp, None)
                offset = r.base_offset
                for b in bs:
                    b.settle(known=True)
                    self._complete(b, offset, r.log_append_time)
                    offset += b.count

    def _on_partition_error(self, tp, bs: list[Batch], exc: errors.BrokerError) -> None:
        for b in bs:
            b.settle(known=exc.appended_nothing)
        if exc.retriable:
            self._retry(tp, bs, exc)
        else:
            self._fail_batches(bs, exc)

    def _abandon(self, batches, exc: BaseException) -> None:
        """Fail every batch of ``batches`` still unfinished and not requeued."""
        for tp, bs in batches.items():
            q = self._acc.queues.get(tp, ())
            for b in bs:
                if b in self._acc.incomplete and b not in q:
                    self._acc.finish(b, exc, self._release)

    def _on_request_error(self, batches, exc: errors.SluiceError) -> None:
        retriable = exc.retriable or isinstance(exc, errors.ConnectionClosed)
        for tp, bs in batches.items():
            if retriable:
                self._retry(tp, bs, exc)
            else:
                self._fail_batches(bs, exc)

    def _retry(self, tp, bs: list[Batch], exc: Exception) -> None:
        """Requeue the unfinished batches of ``bs`` at the front of their partition (order
        kept) after a backoff that grows with the partition's consecutive failures up to
        ``retry_backoff_max_ms``, whatever the deadlines; ``expire`` fails what reaches its
        deadline meanwhile."""
        now = time.monotonic()
        if isinstance(exc, errors.NotLeader | errors.RequestTimedOut):
            # A leader that does not answer in time may have been replaced while it
            # stalled: the retry waits for fresh metadata rather than going back to it.
            self._cluster.mark_stale(tp[0])
        if isinstance(exc, errors.NotLeader | errors.UnknownTopic | errors.ConnectionClosed | errors.RequestTimedOut):
            self._request_refresh()
        failures = self._failures[tp] = self._failures.get(tp, 0) + 1
        incomplete = self._acc.incomplete
        keep = []
        for b in bs:
            if b not in incomplete:
                continue  # failed at its deadline while in flight
            b.last_error = exc
            b.attempts += 1
            if b.deadline <= now:
                self._acc.finish(b, b.timeout_error(self.delivery_timeout), self._release)
            elif self.retries is not None and b.attempts > self.retries:
                self._acc.finish(b, exc, self._release)
            else:
                keep.append(b)
        if keep:
            self._acc.queues.setdefault(tp, deque()).extendleft(reversed(keep))
            self._retry_at[tp] = now + self._backoff_delay(failures - 1)

    def _backoff_delay(self, attempt: int) -> float:
        delay = min(self.backoff * (2 ** min(attempt, 30)), self.backoff_max)
        return delay * random.uniform(0.8, 1.2) if delay else 0.0

    def _fail_batches(self, bs: list[Batch], exc: Exception) -> None:
        for b in bs:
            self._acc.finish(b, exc, self._release)

    def _complete(self, batch: Batch, base_offset: int, append_time: int) -> None:
        batch.resolve(base_offset, append_time, RecordMetadata)
        self._acc.finish(batch, None, self._release)
