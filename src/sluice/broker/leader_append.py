"""The leader's append path: producers' batches admitted, deduplicated, given their offsets
and written.

``append`` admits a request or refuses it at once (seed ``000``: answer at once, never pile
up): ``acks=all`` is refused (``NOT_ENOUGH_REPLICAS``) when the ISR is smaller than
``min.insync.replicas`` or an in-sync follower is more than ``replica.lag.max.bytes``
behind; a write past the writer's queue bound or the purgatory's is refused
(``BROKER_BUSY``).  The writer (broker/writer.py) hands this path each run of queued leader
requests (``write``): the idempotence check of every producer batch (storage/producers.py),
offsets and the leader epoch assigned (per-batch header patching, no per-record work), the
transactional markers recorded, one disk write for the run (``Writer.write``), then the
answers.  Appended is not acknowledged: an ``acks=all`` write waits in the partition's
purgatory (broker/purgatory.py) until the high watermark passes it, and an ISR that shrank
below the minimum meanwhile answers ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (maybe stored),
never success.  With ``flush.messages=1`` and followers, a run is published to them before
its fsync, so that they copy it while the fsync runs; a failed fsync then fences the
partition (broker/disk_health.py).

Event loop only.
"""

from __future__ import annotations

import asyncio
import time

from sluice.broker.disk_health import DiskHealth
from sluice.broker.leadership import Leadership
from sluice.broker.reading import Reads
from sluice.broker.writer import Append, AppendResult, Truncate, Writer
from sluice.config import TopicConfig
from sluice.errors import (
    BrokerBusy,
    BrokerShuttingDown,
    LeadershipLost,
    NotEnoughReplicas,
    NotLeader,
    OutOfOrderSequence,
    ProducerFenced,
)
from sluice.protocol.records import BatchSpan, assign_offsets
from sluice.protocol.transactions import TXN_BITS
from sluice.storage.log import PartitionLog
from sluice.storage.producers import Duplicate, Staging
from sluice.storage.tail import Tail


class LeaderAppends:
    """Producers' appends to a partition led here.

    ``log``: the partition's log; ``config``: the topic's config (``min.insync.replicas``,
    ``replica.lag.max.bytes``, the purgatory's bounds, ``message.timestamp.type``, the flush
    policy; replaced on a reconfiguration); ``leadership``: role, epoch, ISR and purgatory;
    ``disk``: the fence after a failed fsync; ``writer``: the queue and the disk write;
    ``reads``: replica fetches woken when a run is published before its fsync; ``tail``:
    the newest leader writes, for tailing readers; ``name``: ``topic-index``.
    """

    def __init__(
        self, log: PartitionLog, config: TopicConfig, leadership: Leadership, disk: DiskHealth, writer: Writer,
        reads: Reads, tail: Tail, name: str,
    ) -> None:
        self.log = log
        self.config = config
        self._leadership = leadership
        self._disk = disk
        self._writer = writer
        self._reads = reads
        self._tail = tail
        self._name = name

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
        cfg, lead, writer = self.config, self._leadership, self._writer
        size = len(data)
        if writer.closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
        elif not lead.is_leader:
            fut.set_exception(NotLeader(f"this broker does not lead {self._name}"))
        elif self._disk.refuses_leader_writes():
            fut.set_exception(NotLeader(f"this broker gives up {self._name}: an fsync failed on its disk"))
        elif acks_all and len(lead.isr) < cfg.min_insync_replicas:
            fut.set_exception(NotEnoughReplicas(
                f"{self._name} has {len(lead.isr)} in-sync replica(s), "
                f"min.insync.replicas is {cfg.min_insync_replicas}"
            ))
        elif acks_all and (lag := lead.max_isr_lag_bytes()) > cfg.replica_lag_max_bytes >= 0:
            fut.set_exception(NotEnoughReplicas(
                f"an in-sync replica of {self._name} is {lag} bytes behind "
                f"(replica.lag.max.bytes={cfg.replica_lag_max_bytes}); retry"
            ))
        elif not writer.admit(size):
            fut.set_exception(BrokerBusy(
                f"{self._name} has {writer.queued_bytes} bytes queued for its writer "
                f"(write.queue.max.bytes={cfg.write_queue_max_bytes}); retry"
            ))
        elif acks_all and not lead.acks.admit(
            fut, size, cfg.replica_wait_max_requests, cfg.replica_wait_max_bytes
        ):
            acks = lead.acks
            fut.set_exception(BrokerBusy(
                f"{self._name} has {acks.requests} acks=all writes "
                f"({acks.bytes} bytes) waiting for replicas (replica.wait.max.requests="
                f"{cfg.replica_wait_max_requests}, replica.wait.max.bytes={cfg.replica_wait_max_bytes}); retry"
            ))
        else:
            writer.enqueue(Append(data, spans, fut, size, acks_all, deadline=deadline))
        return fut

    async def write(self, group: list[Append]) -> None:
        """Writer: write a run of leader requests, in queue order, and answer them."""
        plog, cfg, lead, writer = self.log, self.config, self._leadership, self._writer
        first = offset = plog.log_end_offset
        if not lead.is_leader or self._disk.refuses_leader_writes():
            # queued before make_follower or the fence: not ours to write any more
            err = NotLeader(f"{self._name} has a new leader")
            for req in group:
                if not req.future.done():
                    req.future.set_exception(err)
            return
        if self._disk.fenced_epoch is not None:
            if not await self._cut_unsynced(group):
                return
            first = offset = plog.log_end_offset
        epoch = lead.leader_epoch  # stamped on the batches of the run
        now_ms = int(time.time() * 1000)
        append_time = now_ms if cfg.timestamp_type == "LogAppendTime" else None
        staging = plog.producers.begin()
        group = self._deduplicate(group, staging, offset)
        if not any(req.spans for req in group):  # duplicates of earlier groups only
            self._answer_duplicates(group)
            return
        total = sum(s.size for req in group for s in req.spans) if any(r.dups for r in group) else sum(
            req.size for req in group
        )
        count = sum(s.count for req in group for s in req.spans)
        buffers, metas, ends = [], [], []
        offsets: list[list[int]] = []
        for req in group:
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
            assign_offsets(req.data, req.spans, base, epoch, append_time)
            if req.dups:
                buffers.extend(memoryview(req.data)[s.pos : s.pos + s.size] for s in req.spans)
            else:
                buffers.append(req.data)
            offsets.append(mine)
            ends.append(offset)
        sync = cfg.flush_messages == 1  # "always": the fsync is part of the acknowledgement
        # A leader with followers publishes the group before its fsync, so that they copy
        # it while the fsync runs: the high watermark still waits for the fsync
        # (``synced_end``), so no acknowledgement and no consumer sees unsynced bytes.
        early = sync and lead.is_leader and len(lead.isr) > 1
        try:
            segment = await writer.write(first, buffers, total, count, now_ms, sync and not early)
        except OSError as exc:
            self._disk.refused(group, exc, leader=True)
            return
        self._tail.add(segment.base_offset, metas, buffers)
        plog.appended(segment, metas, offset, [(epoch, first)])
        staging.commit(offset)  # only now: the producer state never runs ahead of the log
        if early:
            self._reads.notify_replicas()
            try:
                await writer.fsync(segment, total)
            except OSError as exc:
                self._disk.fence(epoch, group, first, exc)
                return
        writer.written(first, offset, total, sync)
        self._answer(group, first, ends, offsets, epoch, append_time)

    def _answer(
        self, group: list[Append], first: int, ends: list[int], offsets: list[list[int]], epoch: int,
        append_time: int | None,
    ) -> None:
        """Answer a written run: at once, or with ``acks_all`` once the high watermark
        passes each request's batches (and the originals of its duplicates)."""
        lead = self._leadership
        result_time = append_time if append_time is not None else -1
        # make_follower may have run while the write was in the thread: its purgatory was
        # emptied then, and a wait entered now would be completed by the high watermark a
        # follower takes from the new leader, over a tail that is truncated away
        deposed = not lead.is_leader or lead.leader_epoch != epoch
        start = first
        for req, end, mine in zip(group, ends, offsets, strict=True):
            if req.dups:  # a request mixing duplicates with new batches
                mine = iter(mine)
                batch_offsets = tuple(d.base_offset if d else next(mine) for d in req.dups)
                result = AppendResult(batch_offsets[0], result_time, batch_offsets)
            else:
                result = AppendResult(start, result_time, tuple(mine))
            if req.future.done():
                pass
            elif deposed:
                req.future.set_exception(LeadershipLost(
                    f"{self._name} got a new leader (epoch {lead.leader_epoch}) while "
                    f"offsets {start}..{end - 1} were written in epoch {epoch}"
                ))
            elif req.acks_all:
                if req.dups:  # a duplicate is answered once its original is replicated too
                    end = max([end] + [d.end for d in req.dups if d])
                lead.acks.wait(req.future, end, result, self.log.high_watermark, lead.isr_short(), req.deadline)
            else:
                req.future.set_result(result)
            start = end

    async def _cut_unsynced(self, group: list[Append]) -> bool:
        """Leading again in a later epoch after a fence: cut what was published but never
        fsynced (``DiskHealth.fence``) before anything is written in this epoch.  False
        (the run's requests failed with the storage error) when the disk refuses the cut."""
        plog, lead = self.log, self._leadership
        cut = Truncate(min(lead.synced_end, plog.log_end_offset), asyncio.get_running_loop().create_future())
        await self._writer.truncate(cut)
        if cut.future.exception() is not None:
            for req in group:
                if not req.future.done():
                    req.future.set_exception(cut.future.exception())
            self._disk.trouble(cut.future.exception())  # hand over once an heir can lead
            return False
        self._disk.fenced_epoch = None
        # A follower's offset heard before the cut (it copied the tail: the epoch stamped
        # at make_leader ended there) is not its copy of this log any more: it holds other
        # records where this group goes.  It counts again from its next fetch, which the
        # leader checks against the epochs as cut (KIP-320).
        end = plog.log_end_offset
        for f in lead.followers.values():
            f.log_end = min(f.log_end, end)
        return True

    def _deduplicate(self, group: list[Append], staging: Staging, offset: int) -> list[Append]:
        """The writer's idempotence check of a leader run (storage/producers.py), before
        anything is written: returns the requests still to answer, with ``spans`` cut down
        to their new batches and ``dups`` set where some batch is a duplicate.

        Batches are checked in order against the stored state and against the run's
        earlier batches (``staging`` records them provisionally, with the offsets they are
        about to get), so two copies of one batch in one run are caught too.  A request
        with a fenced or out-of-order batch fails whole, nothing of it written.  The
        provisional records are dropped at the end: the run's batches are recorded again
        once written.
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

    def _answer_duplicates(self, group: list[Append]) -> None:
        """Answer requests of duplicates only, in a run with nothing new to write: at
        once, or with ``acks_all`` once the high watermark passes the originals."""
        lead = self._leadership
        for req in group:
            offsets = tuple(d.base_offset for d in req.dups)
            result = AppendResult(offsets[0], -1, offsets)
            if req.future.done():
                continue
            if req.acks_all:
                lead.acks.wait(
                    req.future, max(d.end for d in req.dups), result, self.log.high_watermark,
                    lead.isr_short(), req.deadline,
                )
            else:
                req.future.set_result(result)
