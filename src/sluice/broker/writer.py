"""The writer of a partition: its group-commit queue, the disk write both append paths
share, truncations, and the flush policy.

Group commit: every produce request for the partition, from every connection, is queued;
the writer task takes *all* queued requests at once and hands each run of one kind to its
path — a leader's appends to broker/leader_append.py, a follower's copies to
broker/follower_append.py — which writes the whole run with one ``pwritev`` and at most one
``fdatasync`` (``write``), then answers it.  Every file call of a group runs off the event
loop: the write and its fsync in one job of the syncer's native threads
(storage/syncer.py: no GIL to wait for, so the hop costs little), a segment roll in a worker
thread.  A disk that hangs holds the partition's writer, not the broker's fetches,
heartbeats and other disks (broker/disk_health.py watches every job).  While a group is
written the next one gathers.  Flush policy: ``flush.messages == 1`` fsyncs every group
before its acks ("always"); otherwise acks go out after the write, and a background fsync
starts when ``flush.messages`` messages are unflushed or the oldest unflushed write is
``flush.ms`` old (the writer task doubles as the flusher; appends go on while the fsync
runs).  Truncations (``truncate_to``, ``reset_to``) run in the writer's turn, between the
appends queued before and after them.  Nothing piles up: bytes queued for the writer
(``write.queue.max.bytes``) are bounded (``admit``).

Concurrency: event loop only, except ``_roll_blocking`` (a worker thread).  The writer task
is the only one that appends to, truncates or flushes the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from sluice.broker.disk_health import DiskHealth
from sluice.broker.leadership import Leadership
from sluice.broker.reading import Reads
from sluice.config import TopicConfig
from sluice.errors import (
    BrokerShuttingDown,
    LeadershipLost,
    NotLeader,
    UnknownServerError,
    storage_error_from_os,
)
from sluice.protocol.records import BatchSpan, ReplicaBatch
from sluice.storage.log import PartitionLog
from sluice.storage.producers import Duplicate, write_snapshot
from sluice.storage.segment import Segment
from sluice.storage.syncer import Syncer
from sluice.storage.tail import Tail

log = logging.getLogger("sluice.broker")

FLUSH_RETRY_S = 1.0  # after a failed background fsync


@dataclass
class Append:
    """One request queued for the writer: a leader's batches or a follower's copy."""

    data: bytearray | memoryview
    spans: list[BatchSpan] | list[ReplicaBatch]
    future: asyncio.Future
    size: int = 0
    acks_all: bool = False  # the future completes when the high watermark passes the batches
    replica: bool = False  # a follower's copy: offsets, epochs and timestamps are the leader's
    deadline: float | None = None  # loop time an acks=all wait gives up at (RequestTimedOut)
    fetched_in: int | None = None  # a follower's copy: the leader epoch it was fetched in
    # set by the writer when some batches are duplicates: per batch of the request, in
    # order, its Duplicate or None (new; ``spans`` then holds only the new ones)
    dups: list[Duplicate | None] | None = None


@dataclass
class Truncate:
    offset: int
    future: asyncio.Future
    reset: bool = False  # drop the whole log and start it empty at ``offset``


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    append_time: int  # -1 with CreateTime
    # each batch's base offset, in request order (a duplicate's is its original's, or -1
    # when too old to be remembered); empty for a follower's copy
    batch_offsets: tuple[int, ...] = ()


class Writer:
    """The queue, task, disk writes, truncations and flushes of one partition's log.

    ``log``: the partition's log; ``config``: the topic's config (flush policy,
    ``write.queue.max.bytes``; replaced on a reconfiguration); ``leadership``: whose
    ``synced_end`` the writer moves and whose high watermark a leader's append moves;
    ``disk``: watches every disk job; ``reads``: woken after appends and truncations;
    ``tail``: the newest leader writes, cleared by a truncation; ``write_executor``: the
    threads rolls, truncations and background fsyncs run in; ``syncer``: the native
    threads a group's write and fsync run in (closed with the writer when ``own_syncer``);
    ``write_run``: writes one run of queued appends of one kind (the partition hands it to
    the leader's path or the follower's); ``name``: ``topic-index``.
    """

    def __init__(
        self,
        log: PartitionLog,
        config: TopicConfig,
        leadership: Leadership,
        disk: DiskHealth,
        reads: Reads,
        tail: Tail,
        write_executor: Executor,
        syncer: Syncer,
        own_syncer: bool,
        write_run: Callable[[list[Append]], Awaitable[None]],
        name: str,
    ) -> None:
        self.log = log
        self.config = config
        self._leadership = leadership
        self._disk = disk
        self._reads = reads
        self._tail = tail
        self.write_executor = write_executor
        self.syncer = syncer
        self._own_syncer = own_syncer
        self._write_run = write_run
        self._name = name
        self.queue: list[Append | Truncate] = []
        self.queued_bytes = 0  # of appends queued or being written
        self.closing = False  # closed or being closed: no more appends
        self.truncating = False
        self.swapping: asyncio.Future | None = None  # cleaned segments being renamed in (a truncation waits)
        self.wakeup = asyncio.Event()
        self._writing: list[Append] | None = None  # the leader group the writer is on
        self._unflushed = 0
        self._unflushed_since = 0.0
        self._flush_future: asyncio.Future | None = None
        self._retry_flush_at = 0.0
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"writer {name}")

    # ------------------------------------------------------------------ the queue

    def admit(self, size: int) -> bool:
        """Room in the writer's queue for ``size`` more bytes (one request always fits)."""
        queued = self.queued_bytes
        return not queued or queued + size <= self.config.write_queue_max_bytes

    def enqueue(self, req: Append | Truncate) -> None:
        if isinstance(req, Append):
            self.queued_bytes += req.size
        self.queue.append(req)
        self.wakeup.set()

    def truncate_to(self, offset: int) -> asyncio.Future:
        """Cut the log at ``offset`` (see PartitionLog.truncate_to), in the writer's turn:
        after the appends queued before this call, before those queued after it.  The
        future fails with a ``StorageError`` when the disk refuses."""
        fut = asyncio.get_running_loop().create_future()
        if self.closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
        else:
            self.enqueue(Truncate(offset, fut))
        return fut

    def reset_to(self, offset: int) -> asyncio.Future:
        """Drop the whole log and start it empty at ``offset`` (see PartitionLog.reset_to),
        in the writer's turn, like ``truncate_to``."""
        fut = asyncio.get_running_loop().create_future()
        if self.closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
        else:
            self.enqueue(Truncate(offset, fut, reset=True))
        return fut

    def depose(self, leader_epoch: int) -> None:
        """The partition got a new leader (epoch ``leader_epoch``): the leader writes it
        stops are answered now, not when a disk that hangs returns: the group being written
        fails as maybe stored (``LeadershipLost``: its write may still land, and be
        truncated away), the queued ones with ``NotLeader`` (nothing of them is written)."""
        lost = LeadershipLost(
            f"{self._name} got a new leader (epoch {leader_epoch}) while the write was in progress"
        )
        for req in self._writing or ():
            if not req.future.done():
                req.future.set_exception(lost)
        refused = NotLeader(f"{self._name} got a new leader (epoch {leader_epoch})")
        for req in self.queue:
            if isinstance(req, Append) and not req.replica and not req.future.done():
                req.future.set_exception(refused)

    # ------------------------------------------------------------------ the task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue:
                if self.closing:
                    return
                timer = None
                due = self._flush_due_in()
                if due is not None:
                    timer = loop.call_later(due, self.wakeup.set)
                await self.wakeup.wait()
                if timer is not None:
                    timer.cancel()
            self.wakeup.clear()
            taken, self.queue = self.queue, []
            for run in _runs(taken):
                if isinstance(run, Truncate):
                    await self.truncate(run)
                    continue
                group = [req for req in run if not req.future.cancelled()]
                if group:
                    await self._write_guarded(group)
                self.queued_bytes -= sum(req.size for req in run)
            self._maybe_flush(loop)

    async def _write_guarded(self, group: list[Append]) -> None:
        self._writing = None if group[0].replica else group
        try:
            await self._write_run(group)
        except Exception as exc:  # a bug must not kill the writer: fail this group only
            log.exception("writer of %s failed", self._name)
            err = UnknownServerError(f"append to {self._name} failed: {exc!r}")
            for req in group:
                if not req.future.done():
                    req.future.set_exception(err)
        finally:
            self._writing = None

    async def truncate(self, req: Truncate) -> None:
        """Writer: truncate with no flush, cleaned-segment swap or append running beside
        it; ``req.future`` gets None or the ``StorageError``."""
        loop = asyncio.get_running_loop()
        if self._flush_future is not None:
            await asyncio.wait([self._flush_future])
        if self.swapping is not None:  # renames of cleaned segments: milliseconds
            await asyncio.wait([self.swapping])
        self.truncating = True
        self._tail.clear()
        try:
            cut = self.log.reset_to if req.reset else self.log.truncate_to
            await loop.run_in_executor(self.write_executor, cut, req.offset)
        except OSError as exc:
            err = storage_error_from_os(exc, f"truncate {self._name}")
            log.error("%s", err)
            if not req.future.done():
                req.future.set_exception(err)
            return
        finally:
            self.truncating = False
        self._disk.truncated(req.offset)
        if not req.future.done():
            req.future.set_result(None)
        self._reads.notify()

    # ------------------------------------------------------------------ the shared write steps

    async def write(self, first: int, buffers: list, total: int, count: int, now_ms: int, sync: bool) -> Segment:
        """Write a group's ``buffers`` (``total`` bytes, ``count`` offsets from ``first``,
        the log end) at the log end, fsynced if ``sync``; roll to a new segment first when
        the active one is due (``now_ms``: the group's time).  Returns the segment written
        to; the caller records the group in the log (``PartitionLog.appended``).  Raises
        ``OSError`` with nothing of the group left in the log.  The disk job is watched for
        stalls (``DiskHealth.watch``)."""
        plog = self.log
        if not plog.roll_due(total, count, now_ms):  # the common case: one native job, no Python thread
            segment = plog.active
            await self._disk.watch(self.syncer.append(segment, buffers, total, sync), total)
            return segment
        rolled = plog.active
        snapshot = plog.producers.encode()  # the producer state below ``first``
        segment = await self._disk.watch(asyncio.get_running_loop().run_in_executor(
            self.write_executor, self._roll_blocking, rolled, first, buffers, total, sync, snapshot,
        ), total + rolled.size)
        plog.roll(segment)
        return segment

    async def fsync(self, segment: Segment, size: int) -> None:
        """fdatasync ``segment`` after ``size`` bytes were written to it, watched for stalls;
        raises ``OSError``."""
        await self._disk.watch(self.syncer.fdatasync(segment.fileno, segment.path), size)

    def written(self, first: int, end: int, size: int, synced: bool) -> None:
        """A group of ``size`` bytes, offsets ``first`` to ``end``, is written (and fsynced
        if ``synced``): it counts for the high watermark now, and for the flush policy
        unless fsynced.  On a leader (a follower made leader meanwhile too) fetches waiting
        at the end wake."""
        lead = self._leadership
        lead.synced_end = end
        if not synced:
            if not self._unflushed:
                self._unflushed_since = time.monotonic()
            self._unflushed += end - first
        if lead.is_leader:
            # Readers first: fetches waiting at the end wake before the writers are
            # answered, so a tailing consumer's latency does not include those answers.
            # An acks=all wait entered after this is completed at once if the move covers it.
            lead.leader_appended(end, size)
            self._reads.notify_replicas()

    def _roll_blocking(
        self, active: Segment, base: int, buffers: list, total: int, sync: bool, snapshot: bytes | None,
    ) -> Segment:
        """Worker thread: create the next segment at ``base``, finish ``active`` (fsync,
        indexes, recovery point, the producer state at its end), then write the group to
        the new segment and fsync it if asked.  Returns the new segment (the caller makes
        it active, on the event loop).

        On a failure nothing of the group stays: the new segment is removed again (the
        next group rolls anew) and ``active`` stays the active segment.
        """
        segment = Segment.create(self.log.directory, base, self.log.config.index_interval_bytes)
        try:
            active.flush()
            active.seal()
            self.log.write_recovery_point(base)
            if snapshot is not None:
                write_snapshot(self.log.directory, base, snapshot)
            segment.write(buffers, total)
            if sync:
                segment.flush()
        except OSError:
            active.sealed = False  # still the active segment: written again
            segment.close()
            try:
                segment.delete()
            except OSError:
                log.exception("cannot remove %s after a failed roll", segment.path)
            raise
        return segment

    # ------------------------------------------------------------------ flush policy

    def _flush_due_in(self) -> float | None:
        """Seconds until the time-based flush is due; None when nothing waits for one (a
        running flush wakes the writer when it ends)."""
        if not self._unflushed or self.config.flush_ms <= 0 or self._flush_future is not None:
            return None
        due = self._unflushed_since + self.config.flush_ms / 1000
        return max(0.0, due - time.monotonic())

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
        fut = loop.run_in_executor(self.write_executor, self.log.flush)
        self._flush_future = fut
        fut.add_done_callback(lambda f: self._flushed(f, pending))

    def _flushed(self, fut: asyncio.Future, pending: int) -> None:
        self._flush_future = None
        exc = fut.exception()
        if exc is not None:
            self._disk.flush_failed(exc)  # acknowledged writes may be lost on this disk: lead no more
            self._unflushed_since = time.monotonic()  # try again after another flush.ms
            self._retry_flush_at = time.monotonic() + FLUSH_RETRY_S
            self._unflushed += pending
        self.wakeup.set()  # re-check: data written during the flush may be due already

    def reconfigure(self, config: TopicConfig) -> None:
        """Groups after this one follow ``config``'s flush policy; a flush it makes due
        starts at once."""
        self.config = config
        self.wakeup.set()  # the writer re-evaluates flushes and its flush.ms timer

    # ------------------------------------------------------------------ lifecycle

    async def stop(self) -> None:
        """Take no more appends; return once the queued ones are written."""
        self.closing = True
        self.wakeup.set()
        await self.task

    async def abort(self, err: Exception) -> None:
        """Take no more appends; the queued ones fail with ``err``, the one being written
        completes; return once it has."""
        self.closing = True
        queued, self.queue = self.queue, []
        for req in queued:
            if not req.future.done():
                req.future.set_exception(err)
        self.wakeup.set()
        await self.task

    async def flush_done(self) -> None:
        """Wait for a background fsync running (its outcome is its own)."""
        if self._flush_future is not None:
            await asyncio.wait([self._flush_future])

    def close_syncer(self) -> None:
        """Close the syncer if it is the writer's own."""
        if self._own_syncer:
            self.syncer.close()


def _runs(taken: list) -> list:
    """Split the writer's queue into groups of appends of one kind (leader's or replica's),
    with each truncation on its own between them, in queue order."""
    runs: list = []
    for item in taken:
        if isinstance(item, Truncate):
            runs.append(item)
        elif runs and isinstance(runs[-1], list) and runs[-1][0].replica == item.replica:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
