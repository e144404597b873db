"""The follower's append path: batches copied from the leader's log, written as they are.

``append`` validates a replica fetch's batches (header and CRC of each, offsets increasing,
epochs never decreasing; a partial last batch left out) and queues them for the writer
(broker/writer.py), which hands this path each run of queued copies (``write``): the
copies that continue the log at its end in the current epoch are written with one disk
write (``Writer.write``) with the leader's offsets, epochs and timestamps, and the producer
state and transactional markers they carry are recorded.  The high watermark does not move
here: a follower takes it from its leader (``Leadership.advance_high_watermark``).  A
divergent tail is cut by ``Writer.truncate_to`` in the writer's turn.

Event loop only.
"""

from __future__ import annotations

import asyncio
import time

from sluice.broker.disk_health import DiskHealth
from sluice.broker.leadership import Leadership
from sluice.broker.writer import Append, AppendResult, Writer
from sluice.config import TopicConfig
from sluice.errors import (
    BrokerBusy,
    BrokerShuttingDown,
    CorruptRecord,
    FencedLeaderEpoch,
    InvalidRecord,
    NotLeader,
)
from sluice.protocol.records import validate_replica_batches
from sluice.protocol.transactions import TXN_BITS
from sluice.storage.log import PartitionLog
from sluice.storage.tail import Tail


class FollowerAppends:
    """A follower's copies of its leader's batches.

    ``log``: the partition's log; ``config``: the topic's config (the flush policy;
    replaced on a reconfiguration); ``leadership``: role and epoch; ``disk``: reports a
    refused write; ``writer``: the queue and the disk write; ``tail``: cleared by a copy
    (a follower serves no consumer, and a leader's tail starts fresh); ``name``:
    ``topic-index``.
    """

    def __init__(
        self, log: PartitionLog, config: TopicConfig, leadership: Leadership, disk: DiskHealth, writer: Writer,
        tail: Tail, name: str,
    ) -> None:
        self.log = log
        self.config = config
        self._leadership = leadership
        self._disk = disk
        self._writer = writer
        self._tail = tail
        self._name = name

    def append(self, data: bytearray | memoryview, fetched_in: int | None = None) -> asyncio.Future:
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
        writer = self._writer
        if writer.closing:
            fut.set_exception(BrokerShuttingDown("partition is closing"))
            return fut
        if self._leadership.is_leader:
            fut.set_exception(NotLeader(f"{self._name} is led here: not a follower"))
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
        if not writer.admit(size):
            fut.set_exception(BrokerBusy(f"{self._name}: writer queue full; retry"))
        else:
            writer.enqueue(Append(memoryview(data)[:size], batches, fut, size, replica=True, fetched_in=fetched_in))
        return fut

    async def write(self, group: list[Append]) -> None:
        """Writer: write a run of copies, in queue order, and answer them."""
        plog, writer = self.log, self._writer
        first = offset = plog.log_end_offset
        group = self._follows(group, offset)
        if not group:
            return
        now_ms = int(time.time() * 1000)
        staging = plog.producers.begin()
        total = sum(req.size for req in group)
        count = group[-1].spans[-1].next_offset - offset
        buffers, metas, ends = [], [], []
        epochs: list[tuple[int, int]] = []
        for req in group:
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
            ends.append(offset)
        sync = self.config.flush_messages == 1
        try:
            segment = await writer.write(first, buffers, total, count, now_ms, sync)
        except OSError as exc:
            self._disk.refused(group, exc, leader=False)
            return
        self._tail.clear()  # a follower serves no consumer, and a leader tail starts fresh
        stamped = plog.epochs.latest_epoch
        if stamped > epochs[-1][0]:
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
        writer.written(first, offset, total, sync)
        start = first
        for req, end in zip(group, ends, strict=True):
            if not req.future.done():
                req.future.set_result(AppendResult(start, -1))
            start = end

    def _follows(self, group: list[Append], offset: int) -> list[Append]:
        """The requests of ``group`` fetched in the current epoch that continue the log at
        ``offset`` (or after a gap a compacted leader's log has there) with no lower epoch;
        the others fail with nothing written."""
        kept, epoch = [], self.log.epochs.latest_epoch
        leader_epoch = self._leadership.leader_epoch
        for req in group:
            first = req.spans[0]
            if req.fetched_in is not None and req.fetched_in != leader_epoch:
                req.future.set_exception(FencedLeaderEpoch(
                    f"replica batches of {self._name} fetched in epoch {req.fetched_in} "
                    f"are stale: the partition is in epoch {leader_epoch} now"
                ))
                continue
            if first.base_offset < offset or first.leader_epoch < epoch:
                req.future.set_exception(InvalidRecord(
                    f"replica batches at offset {first.base_offset} (epoch {first.leader_epoch}) "
                    f"do not follow the log end {offset} (epoch {epoch}) of {self._name}"
                ))
                continue
            kept.append(req)
            offset, epoch = req.spans[-1].next_offset, req.spans[-1].leader_epoch
        return kept
