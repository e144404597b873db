"""The producer's buffers: memory accounting, batches, and the per-partition accumulator.

Records wait here between ``Producer.send`` and the sender: appended to the open batch of
their partition, closed at ``batch_size`` or after ``linger_ms``, queued per partition in send
order, retried from the front of their queue.  ``MemoryPool`` bounds the bytes buffered and
in flight (``buffer_memory``), making senders wait up to ``max_block_ms``.

Concurrency: loop-bound, used only by the producer that owns it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from sluice import errors
from sluice.protocol import compression, records


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed.  ``offset`` is -1 with ``acks="none"``."""

    topic: str
    partition: int
    offset: int
    timestamp: int


# ---------------------------------------------------------------------- buffer memory


# The counts (used, limit, waiters) in C with the compiled codec, where the producer's
# per-record paths read and change them directly.
_MemoryCounter = records._C.MemoryCounter if records._C is not None else object


class MemoryPool(_MemoryCounter):
    """Bytes of buffer memory: reserved when a record is buffered, released on its ack.

    Waiters are served first come, first served; ``acquire`` fails with ``BufferExhausted``
    after ``timeout`` seconds, and at once with ``ConfigError`` for a request larger than
    the whole pool (no wait could ever satisfy it).  ``fail_waiters`` fails every waiting
    ``acquire`` (on close).  Callers take the fast path themselves
    (``used + n <= limit and not waiters``) to avoid a coroutine per record.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiters: deque[list] = deque()  # [n, future]

    async def acquire(self, n: int, timeout: float) -> None:
        if n > self.limit:
            raise errors.ConfigError(
                f"{n} bytes can never fit in buffer_memory={self.limit}: "
                f"send less per call or raise buffer_memory"
            )
        if self.used + n <= self.limit and not self.waiters:
            self.used += n
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        entry = [n, fut]
        self.waiters.append(entry)
        handle = loop.call_later(timeout, self._expire, entry, timeout)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(n)  # granted just as we were cancelled: give it back
            else:
                self._remove(entry)
            raise
        finally:
            handle.cancel()

    def _remove(self, entry: list) -> None:
        try:
            self.waiters.remove(entry)
        except ValueError:
            pass
        self._grant()

    def _expire(self, entry: list, timeout: float) -> None:
        fut = entry[1]
        if not fut.done():
            self._remove(entry)
            fut.set_exception(
                errors.BufferExhausted(
                    f"buffer_memory ({self.limit} bytes) stayed full for {timeout * 1000:g} ms "
                    f"(max_block_ms): the broker is not keeping up or not reachable"
                )
            )

    def fail_waiters(self, exc: BaseException) -> None:
        """Fail every waiting ``acquire`` with a copy of ``exc`` (nothing is granted)."""
        waiters, self.waiters = self.waiters, deque()
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(type(exc)(*exc.args))

    def release(self, n: int) -> None:
        self.used -= n
        if self.waiters:
            self._grant()

    def _grant(self) -> None:
        w = self.waiters
        while w and self.used + w[0][0] <= self.limit:
            n, fut = w.popleft()
            if not fut.done():
                self.used += n
                fut.set_result(None)


# ---------------------------------------------------------------------- batches


class Bulk:
    """The one future of a ``send_many`` call, resolved when all its batches are acked."""

    __slots__ = ("future", "partition", "remaining", "results", "next_index")

    def __init__(self, future: asyncio.Future, partition: int) -> None:
        self.future = future
        self.partition = partition
        self.remaining = 0
        self.results: list = []
        self.next_index = 0

    def expect(self, batches: int) -> None:
        self.remaining = batches
        self.results = [None] * batches

    def batch_done(self, index: int, base_offset: int, count: int) -> None:
        self.results[index] = (base_offset, count)
        self.remaining -= 1
        if self.remaining or self.future.done():
            return
        res = self.results
        first = res[0][0]
        if all(base < 0 for base, _ in res):  # acks="none", or only old duplicates
            self.future.set_result((self.partition, -1))
            return
        expected = first
        for base, count in res:
            if base != expected:
                break
            expected = base + count
        else:
            self.future.set_result((self.partition, first))
            return
        offsets: list[int] = []
        for base, count in res:
            offsets.extend(range(base, base + count) if base >= 0 else [-1] * count)
        self.future.set_result(offsets)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _RecordBuffer:
    """The per-record state of a batch, and its per-record work: the pure-Python reference
    of ``sluice._crecords.RecordBuffer``, used without the compiled codec."""

    __slots__ = ("buf", "futures", "timestamps", "count", "size", "reserved", "base_ts", "max_ts")

    def add(self, limit: int, key, value, headers, ts: int, sink, reserved: int) -> bool:
        """Encode one record into the batch if its records then take at most ``limit``
        bytes; False (nothing added) when they would not.  ``sink`` (an asyncio or
        concurrent future, or any object with ``done``, ``set_result`` and
        ``set_exception``) is told its outcome.  Raises, adding nothing, on a record the
        format cannot encode."""
        size = records.append_record(self.buf, limit, self.count, ts - self.base_ts, key, value, headers)
        if not size:
            return False
        self.futures.append(sink)
        self.timestamps.append(ts)
        self.count += 1
        self.size += size
        self.reserved += reserved
        if ts > self.max_ts:
            self.max_ts = ts
        return True

    def resolve_records(self, meta_type, topic: str, partition: int, base_offset: int, append_time: int) -> None:
        """Tell each record's sink not done yet its ``meta_type((topic, partition, offset,
        timestamp))``: offsets from ``base_offset`` (all -1 when it is -1), the timestamp
        ``append_time`` unless it is -1, else the record's."""
        new = tuple.__new__
        off = base_offset
        step = 1 if base_offset >= 0 else 0
        for fut, ts in zip(self.futures, self.timestamps, strict=True):
            if not fut.done():
                fut.set_result(new(meta_type, (topic, partition, off, append_time if append_time != -1 else ts)))
            off += step


RecordBuffer = records._C.RecordBuffer if records._C is not None else _RecordBuffer


class Batch(RecordBuffer):
    """One record batch of one partition: open (growing), queued, in flight, then done.

    Records are encoded into ``buf`` as they are added (``RecordBuffer.add``, in C with the
    compiled codec); per-record state is two parallel lists (sinks, timestamps) so resolving
    costs one loop per batch.  A bulk batch holds its encoded body and neither.

    Outcome bookkeeping for a failed send (``errors.send_failure``): ``in_flight`` is true
    while an attempt has been written to a connection and not answered; ``maybe_stored``
    becomes true once any attempt's fate is unknown, and goes back only when the broker
    proves that no attempt was stored (an idempotent batch answered OUT_OF_ORDER_SEQUENCE,
    see client/sequences.py).

    Idempotence: ``producer_id``, ``producer_epoch`` and ``sequence`` (the base sequence)
    are -1 until the sender drains the batch for the first time, then fixed for every retry
    unless the partition is renumbered (``stamp``); ``drain_no`` numbers the partition's
    batches in the order they were first drained (-1 before): retries are resent in that
    order.
    """

    __slots__ = (  # and RecordBuffer's: buf, futures, timestamps, count, size, reserved, base_ts, max_ts
        "topic", "partition", "deadline", "linger_at", "bulk", "bulk_index", "data",
        "attempts", "last_error", "in_flight", "maybe_stored", "_done",
        "producer_id", "producer_epoch", "sequence", "drain_no",
    )  # fmt: skip

    def __init__(self, topic: str, partition: int, base_ts: int, deadline: float) -> None:
        self.topic = topic
        self.partition = partition
        self.buf: bytearray | bytes | None = bytearray()
        self.futures: list[asyncio.Future] = []
        self.timestamps: list[int] = []
        self.count = 0
        self.size = 0
        self.base_ts = self.max_ts = base_ts
        self.deadline = deadline
        self.linger_at = 0.0
        self.reserved = 0
        self.bulk: Bulk | None = None
        self.bulk_index = 0
        self.data: bytes | None = None
        self.attempts = 0
        self.last_error: Exception | None = None
        self.in_flight = False
        self.maybe_stored = False
        self._done: asyncio.Future | None = None
        self.producer_id = self.producer_epoch = self.sequence = self.drain_no = -1

    def build(self, codec: int) -> bytes:
        """The batch's bytes (built, and compressed, once; kept for retries), with the
        producer fields it has now."""
        if self.data is None:
            self.data = records.build_batch(
                self.buf, self.count, self.base_ts, self.max_ts, codec,
                self.producer_id, self.producer_epoch, self.sequence,
            )
            self.buf = None
        return self.data

    def wire_size(self, codec: int) -> int:
        """Bytes the batch takes in a request; builds it only when compressed (the size is
        not known before)."""
        if self.data is not None:
            return len(self.data)
        if codec == compression.NO_COMPRESSION:
            return records.HEADER_SIZE + self.size
        return len(self.build(codec))

    def stamp(self, producer_id: int, producer_epoch: int, sequence: int) -> None:
        """Give the batch its idempotent identity; a batch built already is patched."""
        self.producer_id, self.producer_epoch, self.sequence = producer_id, producer_epoch, sequence
        if self.data is not None:
            self.data = records.stamp_producer(self.data, producer_id, producer_epoch, sequence)

    def resolve(self, base_offset: int, append_time: int) -> None:
        """Tell each record's sink its ``RecordMetadata`` (one loop for the batch)."""
        if self.bulk is not None:
            self.bulk.batch_done(self.bulk_index, base_offset, self.count)
            return
        self.resolve_records(RecordMetadata, self.topic, self.partition, base_offset, append_time)

    def fail(self, exc: BaseException) -> None:
        if self.bulk is not None:
            self.bulk.fail(exc)
            return
        for fut in self.futures:
            if not fut.done():
                fut.set_exception(exc)

    def settle(self, known: bool) -> None:
        """The attempt in flight ended: answered (``known``), or with its fate unknown."""
        if self.in_flight and not known:
            self.maybe_stored = True
        self.in_flight = False

    def timeout_error(self, delivery_timeout: float) -> errors.DeliveryTimeout:
        said = [f"last error: {self.last_error}"] if self.last_error else []
        if self.in_flight:
            said.append("an attempt was still unanswered")
        last = "; " + "; ".join(said or ["it was never sent"])
        err = errors.DeliveryTimeout(
            f"{self.count} record(s) for {self.topic}[{self.partition}] not acknowledged "
            f"within delivery_timeout_ms={delivery_timeout * 1000:g} "
            f"after {self.attempts} attempt(s){last}"
        )
        err.__cause__ = self.last_error
        return err

    def set_done(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        self._done = False  # marks "done" for later waiters

    async def wait_done(self, loop) -> None:
        if self._done is False:
            return
        if self._done is None:
            self._done = loop.create_future()
        await self._done


class Accumulator:
    """Open batches per partition, and the queues of closed batches waiting to be sent.

    Only the producer's loop touches it.  ``on_ready`` is called when the sender has
    something new to look at: a batch opened (a linger timer to arm) or closed.
    """

    def __init__(self, linger: float, delivery_timeout: float) -> None:
        self.linger = linger
        self.delivery_timeout = delivery_timeout
        self.open: dict[tuple[str, int], Batch] = {}
        # batches opened, and bytes of batches closed, per partition so far (what the
        # partitioner of keyless records goes by, client/partitioning.py)
        self.opened: dict[tuple[str, int], int] = {}
        self.bytes_closed: dict[tuple[str, int], int] = {}
        self.queues: dict[tuple[str, int], deque[Batch]] = {}
        self.incomplete: dict[Batch, None] = {}  # insertion-ordered set
        self.on_ready: Callable[[], None] = lambda: None
        # called once per batch at its end, with the error that failed it or None
        self.on_end: Callable[[Batch, BaseException | None], None] = lambda b, exc: None

    def topics(self) -> set[str]:
        return {tp[0] for tp in self.open} | {tp[0] for tp, q in self.queues.items() if q}

    def new_batch(self, topic: str, partition: int, ts: int) -> Batch:
        """A batch for ``topic[partition]``, not open yet: ``adopt`` opens it (after its
        first record was added, so that a record failing to encode opens none)."""
        now = time.monotonic()
        b = Batch(topic, partition, ts, now + self.delivery_timeout)
        b.linger_at = now + self.linger
        return b

    def adopt(self, b: Batch) -> None:
        """Open ``b`` (from ``new_batch``) as its partition's batch."""
        tp = (b.topic, b.partition)
        self.open[tp] = b
        self.opened[tp] = self.opened.get(tp, 0) + 1
        self.incomplete[b] = None
        self.on_ready()

    def close(self, b: Batch) -> None:
        tp = (b.topic, b.partition)
        if self.open.get(tp) is b:
            del self.open[tp]
        self.bytes_closed[tp] = self.bytes_closed.get(tp, 0) + b.size
        q = self.queues.get(tp)
        if q is None:
            q = self.queues[tp] = deque()
        q.append(b)
        self.on_ready()

    def add_closed(
        self, topic: str, partition: int, body: bytes, count: int, ts: int, reserved: int,
        bulk: Bulk,
    ) -> Batch:
        b = Batch(topic, partition, ts, time.monotonic() + self.delivery_timeout)
        b.buf = body
        b.count = count
        b.size = len(body)
        b.reserved = reserved
        b.bulk = bulk
        b.bulk_index = bulk.next_index
        bulk.next_index += 1
        self.incomplete[b] = None
        self.close(b)
        return b

    def close_lingered(self, now: float, force: bool) -> float | None:
        """Close open batches whose linger passed (all of them with ``force``); return the
        earliest linger or delivery deadline still pending."""
        wake_at = None
        for b in list(self.open.values()):
            if force or b.linger_at <= now:
                self.close(b)
            else:
                due = min(b.linger_at, b.deadline)  # the deadline matters past a long linger
                if wake_at is None or due < wake_at:
                    wake_at = due
        return wake_at

    def expire(self, now: float, release: Callable[[Batch], None]) -> None:
        """Fail batches not in flight whose delivery deadline passed."""
        for tp, b in list(self.open.items()):
            if b.deadline <= now:
                del self.open[tp]
                self.finish(b, b.timeout_error(self.delivery_timeout), release)
        for q in self.queues.values():
            while q and q[0].deadline <= now:
                b = q.popleft()
                self.finish(b, b.timeout_error(self.delivery_timeout), release)

    def finish(self, b: Batch, exc: BaseException | None, release: Callable[[Batch], None]) -> None:
        """A batch's end: fail its futures when ``exc`` is set (with a copy saying whether
        the records may have been stored), release its memory.  Idempotent."""
        if self.incomplete.pop(b, 0) is None:
            if exc is not None:
                b.settle(known=False)
                b.fail(errors.send_failure(exc, b.maybe_stored))
            self.on_end(b, exc)
            release(b)
            b.set_done()

    def fail_all(self, exc: BaseException, release: Callable[[Batch], None]) -> None:
        batches = list(self.open.values())
        self.open.clear()
        for q in self.queues.values():
            batches.extend(q)
            q.clear()
        for b in batches:
            self.finish(b, exc, release)
