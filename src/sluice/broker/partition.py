"""Partition: one log, its group-commit writer, its flush policy, its acknowledgements.

Group commit: every produce request for the partition, from every connection, is queued;
the writer task takes *all* queued requests at once, assigns their offsets and the leader
epoch (per-batch header patching, no per-record work), writes them with one ``pwritev`` and
at most one ``fdatasync``, then answers them all.  Every file call of a group runs off the
event loop: the write and its fsync in one job of the syncer's native threads
(storage/syncer.py: no GIL to wait for, so the hop costs little), a segment roll in a worker
thread.  A disk that hangs holds the partition's writer, not the broker's fetches,
heartbeats and other disks.  While a group is written the next one gathers.  Flush
policy: ``flush.messages == 1`` fsyncs every group before its acks ("always"); otherwise
acks go out after the write, and a background fsync starts when ``flush.messages``
messages are unflushed or the oldest unflushed write is ``flush.ms`` old (the writer task
doubles as the flusher; appends go on while the fsync runs).

Appended is not acknowledged.  The writer only appends and completes "appended" futures
(``acks=leader``); ``acks=all`` writes then wait in the partition's purgatory
(broker/purgatory.py) until the high watermark passes them.  On the leader the high
watermark is the minimum log end over the in-sync replicas: its own (after each append,
after its fsync with ``flush.messages=1``) and each in-sync follower's, as its replica
fetches report it (``follower_fetched``).  A partition with no followers (one replica)
moves it with its own log end.  ``acks=all`` is refused at once (``NOT_ENOUGH_REPLICAS``)
when the ISR is smaller than ``min.insync.replicas`` or an in-sync follower is more than
``replica.lag.max.bytes`` behind (seed ``000``: answer at once, never pile up); and checked
again when the high watermark passes the write: an ISR that shrank below the minimum
meanwhile answers ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (maybe stored), never success.  Nothing
piles up: bytes queued for the writer (``write.queue.max.bytes``) and waits in the
purgatory are bounded per partition, and a write past a bound is refused at once
(``BROKER_BUSY``).

The leader's view of its followers, the ISR it applies and the high watermark they give
are in broker/leadership.py, reads and the long polls waiting for more in
broker/reading.py, the log cleaner's passes over a compacted log in broker/compacting.py
(parts of ``Partition``).  Retention by time and size does not apply to compacted
partitions.

Disk trouble fails fast (seed ``000``): a leader whose disk refuses a write or an fsync
(not a full disk: that waits for space), or whose write has not returned after
``DISK_STALL_S``, hands its leadership to an in-sync follower (``on_disk_failure``,
broker/stepdown.py); one whose fsync fails after followers could copy the group stops
writing in that epoch instead of cutting its tail (``_fence``).

A follower's path (``append_as_follower``) goes through the same writer but keeps the
leader's offsets, epochs and timestamps; ``truncate_to`` cuts a divergent tail in the
writer's turn.

Concurrency: every method except those named ``*_blocking`` runs on the event loop; the
writer task is the only one that appends to, truncates or flushes the log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from sluice.broker.compacting import Compacting
from sluice.broker.leadership import Follower, Leadership
from sluice.broker.purgatory import Purgatory
from sluice.broker.reading import Reading
from sluice.config import TopicConfig
from sluice.errors import (
    BrokerBusy,
    BrokerShuttingDown,
    CorruptRecord,
    DiskFull,
    FencedLeaderEpoch,
    InvalidRecord,
    LeadershipLost,
    NotEnoughReplicas,
    NotLeader,
    OutOfOrderSequence,
    ProducerFenced,
    StorageError,
    UnknownServerError,
    UnknownTopic,
    storage_error_from_os,
)
from sluice.protocol.records import (
    BatchSpan,
    ReplicaBatch,
    assign_offsets,
    validate_replica_batches,
)
from sluice.protocol.transactions import TXN_BITS
from sluice.storage.log import PartitionLog
from sluice.storage.producers import Duplicate, Staging, write_snapshot
from sluice.storage.segment import Segment
from sluice.storage.syncer import Syncer
from sluice.storage.tail import Tail

log = logging.getLogger("sluice.broker")

# A write or fsync of the writer still running after this long means a hung or frozen disk,
# plus the time its bytes take at STALL_BYTES_PER_S (a roll fsyncs a whole segment's tail).
DISK_STALL_S = 0.5
STALL_BYTES_PER_S = 100 * 1024 * 1024
STALL_RECHECK_S = 0.02
FLUSH_RETRY_S = 1.0  # after a failed background fsync


@dataclass
class _Append:
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
class _Truncate:
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


class Partition(Leadership, Reading, Compacting):
    def __init__(
        self,
        topic: str,
        index: int,
        plog: PartitionLog,
        config: TopicConfig,
        write_executor: Executor,
        read_executor: Executor,
        *,
        replica_id: int = 0,
        leader_epoch: int = 0,
        leader: bool = True,
        tail_cache_bytes: int = 1024 * 1024,
        syncer: Syncer | None = None,
        on_disk_failure: Callable[[Partition, StorageError], None] | None = None,
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = plog
        self.config = config
        self._write_executor = write_executor
        self._read_executor = read_executor
        # the fsyncs acknowledgements wait for (flush.messages=1); without a shared one given,
        # the partition has its own, closed with it
        self._own_syncer = syncer is None
        self._syncer = Syncer(1, write_executor) if syncer is None else syncer
        self._tail = Tail(tail_cache_bytes)  # the newest leader writes, for tailing readers
        self.replica_id = replica_id
        # never below an epoch already in the log: a restart keeps the last one stamped
        self.leader_epoch = max(leader_epoch, plog.epochs.latest_epoch, 0)
        self.is_leader = leader
        self.isr: tuple[int, ...] = (replica_id,)
        self.joining: tuple[int, ...] = ()  # on the leader: an ISR expansion being written
        self.followers: dict[int, Follower] = {}  # on the leader: the other replicas
        self.failed_followers: set[int] = set()  # on the leader: replicas that cannot write
        self.state_version: int | None = None  # of the store's state last applied (None: stale)
        self.seen_version = -1  # the newest version of the store's state applied here
        self.stale_epoch = -1  # never lead in this epoch or an older one (a restart, a cut log)
        self.withdrawing = False  # restarted with records lost: to leave the ISR until caught up
        self.fenced_version = -1  # the state version whose swap (new epoch, or leaving) was started
        # On the leader, call with a reason when it cut its own log (a failed fsync of a
        # group followers may have copied): it stops leading in this epoch at once and the
        # broker has the store start a new one (ReplicaManager.new_leader_epoch).  Event loop.
        self.new_epoch_needed: Callable[[str], None] = lambda why: None
        self.leader_log_start = -1  # on a follower: its leader's log start, as last fetched
        self._replica_waiters: list[Callable[[], None]] = []  # replica fetches waiting for appends
        # the log end as far as the writer has finished with it (written, and fsynced with
        # flush.messages=1); below the log end only while a leader's fsync runs
        self._synced_end = plog.log_end_offset
        self._marks: deque[tuple[int, int]] = deque()  # (log end, bytes appended) on the leader
        self._appended_bytes = 0
        self._queue: list[_Append | _Truncate] = []
        self._queued_bytes = 0  # of appends queued or being written
        self._acks = Purgatory()
        self._truncating = False
        self._cleaning: asyncio.Task | None = None
        self._swapping: asyncio.Future | None = None  # cleaned segments being renamed in
        self._stop_cleaning = threading.Event()
        self._wakeup = asyncio.Event()
        self._waiters: list[Callable[[], None]] = []
        self._unflushed = 0
        self._unflushed_since = 0.0
        self._flush_future: asyncio.Future | None = None
        self._retry_flush_at = 0.0
        self._closing = False
        # called (event loop) when this partition's disk fails or stalls while it leads
        self._on_disk_failure = on_disk_failure
        # the leader epoch whose writes stopped after a published group's fsync failed (_fence)
        self._fenced_epoch: int | None = None
        self._writing: list[_Append] | None = None  # the leader group the writer is on
        self.stalled = False  # a write or fsync of the writer hangs (``_on_disk``)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"writer {topic}-{index}"
        )
        if leader:
            self._log_end_moved()

    # ------------------------------------------------------------------ producing

    @property
    def fenced(self) -> bool:
        """Leads, but writes no more in this epoch: a published group's fsync failed."""
        return self.is_leader and self._fenced_epoch == self.leader_epoch

    @property
    def unsynced_from(self) -> int | None:
        """Where a tail that this broker published as leader but could not fsync starts
        (``_fence``), until it is cut; None when there is none.  Kept when the partition
        becomes a follower: its fetcher cuts there before fetching (broker/fetcher.py)."""
        return None if self._fenced_epoch is None else min(self._synced_end, self.log.log_end_offset)

    @property
    def closing(self) -> bool:
        """Closed or being closed (a shutdown, its topic deleted): it takes no appends."""
        return self._closing

    def append(
        self, data: bytearray | memoryview, spans: list[BatchSpan], acks_all: bool = False,
        deadline: float | None = None,
    ) -> asyncio.Future:
        """Queue validated batches (patched in place later); the future gives AppendResult.

        The future completes after the write, and after the fsync when the flush policy
        says "always"; with ``acks_all``, once the high watermark passes the batches, if the
        ISR then has at least ``min.insync.replicas`` members (else it fails with
        ``NotEnoughReplicasAfterAppend``: appended, maybe stored), or with
        ``RequestTimedOut`` at ``deadline`` (loop time), its purgatory slot freed.  It
        fails at once, with nothing written, with ``NotEnoughReplicas`` (``acks_all`` while
        the ISR is smaller than ``min.insync.replicas``), ``BrokerBusy`` (the writer's queue
        or the purgatory is full), ``NotLeader`` or ``BrokerShuttingDown``; later with a
        ``StorageError`` when the disk refuses the write (nothing of the request stays in
        the log).  Cancelling it withdraws the append if the writer has not taken it yet
        (the client that asked is gone); once taken, the write completes regardless, and a
        cancelled ``acks_all`` wait leaves the purgatory.
        """
        fut = asyncio.get_running_loop().create_future()
        cfg = self.config
        size = len(data)
        if self._closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
        elif not self.is_leader:
            fut.set_exception(NotLeader(f"this broker does not lead {self.topic}-{self.index}"))
        elif self._fenced_epoch == self.leader_epoch:
            fut.set_exception(NotLeader(
                f"this broker gives up {self.topic}-{self.index}: an fsync failed on its disk"
            ))
        elif acks_all and len(self.isr) < cfg.min_insync_replicas:
            fut.set_exception(NotEnoughReplicas(
                f"{self.topic}-{self.index} has {len(self.isr)} in-sync replica(s), "
                f"min.insync.replicas is {cfg.min_insync_replicas}"
            ))
        elif acks_all and (lag := self._max_isr_lag_bytes()) > cfg.replica_lag_max_bytes >= 0:
            fut.set_exception(NotEnoughReplicas(
                f"an in-sync replica of {self.topic}-{self.index} is {lag} bytes behind "
                f"(replica.lag.max.bytes={cfg.replica_lag_max_bytes}); retry"
            ))
        elif not self._admit(size):
            fut.set_exception(BrokerBusy(
                f"{self.topic}-{self.index} has {self._queued_bytes} bytes queued for its writer "
                f"(write.queue.max.bytes={cfg.write_queue_max_bytes}); retry"
            ))
        elif acks_all and not self._acks.admit(
            fut, size, cfg.replica_wait_max_requests, cfg.replica_wait_max_bytes
        ):
            fut.set_exception(BrokerBusy(
                f"{self.topic}-{self.index} has {self._acks.requests} acks=all writes "
                f"({self._acks.bytes} bytes) waiting for replicas (replica.wait.max.requests="
                f"{cfg.replica_wait_max_requests}, replica.wait.max.bytes={cfg.replica_wait_max_bytes}); retry"
            ))
        else:
            self._enqueue(_Append(data, spans, fut, size, acks_all, deadline=deadline))
        return fut

    def append_as_follower(self, data: bytearray | memoryview, fetched_in: int | None = None) -> asyncio.Future:
        """Queue batches copied from the leader's log, kept as they are: base offsets,
        leader epochs and timestamps are the leader's.  The future gives AppendResult.

        ``fetched_in``: the leader epoch the batches were fetched in.  If the partition is
        in another epoch when the writer takes them, they are dropped (the future fails
        with ``FencedLeaderEpoch``): the new epoch's truncation may have been decided on a
        log without them, and they must not land after it.

        Checked here: every batch's header and CRC, offsets increasing between batches,
        epochs never decreasing; a partial last batch (a fetch's size cap cut it) is left
        out.  Checked by the writer: the first batch starts at the log end — or above it
        when the offsets between were compacted away on the leader (the gap is kept) — and
        its epoch is not below the log's latest.  A failed check fails the future
        with ``InvalidRecord`` and writes nothing of the request.  Written through the same
        group commit and flush policy as the leader's appends; the high watermark does not
        move (a follower takes it from its leader: ``advance_high_watermark``).
        """
        fut = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
            return fut
        if self.is_leader:
            fut.set_exception(NotLeader(f"{self.topic}-{self.index} is led here: not a follower"))
            return fut
        try:
            batches = validate_replica_batches(data)
        except CorruptRecord as exc:
            fut.set_exception(InvalidRecord(str(exc)))
            return fut
        if not batches:
            fut.set_result(AppendResult(self.log.log_end_offset, -1))
            return fut
        size = batches[-1].pos + batches[-1].size  # without a partial last batch
        if not self._admit(size):
            fut.set_exception(BrokerBusy(f"{self.topic}-{self.index}: writer queue full; retry"))
        else:
            self._enqueue(_Append(memoryview(data)[:size], batches, fut, size, replica=True, fetched_in=fetched_in))
        return fut

    def _admit(self, size: int) -> bool:
        """Room in the writer's queue for ``size`` more bytes (one request always fits)."""
        queued = self._queued_bytes
        return not queued or queued + size <= self.config.write_queue_max_bytes

    def _enqueue(self, req: _Append | _Truncate) -> None:
        if isinstance(req, _Append):
            self._queued_bytes += req.size
        self._queue.append(req)
        self._wakeup.set()

    def truncate_to(self, offset: int) -> asyncio.Future:
        """Cut the log at ``offset`` (see PartitionLog.truncate_to), in the writer's turn:
        after the appends queued before this call, before those queued after it.  The
        future fails with a ``StorageError`` when the disk refuses."""
        fut = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
        else:
            self._enqueue(_Truncate(offset, fut))
        return fut

    def reset_to(self, offset: int) -> asyncio.Future:
        """Drop the whole log and start it empty at ``offset`` (see PartitionLog.reset_to),
        in the writer's turn, like ``truncate_to``."""
        fut = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
        else:
            self._enqueue(_Truncate(offset, fut, reset=True))
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
            taken, self._queue = self._queue, []
            for run in _runs(taken):
                if isinstance(run, _Truncate):
                    await self._truncate(loop, run)
                    continue
                group = [req for req in run if not req.future.cancelled()]
                if group:
                    await self._write_guarded(loop, group)
                self._queued_bytes -= sum(req.size for req in run)
            self._maybe_flush(loop)

    async def _write_guarded(self, loop: asyncio.AbstractEventLoop, group: list[_Append]) -> None:
        self._writing = None if group[0].replica else group
        try:
            await self._write_group(loop, group)
        except Exception as exc:  # a bug must not kill the writer: fail this group only
            log.exception("writer of %s-%d failed", self.topic, self.index)
            err = UnknownServerError(f"append to {self.topic}-{self.index} failed: {exc!r}")
            for req in group:
                if not req.future.done():
                    req.future.set_exception(err)
        finally:
            self._writing = None

    def make_follower(self, leader_epoch: int) -> None:
        """``Leadership.make_follower``; besides, the leader writes it stops are answered
        now, not when a disk that hangs returns: the group being written fails as maybe
        stored (``LeadershipLost``: its write may still land, and be truncated away), the
        queued ones with ``NotLeader`` (nothing of them is written).  Producers retry on
        the new leader at once."""
        super().make_follower(leader_epoch)
        lost = LeadershipLost(
            f"{self.topic}-{self.index} got a new leader (epoch {leader_epoch}) while the write was in progress"
        )
        for req in self._writing or ():
            if not req.future.done():
                req.future.set_exception(lost)
        refused = NotLeader(f"{self.topic}-{self.index} got a new leader (epoch {leader_epoch})")
        for req in self._queue:
            if isinstance(req, _Append) and not req.replica and not req.future.done():
                req.future.set_exception(refused)

    async def _truncate(self, loop: asyncio.AbstractEventLoop, req: _Truncate) -> None:
        """Writer: truncate with no flush, retention pass or append running beside it."""
        if self._flush_future is not None:
            await asyncio.wait([self._flush_future])
        if self._swapping is not None:  # renames of cleaned segments: milliseconds
            await asyncio.wait([self._swapping])
        self._truncating = True
        self._tail.clear()
        try:
            cut = self.log.reset_to if req.reset else self.log.truncate_to
            await loop.run_in_executor(self._write_executor, cut, req.offset)
        except OSError as exc:
            err = storage_error_from_os(exc, f"truncate {self.topic}-{self.index}")
            log.error("%s", err)
            if not req.future.done():
                req.future.set_exception(err)
            return
        finally:
            self._truncating = False
        if self._fenced_epoch is not None and req.offset <= self._synced_end:
            self._fenced_epoch = None  # the tail whose fsync failed is gone
        if not req.future.done():
            req.future.set_result(None)
        self._notify()

    def _flush_due_in(self) -> float | None:
        """Seconds until the time-based flush is due; None when nothing waits for one (a
        running flush wakes the writer when it ends)."""
        if not self._unflushed or self.config.flush_ms <= 0 or self._flush_future is not None:
            return None
        due = self._unflushed_since + self.config.flush_ms / 1000
        return max(0.0, due - time.monotonic())

    async def _write_group(self, loop: asyncio.AbstractEventLoop, group: list[_Append]) -> None:
        plog, cfg = self.log, self.config
        first = offset = plog.log_end_offset
        if group[0].replica:
            group = self._follows(group, offset)
            if not group:
                return
        elif not self.is_leader or self._fenced_epoch == self.leader_epoch:
            # queued before make_follower or the fence: not ours to write any more
            err = NotLeader(f"{self.topic}-{self.index} has a new leader")
            for req in group:
                if not req.future.done():
                    req.future.set_exception(err)
            return
        elif self._fenced_epoch is not None:
            # leading again in a later epoch: cut what was published but never fsynced
            # (``_fence``) before anything is written in this epoch
            cut = _Truncate(min(self._synced_end, plog.log_end_offset), loop.create_future())
            await self._truncate(loop, cut)
            if cut.future.exception() is not None:
                for req in group:
                    if not req.future.done():
                        req.future.set_exception(cut.future.exception())
                self._disk_trouble(cut.future.exception())  # hand over once an heir can lead
                return
            self._fenced_epoch = None
            first = offset = plog.log_end_offset
            # A follower's offset heard before the cut (it copied the tail: the epoch
            # stamped at make_leader ended there) is not its copy of this log any more: it
            # holds other records where this group goes.  It counts again from its next
            # fetch, which the leader checks against the epochs as cut (KIP-320).
            for f in self.followers.values():
                f.log_end = min(f.log_end, offset)
        epoch = self.leader_epoch  # stamped on the batches of a leader group
        now_ms = int(time.time() * 1000)
        append_time = now_ms if cfg.timestamp_type == "LogAppendTime" else None
        staging = plog.producers.begin()
        if not group[0].replica:
            group = self._deduplicate(group, staging, offset)
            if not any(req.spans for req in group):  # duplicates of earlier groups only
                self._answer_duplicates(group)
                return
        total = sum(s.size for req in group for s in req.spans) if any(r.dups for r in group) else sum(
            req.size for req in group
        )
        count = sum(s.count for req in group if not req.replica for s in req.spans)
        if group[0].replica:
            count = group[-1].spans[-1].next_offset - offset
        rolled = plog.active if plog.roll_due(total, count, now_ms) else None
        snapshot = plog.producers.encode() if rolled is not None else None  # the state below `first`
        buffers, metas, ends = [], [], []
        epochs = []
        offsets: list[list[int]] = []
        for req in group:
            if req.replica:
                for b in req.spans:
                    metas.append((b.base_offset, b.next_offset, b.max_timestamp, b.size))
                    if not epochs or b.leader_epoch > epochs[-1][0]:
                        epochs.append((b.leader_epoch, b.base_offset))
                    if b.producer_id >= 0:
                        staging.record(
                            b.producer_id, b.producer_epoch, b.base_sequence, b.base_offset,
                            b.next_offset, b.next_offset - b.base_offset, b.max_timestamp,
                        )
                    if b.attributes & TXN_BITS:
                        staging.record_txn(b.attributes, b.base_offset, req.data, b.pos)
                offset = req.spans[-1].next_offset
                buffers.append(req.data)
                offsets.append([])
            else:
                base = offset
                mine = []
                for s in req.spans:
                    ts = append_time if append_time is not None else s.max_timestamp
                    metas.append((offset, offset + s.count, ts, s.size))
                    mine.append(offset)
                    if s.producer_id >= 0:
                        staging.record(
                            s.producer_id, s.producer_epoch, s.base_sequence, offset,
                            offset + s.count, s.count, ts,
                        )
                    if s.attributes & TXN_BITS:
                        staging.record_txn(s.attributes, offset, req.data, s.pos)
                    offset += s.count
                assign_offsets(req.data, req.spans, base, self.leader_epoch, append_time)
                if not epochs:
                    epochs.append((self.leader_epoch, base))
                if req.dups:
                    buffers.extend(memoryview(req.data)[s.pos : s.pos + s.size] for s in req.spans)
                else:
                    buffers.append(req.data)
                offsets.append(mine)
            ends.append(offset)
        sync = cfg.flush_messages == 1  # "always": the fsync is part of the acknowledgement
        # A leader with followers publishes the group before its fsync, so that they copy
        # it while the fsync runs: the high watermark still waits for the fsync
        # (``_synced_end``), so no acknowledgement and no consumer sees unsynced bytes.
        early = sync and self.is_leader and not group[0].replica and len(self.isr) > 1
        try:
            if rolled is None:  # the common case: one native job, no Python thread (storage/syncer.py)
                segment = plog.active
                await self._on_disk(self._syncer.append(segment, buffers, total, sync and not early), total)
            else:
                segment = await self._on_disk(loop.run_in_executor(
                    self._write_executor, self._roll_blocking, rolled, first, buffers, total,
                    sync and not early, snapshot,
                ), total + rolled.size)
        except OSError as exc:
            self._failed(group, exc)
            return
        if rolled is not None:
            plog.roll(segment)
        if group[0].replica:
            self._tail.clear()  # a follower serves no consumer, and a leader tail starts fresh
        else:
            self._tail.add(segment.base_offset, metas, buffers)
        stamped = plog.epochs.latest_epoch
        if group[0].replica and stamped > epochs[-1][0]:
            # This replica was made leader while the copy was in the disk's hands, and
            # ``make_leader`` stamped its epoch at the log end of that moment, below the
            # copy.  The stamp holds no batch (leader groups queue behind this one): move
            # it past the copy, as if the copy had landed first, or the copy's epoch would
            # end before it here, and followers holding it would cut and fetch it forever.
            plog.epochs.truncate_from_end(first)
            plog.appended(segment, metas, offset, epochs)
            plog.epochs.assign(stamped, offset)
        else:
            plog.appended(segment, metas, offset, epochs)
        staging.commit(offset)  # only now: the producer state never runs ahead of the log
        if early:
            self._notify_replicas()
            try:
                await self._on_disk(self._syncer.fdatasync(segment.fileno, segment.path), total)
            except OSError as exc:
                self._fence(epoch, group, first, exc)
                return
        self._synced_end = offset
        if not sync:
            if not self._unflushed:
                self._unflushed_since = time.monotonic()
            self._unflushed += offset - first
        if self.is_leader:
            # Readers first: fetches waiting at the end wake before the writers are
            # answered, so a tailing consumer's latency does not include those answers.
            # An acks=all wait entered below is completed at once if the move covers it.
            self._appended_bytes += total
            self._marks.append((offset, self._appended_bytes))
            self._log_end_moved()
            self._notify_replicas()
        result_time = append_time if append_time is not None else -1
        # make_follower may have run while the write was in the thread: its purgatory was
        # emptied then, and a wait entered now would be completed by the high watermark a
        # follower takes from the new leader, over a tail that is truncated away
        deposed = not group[0].replica and (not self.is_leader or self.leader_epoch != epoch)
        start = first
        for req, end, mine in zip(group, ends, offsets, strict=True):
            result = AppendResult(start, -1 if req.replica else result_time)
            if req.dups:  # a request mixing duplicates with new batches
                mine = iter(mine)
                batch_offsets = tuple(d.base_offset if d else next(mine) for d in req.dups)
                result = AppendResult(batch_offsets[0], result_time, batch_offsets)
            elif not req.replica:
                result = AppendResult(start, result_time, tuple(mine))
            if req.future.done():
                pass
            elif deposed:
                req.future.set_exception(LeadershipLost(
                    f"{self.topic}-{self.index} got a new leader (epoch {self.leader_epoch}) while "
                    f"offsets {start}..{end - 1} were written in epoch {epoch}"
                ))
            elif req.acks_all:
                if req.dups:  # a duplicate is answered once its original is replicated too
                    end = max([end] + [d.end for d in req.dups if d])
                self._acks.wait(req.future, end, result, plog.high_watermark, self._isr_short(), req.deadline)
            else:
                req.future.set_result(result)
            start = end

    def _deduplicate(self, group: list[_Append], staging: Staging, offset: int) -> list[_Append]:
        """The writer's idempotence check of a leader group (storage/producers.py), before
        anything is written: returns the requests still to answer, with ``spans`` cut down
        to their new batches and ``dups`` set where some batch is a duplicate.

        Batches are checked in order against the stored state and against the group's
        earlier batches (``staging`` records them provisionally, with the offsets they are
        about to get), so two copies of one batch in one group are caught too.  A request
        with a fenced or out-of-order batch fails whole, nothing of it written.  The
        provisional records are dropped at the end: the writer records each batch again
        once its group is written.
        """
        out = []
        accepted: list[tuple[BatchSpan, int]] = []  # new idempotent batches so far, with offsets
        for req in group:
            spans = req.spans
            if all(s.producer_id < 0 for s in spans):
                out.append(req)
                offset += sum(s.count for s in spans)
                continue
            checked: list[Duplicate | None] = []
            start, mine = offset, []
            try:
                for s in spans:
                    dup = None
                    if s.producer_id >= 0:
                        dup = staging.check(s.producer_id, s.producer_epoch, s.base_sequence, s.count)
                        if dup is None:
                            staging.record(
                                s.producer_id, s.producer_epoch, s.base_sequence, offset, offset + s.count, s.count, 0
                            )
                            mine.append((s, offset))
                    if dup is None:
                        offset += s.count
                    checked.append(dup)
            except (OutOfOrderSequence, ProducerFenced) as exc:
                offset = start
                staging.entries.clear()  # replay what stays: the refused request is gone
                for a, at in accepted:
                    staging.record(a.producer_id, a.producer_epoch, a.base_sequence, at, at + a.count, a.count, 0)
                if not req.future.done():
                    req.future.set_exception(exc)
                continue
            accepted.extend(mine)
            if any(checked):
                req.dups = checked
                req.spans = [s for s, d in zip(spans, checked, strict=True) if d is None]
            out.append(req)
        staging.entries.clear()
        return out

    def _answer_duplicates(self, group: list[_Append]) -> None:
        """Answer requests of duplicates only, in a group with nothing new to write: at
        once, or with ``acks_all`` once the high watermark passes the originals."""
        for req in group:
            offsets = tuple(d.base_offset for d in req.dups)
            result = AppendResult(offsets[0], -1, offsets)
            if req.future.done():
                continue
            if req.acks_all:
                self._acks.wait(
                    req.future, max(d.end for d in req.dups), result, self.log.high_watermark,
                    self._isr_short(), req.deadline,
                )
            else:
                req.future.set_result(result)

    def _failed(self, group: list[_Append], exc: OSError) -> None:
        """The disk refused a group before it was published (nothing of it stays in the
        log): its requests fail with the storage error, and a leader whose disk failed
        (not merely filled) hands its leadership away (``_disk_trouble``)."""
        err = storage_error_from_os(exc, f"append to {self.topic}-{self.index}")
        log.error("%s", err)
        for req in group:
            if not req.future.done():
                req.future.set_exception(err)
        if not group[0].replica:
            self._disk_trouble(err)

    def _fence(self, epoch: int, group: list[_Append], first: int, exc: OSError) -> None:
        """The fsync of a leader group published to followers before it (offsets ``first``
        on) failed: its bytes may be lost here while followers hold them.

        Cutting them now would let this leader write other batches at the same offsets in
        the same epoch, and followers that copied them would keep a divergent suffix.  So
        the partition is fenced instead: no leader write in ``epoch`` any more (``append``
        answers ``NotLeader``), the group's requests fail as maybe stored
        (``LeadershipLost``: a follower that becomes leader may have the batches), and the
        leadership goes to an in-sync follower in a new epoch (``_disk_trouble``).  Should
        this broker lead again, in a later epoch, the writer first cuts back to what was
        fsynced (``_write_group``), so the cut starts that epoch.
        """
        err = storage_error_from_os(exc, f"fsync of {self.topic}-{self.index}")
        log.error("%s; offsets from %d may be lost here: no more writes as leader in epoch %d", err, first, epoch)
        self._fenced_epoch = epoch
        lost = LeadershipLost(
            f"{self.topic}-{self.index}: {err.message}, after followers could copy offsets from {first}: "
            f"this leader gives up the partition"
        )
        for req in group:
            if not req.future.done():
                req.future.set_exception(lost)
        self._disk_trouble(err)

    def _disk_trouble(self, err: StorageError) -> None:
        """A leader's disk failed or stalls: tell the broker, which hands the leadership to
        an in-sync follower (broker/stepdown.py).  A full disk is not a failed one: it is
        reported to producers and waits for space (every replica usually fills alike).  A
        follower's trouble is reported by its replica fetcher to its leader."""
        if self.is_leader and self._on_disk_failure is not None and not isinstance(err, DiskFull):
            self._on_disk_failure(self, err)

    async def _on_disk(self, job: asyncio.Future, size: int):
        """Await a disk job of the writer (a write, an fsync) of ``size`` bytes.  One still
        running after ``DISK_STALL_S`` (plus ``size`` at ``STALL_BYTES_PER_S``: a hung or
        frozen disk) sets ``stalled`` until it returns and is reported as disk trouble
        once; it is still awaited: the event loop and the partitions on other disks go on
        meanwhile."""
        loop = asyncio.get_running_loop()
        timers: list[asyncio.TimerHandle] = []
        timers.append(loop.call_later(DISK_STALL_S + size / STALL_BYTES_PER_S, self._stall_suspected, job, timers))
        try:
            return await job
        finally:
            for timer in timers:
                timer.cancel()
            self.stalled = False

    def _stall_suspected(self, job: asyncio.Future, timers: list) -> None:
        # Checked again a moment later: after the process was paused (SIGSTOP), timers may
        # run before the completions that arrived meanwhile (libuv runs timers first).
        timers.append(asyncio.get_running_loop().call_later(STALL_RECHECK_S, self._stalled, job))

    def _stalled(self, job: asyncio.Future) -> None:
        if job.done():
            return
        self.stalled = True
        err = StorageError(f"the disk of {self.topic}-{self.index} stalls: a write or fsync has not returned")
        log.error("%s", err)
        self._disk_trouble(err)

    def _follows(self, group: list[_Append], offset: int) -> list[_Append]:
        """The follower requests of ``group`` fetched in the current epoch that continue the
        log at ``offset`` (or after a gap a compacted leader's log has there) with no lower
        epoch; the others fail with nothing written."""
        kept, epoch = [], self.log.epochs.latest_epoch
        for req in group:
            first = req.spans[0]
            if req.fetched_in is not None and req.fetched_in != self.leader_epoch:
                req.future.set_exception(FencedLeaderEpoch(
                    f"replica batches of {self.topic}-{self.index} fetched in epoch {req.fetched_in} "
                    f"are stale: the partition is in epoch {self.leader_epoch} now"
                ))
                continue
            if first.base_offset < offset or first.leader_epoch < epoch:
                req.future.set_exception(InvalidRecord(
                    f"replica batches at offset {first.base_offset} (epoch {first.leader_epoch}) "
                    f"do not follow the log end {offset} (epoch {epoch}) of {self.topic}-{self.index}"
                ))
                continue
            kept.append(req)
            offset, epoch = req.spans[-1].next_offset, req.spans[-1].leader_epoch
        return kept

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
            err = storage_error_from_os(exc, f"flush of {self.topic}-{self.index}")
            log.error("%s", err)
            self._disk_trouble(err)  # acknowledged writes may be lost on this disk: lead no more
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

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Finish queued writes, fsync, save indexes, close files."""
        self._closing = True
        self._wakeup.set()
        await self._task
        await self._stop_cleaner()
        if self._flush_future is not None:
            await asyncio.wait([self._flush_future])
        self._acks.fail_all(BrokerShuttingDown("partition closed before its replicas caught up"))
        if self._own_syncer:
            self._syncer.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._write_executor, self.log.close)
        self._notify()
        self._notify_replicas()

    async def abort(self) -> None:
        """Stop for a topic deletion: queued appends fail, the one being written completes."""
        self._closing = True
        queued, self._queue = self._queue, []
        for req in queued:
            if not req.future.done():
                req.future.set_exception(UnknownTopic(f"topic {self.topic!r} was deleted"))
        self._wakeup.set()
        await self._task
        await self._stop_cleaner()
        self._acks.fail_all(UnknownTopic(f"topic {self.topic!r} was deleted"))
        if self._own_syncer:
            self._syncer.close()
        self._notify()
        self._notify_replicas()

    def take_expired(self, now_ms: int) -> list[Segment]:
        """Segments retention removes from the log (none while a truncation or a cleaning
        runs, none with ``cleanup.policy=compact``).  A follower also lets go of what its
        leader no longer has, so replicas' log starts do not drift apart.  Idempotent
        producers idle past ``producer.id.expiration.ms`` are forgotten here too."""
        if not self._truncating:
            self.log.producers.expire(now_ms, self.config.producer_id_expiration_ms)
        if self._truncating or self._cleaning is not None or self.config.cleanup_policy == "compact":
            return []
        halves = self.log.producers.open_halves
        keep = min(halves, default=-1)  # open half messages (delayed ones too) stay
        return self.log.expired_segments(now_ms, -1 if self.is_leader else self.leader_log_start, keep)


def _runs(taken: list) -> list:
    """Split the writer's queue into groups of appends of one kind (leader's or replica's),
    with each truncation on its own between them, in queue order."""
    runs: list = []
    for item in taken:
        if isinstance(item, _Truncate):
            runs.append(item)
        elif runs and isinstance(runs[-1], list) and runs[-1][0].replica == item.replica:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
