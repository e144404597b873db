"""The follower side of replication: this broker pulls the partitions it follows from
their leaders.

``Followers`` keeps one ``ReplicaFetcher`` per leader broker: the partition states
(states.py) add a partition to its leader's fetcher, and take it away.

One ``ReplicaFetcher`` per leader broker, one connection, one long-poll replica fetch in
flight carrying every partition followed there.  For each partition, in each leader epoch:

1. **Truncate** (Kafka's OffsetsForLeaderEpoch): ask the leader where this log's latest
   epoch ends in the leader's log, and cut this log's tail beyond it (a tail written by a
   deposed leader that never reached the high watermark).  A log with no epochs has
   nothing to cut.
2. **Fetch** from the log end, saying the epoch of the last batch this log holds: the
   leader checks that this log's last epoch ends there in its own log too (KIP-320; else
   it answers ``diverging`` with where that epoch ends, and this replica cuts its log
   there: step 1 again, without the round trip), records the offset as this replica's
   log end (everything below it is copied), answers with batches up to its own log end, and its
   high watermark, which this replica takes (never above its own log end).  Batches are
   appended with the leader's offsets and epochs (``Partition.append_as_follower``),
   tagged with the epoch they were fetched in: the writer drops them if the partition
   moved to another epoch meanwhile (its truncation decision may be made already).

A partition whose appends fail on this broker's disk reports the error in the very next
fetch (``storage_error``; the data that answer brings is not written), so the leader drops
it from the ISR at once instead of waiting for the lag timeout (seed ``000``); the write is
retried every ``STORAGE_RETRY_S``, each retry's fetch reporting the error again until a
write works.  A write that hangs (a frozen disk) is reported the same way once its
partition finds it stalled (broker/disk_health.py, ``DISK_STALL_S``); the partition is
fetched again once it returns.  Fenced or
stale requests wait for the next partition state, which moves the partition to another
fetcher or makes it a leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.client.transport import Connection
from sluice.errors import (
    BrokerError,
    BrokerShuttingDown,
    ConnectionClosed,
    FencedLeaderEpoch,
    InvalidRecord,
    NotLeader,
    OffsetOutOfRange,
    RequestTimedOut,
    SluiceError,
    StorageError,
    UnknownTopic,
    UnsupportedVersion,
    error_for_code,
)
from sluice.protocol import messages as m
from sluice.storage.epochs import UNDEFINED_EPOCH

log = logging.getLogger("sluice.replication")

FETCH_WAIT_MS = 500
FETCH_MAX_BYTES = 16 * 1024 * 1024
PARTITION_MAX_BYTES = 4 * 1024 * 1024
RETRY_S = 0.1  # after a refused or failed request
STORAGE_RETRY_S = 1.0
CONNECT_TIMEOUT_S = 2.0
STALL_POLL_S = 0.05  # how often writes in progress are checked for a stalled disk


@dataclass
class _Followed:
    part: Partition
    epoch: int  # the leader epoch this fetcher follows the partition in
    truncated: bool = False
    storage_error: str = ""
    report_due: bool = False  # a new storage error the leader has not been told of yet
    resume_at: float = 0.0  # monotonic: skip the partition until then (but for a report)
    appending: asyncio.Task | None = None  # a write that stalls (its partition is skipped till it returns)


class Followers:
    """The replica fetchers of this broker, by leader.  Event loop only.

    Collaborators: ``node_id``, this broker's (sent in replica requests); ``view``, where
    the leaders' addresses are looked up (its ``live_brokers``)."""

    def __init__(self, node_id: int, view: ClusterView) -> None:
        self.node_id = node_id
        self.view = view
        self.fetchers: dict[int, ReplicaFetcher] = {}  # leader node id -> its fetcher

    def follow(self, part: Partition, leader: int) -> None:
        """Fetch ``part`` from broker ``leader`` (in the partition's current epoch)."""
        f = self.fetchers.get(leader)
        if f is None:
            f = self.fetchers[leader] = ReplicaFetcher(self.node_id, self.view, leader)
        f.add(part)

    def following(self, part: Partition) -> int:
        """The leader ``part`` is fetched from; -1: none."""
        for leader, f in self.fetchers.items():
            if f.has(part):
                return leader
        return -1

    def unfollow(self, part: Partition) -> None:
        """Stop fetching ``part``; a fetcher left with nothing to fetch stops."""
        for leader, f in list(self.fetchers.items()):
            if f.remove(part) and f.idle:
                del self.fetchers[leader]
                f.stop()

    async def close(self) -> None:
        """Stop every fetcher and wait for them."""
        for f in self.fetchers.values():
            f.stop()
        await asyncio.gather(*(f.wait_stopped() for f in self.fetchers.values()))
        self.fetchers.clear()


class ReplicaFetcher:
    """Pulls the partitions this broker follows from one leader (module docstring)."""

    def __init__(self, node_id: int, view: ClusterView, leader: int) -> None:
        self.node_id = node_id
        self.view = view
        self.leader = leader
        self._parts: dict[tuple[str, int], _Followed] = {}
        self._changed = asyncio.Event()
        self._conn: Connection | None = None
        self._failing = False  # the last attempt failed (logged once per streak)
        self._v1 = False  # the leader knows replica fetches of version 1 only
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"replica fetcher {leader}")

    # ------------------------------------------------------------------ membership

    def add(self, part: Partition) -> None:
        self._parts[(part.topic, part.index)] = _Followed(part, part.leader_epoch)
        self._changed.set()

    def remove(self, part: Partition) -> bool:
        if self._parts.pop((part.topic, part.index), None) is None:
            return False
        self._changed.set()
        return True

    def has(self, part: Partition) -> bool:
        f = self._parts.get((part.topic, part.index))
        return f is not None and f.part is part

    @property
    def idle(self) -> bool:
        return not self._parts

    def stop(self) -> None:
        self._task.cancel()
        if self._conn is not None:
            self._conn.close()

    async def wait_stopped(self) -> None:
        await asyncio.gather(self._task, return_exceptions=True)

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while True:
            try:
                conn = await self._connection()
                if conn is None:
                    await asyncio.sleep(RETRY_S)
                    continue
                await self._truncate(conn)
                await self._fetch(conn)
                self._failing = False
            except asyncio.CancelledError:
                raise
            except (ConnectionClosed, RequestTimedOut, BrokerShuttingDown) as exc:
                if not self._failing:
                    log.info("replica fetch from broker %d: %s; reconnecting", self.leader, exc)
                self._failing = True
                self._drop_connection()
                await asyncio.sleep(RETRY_S)
            except Exception:
                log.exception("replica fetcher of broker %d failed; retrying", self.leader)
                self._drop_connection()
                await asyncio.sleep(RETRY_S * 5)

    async def _connection(self) -> Connection | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        reg = self.view.live_brokers.get(self.leader)
        if reg is None:
            return None  # not alive (yet): a new state will move the partitions
        self._conn = await Connection.open(reg.host, reg.port, connect_timeout=CONNECT_TIMEOUT_S)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _ready(self) -> list[_Followed]:
        now = time.monotonic()
        return [f for f in self._parts.values() if f.resume_at <= now and f.appending is None]

    def _current(self, f: _Followed) -> bool:
        """Whether ``f`` is still followed here in the same epoch (states move on)."""
        return self._parts.get((f.part.topic, f.part.index)) is f and f.part.leader_epoch == f.epoch

    async def _truncate(self, conn: Connection) -> None:
        """Cut each new partition's divergent tail, asking the leader where epochs end."""
        todo = [f for f in self._ready() if not f.truncated]
        if not todo:
            return
        queries = []
        for f in todo:
            latest = f.part.log.epochs.latest_epoch
            if latest == UNDEFINED_EPOCH:
                f.truncated = True  # nothing of any epoch: nothing to cut
                continue
            queries.append((f, m.EpochQuery(
                topic=f.part.topic, partition=f.part.index, current_leader_epoch=f.epoch, leader_epoch=latest,
            )))
        if not queries:
            return
        resp, _ = await conn.request(
            m.OffsetsForLeaderEpochRequest(replica_id=self.node_id, partitions=[q for _, q in queries]),
            timeout=10.0,
        )
        for (f, _), r in zip(queries, resp.partitions, strict=True):
            if not self._current(f):
                continue
            if r.error:
                self._refused(f, error_for_code(r.error, r.message))
                continue
            if await self._cut(f, r.leader_epoch, r.end_offset):
                f.truncated = True

    async def _cut(self, f: _Followed, epoch: int, end_offset: int) -> bool:
        """Cut ``f``'s log where it stops being the leader's: the leader has ``epoch`` (the
        largest at or below ours that it knows) up to ``end_offset``.  False when the disk
        refused (reported in the next fetch)."""
        part = f.part
        leo = part.log_end_offset
        cut = cut_point(part, epoch, end_offset)
        if cut < leo:
            log.warning(
                "%s-%d: truncating %d..%d (leader %d has epoch %d up to %d)",
                part.topic, part.index, cut, leo, self.leader, epoch, end_offset,
            )
            try:
                await part.truncate_to(cut)
            except StorageError as exc:
                self._storage_failed(f, exc)
                return False
        return True

    async def _fetch(self, conn: Connection) -> None:
        ready = [f for f in self._ready() if f.truncated]
        taken = {id(f) for f in ready}
        reports = [f for f in self._parts.values() if f.report_due and id(f) not in taken]
        if not ready and not reports:
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait([waiter], timeout=RETRY_S)
            finally:
                waiter.cancel()
            self._changed.clear()
            return
        self._changed.clear()
        if self._v1:  # a leader of an older version
            partitions = [
                m.ReplicaFetchPartition(
                    topic=f.part.topic, partition=f.part.index, leader_epoch=f.epoch,
                    offset=f.part.log_end_offset, max_bytes=PARTITION_MAX_BYTES, storage_error=f.storage_error,
                )
                for f in (*ready, *reports)
            ]
            req = m.ReplicaFetchRequest(
                replica_id=self.node_id, partitions=partitions,
                max_wait_ms=FETCH_WAIT_MS, min_bytes=1, max_bytes=FETCH_MAX_BYTES,
            )
        else:
            req = m.ReplicaFetchRequestV2(
                replica_id=self.node_id,
                partitions=[
                    m.ReplicaFetchPartitionV2(
                        topic=f.part.topic, partition=f.part.index, leader_epoch=f.epoch,
                        offset=f.part.log_end_offset, max_bytes=PARTITION_MAX_BYTES,
                        storage_error=f.storage_error, last_fetched_epoch=f.part.log.epochs.latest_epoch,
                    )
                    for f in (*ready, *reports)
                ],
                max_wait_ms=FETCH_WAIT_MS, min_bytes=1, max_bytes=FETCH_MAX_BYTES,
            )
        fetch = asyncio.ensure_future(conn.request(req, timeout=FETCH_WAIT_MS / 1000 + 10))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait([fetch, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            answered = fetch.done()
            if not answered:  # a partition joined or left (ask again with the new set), or stopped
                fetch.cancel()
                fetch.add_done_callback(_retrieve)
        if not answered:
            return
        try:
            resp, data = fetch.result()
        except UnsupportedVersion:
            if self._v1:
                raise
            log.info("broker %d answers replica fetches of version 1 only", self.leader)
            self._v1 = True
            return
        pos = 0
        appends = []
        for f, r in zip((*ready, *reports), resp.partitions, strict=True):
            chunk = data[pos : pos + r.size]
            pos += r.size
            report_only = f.report_due and id(f) not in taken
            f.report_due = False
            if report_only or not self._current(f):
                continue
            if r.error == OffsetOutOfRange.code and f.part.log_end_offset < r.log_start_offset:
                appends.append((f, self._restart_at(f, r.log_start_offset)))
                continue
            if r.error:
                self._refused(f, error_for_code(r.error, r.message))
                continue
            if getattr(r, "diverging", False):
                appends.append((f, self._diverged(f, r)))
                continue
            appends.append((f, self._append(f, chunk, r)))
        if appends:
            await self._appended(appends)

    async def _appended(self, appends: list) -> None:
        """Wait for this fetch's writes, (followed, coroutine) each.  A write whose
        partition finds it stalled (a hung or frozen disk: ``Partition.stalled``) is
        reported to the leader as a storage error in the very next fetch, as a failed write
        is, so the leader drops this replica from the ISR at once; the write is left to
        finish, and its partition is not fetched until it has.  The partitions whose writes
        returned go on."""
        tasks = {asyncio.ensure_future(coro): f for f, coro in appends}
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=STALL_POLL_S)
            for task in [t for t in pending if tasks[t].part.stalled]:
                pending.discard(task)
                f = tasks[task]
                f.appending = task
                self._storage_failed(f, StorageError(
                    f"the disk of {f.part.topic}-{f.part.index} stalls: a replica write has not returned"
                ))
                task.add_done_callback(lambda _, f=f: self._stall_ended(f))

    def _stall_ended(self, f: _Followed) -> None:
        f.appending = None
        if not f.storage_error:  # the write went through after all: fetch again at once
            f.resume_at = 0.0
        self._changed.set()

    async def _diverged(self, f: _Followed, r: m.ReplicaFetchResultV2) -> None:
        """The leader found that this log's last epoch does not end where the leader's
        log has it (KIP-320): cut it there, then fetch again."""
        part = f.part
        log.warning(
            "%s-%d: the log diverges from leader %d's (last epoch %d, log end %d)",
            part.topic, part.index, self.leader, part.log.epochs.latest_epoch, part.log_end_offset,
        )
        before = part.log_end_offset
        if await self._cut(f, r.diverging_epoch, r.diverging_end_offset) and part.log_end_offset >= before:
            f.resume_at = time.monotonic() + RETRY_S * 3  # nothing to cut here: do not spin

    async def _append(self, f: _Followed, chunk: memoryview, r: m.ReplicaFetchResult) -> None:
        part = f.part
        if len(chunk):
            try:
                await part.append_as_follower(chunk, f.epoch)
            except StorageError as exc:
                self._storage_failed(f, exc)
                return
            except InvalidRecord as exc:  # does not continue our log: find out where we diverge
                log.warning("%s-%d: %s; truncating again", part.topic, part.index, exc)
                f.truncated = False
                return
            except (NotLeader, UnknownTopic, BrokerError) as exc:
                self._refused(f, exc)
                return
            if f.storage_error:
                log.info("%s-%d: replica writes work again", part.topic, part.index)
                f.storage_error = ""
        if self._current(f):
            part.advance_high_watermark(min(r.high_watermark, part.log_end_offset))
            part.leader_log_start = r.log_start_offset

    async def _restart_at(self, f: _Followed, offset: int) -> None:
        """The leader no longer has the offsets this replica needs (retention deleted
        them): start this replica's log anew at the leader's log start."""
        part = f.part
        log.warning(
            "%s-%d: log end %d is below the log start %d of leader %d; starting the replica over there",
            part.topic, part.index, part.log_end_offset, offset, self.leader,
        )
        try:
            await part.reset_to(offset)
        except StorageError as exc:
            f.storage_error = exc.message
            f.resume_at = time.monotonic() + STORAGE_RETRY_S

    def _storage_failed(self, f: _Followed, exc: StorageError) -> None:
        """A write of ``f`` failed on this broker's disk: tell the leader in the next fetch,
        retry the write after ``STORAGE_RETRY_S``."""
        if not f.storage_error:
            log.error("%s-%d: cannot write replica data: %s", f.part.topic, f.part.index, exc)
            f.report_due = True
        f.storage_error = exc.message
        f.resume_at = time.monotonic() + STORAGE_RETRY_S

    def _refused(self, f: _Followed, exc: SluiceError) -> None:
        """The leader refused the partition: wait for a new state, truncate again, or
        retry shortly, by what it said."""
        if isinstance(exc, OffsetOutOfRange):
            f.truncated = False
        elif isinstance(exc, NotLeader | FencedLeaderEpoch):
            log.info("%s-%d: broker %d: %s", f.part.topic, f.part.index, self.leader, exc)
        f.resume_at = time.monotonic() + RETRY_S * 3


def cut_point(part: Partition, epoch: int, end_offset: int) -> int:
    """Where a follower's log stops being its leader's, the leader having ``epoch`` (the
    largest at or below the follower's latest that it knows) up to ``end_offset``: never
    above the log end, and never above a tail this broker published as leader but could not
    fsync (``Partition.unsynced_from``): its bytes may be gone from this disk even where the
    new leader holds the same batches, so they are fetched again."""
    leo = part.log_end_offset
    if epoch == UNDEFINED_EPOCH:
        cut = min(part.high_watermark, leo)  # the leader knows none of our epochs
    else:
        _, own_end = part.log.epochs.end_offset_for_epoch(epoch, leo)
        cut = min(end_offset, own_end if own_end >= 0 else end_offset, leo)
    unsynced = part.unsynced_from
    return cut if unsynced is None else min(cut, unsynced)


def _retrieve(fut: asyncio.Future) -> None:
    """Mark an abandoned request's outcome as seen (it failed or was cancelled: no matter)."""
    if not fut.cancelled():
        fut.exception()
