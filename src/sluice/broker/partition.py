"""Partition: one log, its group-commit writer, its flush policy and its fetch waiters.

Group commit: every produce request for the partition, from every connection, is queued;
the writer task takes *all* queued requests at once, assigns their offsets (per-batch header
patching, no per-record work), writes them with one ``pwritev`` and at most one
``fdatasync`` in a worker thread, then answers them all.  (A small group that needs neither
fsync nor a segment roll is written to the page cache on the event loop: cheaper than the
thread hop.)  While the thread works the next
group gathers.  Flush policy: ``flush.messages == 1`` fsyncs every group before its acks
("always"); otherwise acks go out after the write, and a background fsync starts when
``flush.messages`` messages are unflushed or the oldest unflushed write is ``flush.ms`` old
(the writer task doubles as the flusher; appends go on while the fsync runs).

Concurrency: every method except those named ``*_blocking`` runs on the event loop; the
writer task is the only one that appends to or flushes the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from sluice.config import TopicConfig
from sluice.errors import (
    BrokerShuttingDown,
    UnknownServerError,
    UnknownTopic,
    storage_error_from_os,
)
from sluice.protocol.records import BatchSpan, assign_offsets
from sluice.storage.log import PartitionLog, ReadResult
from sluice.storage.segment import Segment

log = logging.getLogger("sluice.broker")

# Groups up to this size that need no fsync and no roll are written on the event loop.
INLINE_WRITE_BYTES = 64 * 1024
FLUSH_RETRY_S = 1.0  # after a failed background fsync


@dataclass
class _Append:
    data: bytearray | memoryview
    spans: list[BatchSpan]
    future: asyncio.Future


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    append_time: int  # -1 with CreateTime


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        plog: PartitionLog,
        config: TopicConfig,
        write_executor: Executor,
        read_executor: Executor,
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = plog
        self.config = config
        self._write_executor = write_executor
        self._read_executor = read_executor
        self._queue: list[_Append] = []
        self._wakeup = asyncio.Event()
        self._waiters: list[Callable[[], None]] = []
        self._unflushed = 0
        self._unflushed_since = 0.0
        self._flush_future: asyncio.Future | None = None
        self._retry_flush_at = 0.0
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"writer {topic}-{index}"
        )

    # ------------------------------------------------------------------ producing

    def append(self, data: bytearray | memoryview, spans: list[BatchSpan]) -> asyncio.Future:
        """Queue validated batches (patched in place later); the future gives AppendResult.

        The future completes after the write, and after the fsync when the flush policy
        says "always".  It fails with a ``StorageError`` when the disk refuses the write
        (nothing of the request stays in the log) or ``BrokerShuttingDown``.  Cancelling
        it withdraws the append if the writer has not taken it yet (the client that asked
        is gone); once taken, the write completes regardless.
        """
        fut = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
            return fut
        self._queue.append(_Append(data, spans, fut))
        self._wakeup.set()
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._closing:
                    return
                timer = None
                due = self._flush_due_in()
                if due is not None:
                    timer = loop.call_later(due, self._wakeup.set)
                await self._wakeup.wait()
                if timer is not None:
                    timer.cancel()
            self._wakeup.clear()
            group = [req for req in self._queue if not req.future.cancelled()]
            self._queue = []
            if group:
                try:
                    await self._write_group(loop, group)
                except Exception as exc:  # a bug must not kill the writer: fail this group only
                    log.exception("writer of %s-%d failed", self.topic, self.index)
                    err = UnknownServerError(f"append to {self.topic}-{self.index} failed: {exc!r}")
                    for req in group:
                        if not req.future.done():
                            req.future.set_exception(err)
            self._maybe_flush(loop)

    def _flush_due_in(self) -> float | None:
        """Seconds until the time-based flush is due; None when nothing waits for one (a
        running flush wakes the writer when it ends)."""
        if not self._unflushed or self.config.flush_ms <= 0 or self._flush_future is not None:
            return None
        due = self._unflushed_since + self.config.flush_ms / 1000
        return max(0.0, due - time.monotonic())

    async def _write_group(self, loop: asyncio.AbstractEventLoop, group: list[_Append]) -> None:
        plog, cfg = self.log, self.config
        now_ms = int(time.time() * 1000)
        append_time = now_ms if cfg.timestamp_type == "LogAppendTime" else None
        total = sum(s.size for req in group for s in req.spans)
        count = sum(s.count for req in group for s in req.spans)
        rolled = plog.prepare_append(total, count, now_ms)
        segment = plog.active
        first = offset = plog.next_offset
        buffers, metas, bases = [], [], []
        for req in group:
            bases.append(offset)
            for s in req.spans:
                ts = append_time if append_time is not None else s.max_timestamp
                metas.append((offset, offset + s.count, ts, s.size))
                offset += s.count
            assign_offsets(req.data, req.spans, bases[-1], 0, append_time)
            buffers.append(req.data)
        sync = cfg.flush_messages == 1  # "always": the fsync is part of the acknowledgement
        try:
            if sync or rolled is not None or total > INLINE_WRITE_BYTES:
                await loop.run_in_executor(
                    self._write_executor, self._write_blocking, rolled, segment, buffers, total, sync
                )
            else:
                # A small write to the page cache costs microseconds; a thread hop costs more.
                self._write_blocking(None, segment, buffers, total, False)
        except OSError as exc:
            err = storage_error_from_os(exc, f"append to {self.topic}-{self.index}")
            log.error("%s", err)
            for req in group:
                if not req.future.done():
                    req.future.set_exception(err)
            return
        plog.next_offset = offset
        plog.appended(segment, metas, offset)
        if not sync:
            if not self._unflushed:
                self._unflushed_since = time.monotonic()
            self._unflushed += offset - first
        result_time = append_time if append_time is not None else -1
        for req, base in zip(group, bases, strict=True):
            if not req.future.done():
                req.future.set_result(AppendResult(base, result_time))
        self._notify()

    def _write_blocking(
        self, rolled: Segment | None, segment: Segment, buffers: list, total: int, sync: bool
    ) -> None:
        """Worker thread: finish a rolled segment, write the group, fsync if asked.

        On a failed fsync the group's bytes are cut again: an unsynced write whose fsync
        failed may be lost by the kernel, so it must not stay visible as if written.
        """
        if rolled is not None:
            rolled.flush()
            rolled.save_indexes()
            self.log.write_recovery_point(segment.base_offset)
        segment.write(buffers, total)
        if sync:
            try:
                segment.flush()
            except OSError:
                os.ftruncate(segment.fileno, segment.size)
                raise

    def _maybe_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a background fsync when ``flush.messages`` or ``flush.ms`` says so.

        The fsync runs in a worker thread beside later appends (the kernel allows writes
        to a file while it is being synced); acknowledgements do not wait for it.  At most
        one runs at a time; what is written meanwhile waits for the next one.
        """
        cfg = self.config
        if not self._unflushed or self._flush_future is not None:
            return
        if time.monotonic() < self._retry_flush_at:  # the last fsync failed: do not hammer the disk
            return
        by_count = cfg.flush_messages >= 1 and self._unflushed >= cfg.flush_messages
        if not (by_count or self._flush_due_in() == 0):
            return
        pending, self._unflushed = self._unflushed, 0
        fut = loop.run_in_executor(self._write_executor, self.log.flush)
        self._flush_future = fut
        fut.add_done_callback(lambda f: self._flushed(f, pending))

    def _flushed(self, fut: asyncio.Future, pending: int) -> None:
        self._flush_future = None
        exc = fut.exception()
        if exc is not None:
            log.error("%s", storage_error_from_os(exc, f"flush of {self.topic}-{self.index}"))
            self._unflushed_since = time.monotonic()  # try again after another flush.ms
            self._retry_flush_at = time.monotonic() + FLUSH_RETRY_S
            self._unflushed += pending
        self._wakeup.set()  # re-check: data written during the flush may be due already

    def reconfigure(self, config: TopicConfig) -> None:
        """Apply a changed topic config to this live partition (event loop).

        Write groups after this one follow its flush policy and timestamp type; produce
        checks ``max.message.bytes`` from it; the log takes its segment, retention and index
        settings.  A flush the new policy makes due starts at once (switching to
        ``flush.messages=1`` fsyncs what earlier acknowledgements left unflushed).
        """
        self.config = config
        self.log.reconfigure(config.log_config)
        self._wakeup.set()  # the writer re-evaluates flushes and its flush.ms timer

    # ------------------------------------------------------------------ reading

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    async def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Whole batches from ``offset`` (see PartitionLog.read), read off the event loop."""
        if offset == self.log.high_watermark:
            return ReadResult(b"", offset, self.log.log_start_offset)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_executor, self.log.read, offset, max_bytes)

    async def offset_for_time(self, timestamp: int) -> int | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_executor, self.log.offset_for_time, timestamp)

    def add_waiter(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the high watermark moves (fetch long poll)."""
        self._waiters.append(callback)

    def remove_waiter(self, callback: Callable[[], None]) -> None:
        try:
            self._waiters.remove(callback)
        except ValueError:
            pass

    def wake_fetches(self) -> None:
        """Call every fetch waiter now, as if the high watermark had moved."""
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for cb in waiters:
            cb()

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Finish queued writes, fsync, save indexes, close files."""
        self._closing = True
        self._wakeup.set()
        await self._task
        if self._flush_future is not None:
            await asyncio.wait([self._flush_future])
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._write_executor, self.log.close)
        self._notify()

    async def abort(self) -> None:
        """Stop for a topic deletion: queued appends fail, the one being written completes."""
        self._closing = True
        queued, self._queue = self._queue, []
        for req in queued:
            if not req.future.done():
                req.future.set_exception(UnknownTopic(f"topic {self.topic!r} was deleted"))
        self._wakeup.set()
        await self._task
        self._notify()

    def take_expired(self, now_ms: int) -> list[Segment]:
        return self.log.expired_segments(now_ms)
