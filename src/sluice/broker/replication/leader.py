"""The leader side of replication: the ISR kept, and the replica APIs served to followers.

- **The ISR** is changed by the partition's leader, always by compare-and-swap on the
  state's version: a follower that has not caught up for ``replica_lag_time_max_ms``, or
  that reports a storage error, leaves; one that caught up (at the high watermark and the
  current epoch's start) and that the topic record still lists rejoins (counted in the high
  watermark from the moment the bigger ISR is sent to the store: maximal ISR).  A failed
  swap means someone else (the controller) changed the state: it is read again and
  applied (states.py), so a deposed leader learns it was deposed.  With the store
  unreachable the ISR cannot change: ``acks=all`` writes then wait until their deadline,
  never longer.
- **Replica fetches** of version 2 carry the epoch of the follower's last batch, and a
  follower whose log diverges from the leader's is told where to cut and is not counted
  as having copied.
- **Fencing.**  Replica requests carry the sender's leader epoch; an older one is refused
  (``FENCED_LEADER_EPOCH``), a newer one too (``UNKNOWN_LEADER_EPOCH``: this broker has
  not seen the new state yet).
"""

from __future__ import annotations

import asyncio
import logging

from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.replication.states import PartitionStates
from sluice.broker.results import error_fields
from sluice.broker.wait import until_woken, wait_event
from sluice.cluster.store import MetadataStore, PartitionState
from sluice.errors import (
    BrokerError,
    FencedLeaderEpoch,
    MetadataUnavailable,
    NotLeader,
    OffsetOutOfRange,
    UnknownLeaderEpoch,
    UnknownTopic,
)
from sluice.protocol import messages as m

log = logging.getLogger("sluice.replication")


class LeaderSide:
    """ISR upkeep of the partitions led here; REPLICA_FETCH and OFFSETS_FOR_LEADER_EPOCH.
    Event loop only.

    Collaborators: ``node_id``, this broker's; ``lag_time_max_ms``, how long a follower
    may lag before it leaves the ISR; ``store``, the metadata store the ISR is swapped
    in; ``registry``, the partitions held here; ``view``, the live brokers (only live ones
    join an ISR); ``states``, which applies a state read again after a failed swap;
    ``isr_check``, set to run the upkeep at once; ``topics_stale``, set when a joiner is
    no longer listed (the topic records are read again: reassignment.py)."""

    def __init__(
        self, node_id: int, lag_time_max_ms: int, store: MetadataStore, registry: TopicRegistry,
        view: ClusterView, states: PartitionStates, isr_check: asyncio.Event, topics_stale: asyncio.Event,
    ) -> None:
        self.node_id = node_id
        self.lag_time_max_ms = lag_time_max_ms
        self.metadata = store
        self.registry = registry
        self.view = view
        self.states = states
        self.isr_check = isr_check
        self.topics_stale = topics_stale

    async def isr_loop(self) -> None:
        """Leader side: shrink and grow the ISR of the partitions led here."""
        lag_s = self.lag_time_max_ms / 1000
        while True:
            await wait_event(self.isr_check, min(lag_s / 4, 1.0))
            self.isr_check.clear()
            for topic in list(self.registry.topics.values()):
                for part in list(topic.partitions.values()):
                    if part.is_leader:
                        try:
                            await self._maintain_isr(topic, part, lag_s)
                        except MetadataUnavailable as exc:
                            log.warning("cannot change the ISR of %s-%d: %s", part.topic, part.index, exc)
                        except UnknownTopic:
                            pass  # deleted meanwhile
                        except Exception:
                            log.exception("ISR upkeep of %s-%d failed", part.topic, part.index)

    async def _maintain_isr(self, topic: Topic, part: Partition, lag_s: float) -> None:
        out = set(part.lagging(lag_s)) | (part.failed_followers & set(part.isr))
        out.discard(self.node_id)
        # only live brokers join: the controller takes a broker whose session ended out of
        # every ISR, and a leader must not put it back on fetches from before that
        join = [r for r in part.caught_up(lag_s) if r not in part.failed_followers and r in self.view.live_brokers]
        if not out and not join:
            return
        expected = part.state_version
        if expected is None:
            return  # our last change is not back from the watch yet: its version is unknown
        if join:
            # Admit only replicas the store still lists: one just moved away (a completed
            # move, cluster/controller.py) may still be known here as a caught-up follower
            # until the changed record is applied.  The record is read after the version
            # was: a reassignment since then changed the version too, and the swap fails.
            record = (await self.metadata.topics()).get(part.topic)
            if record is None:
                return
            listed = record.assignment[part.index] if part.index < record.partitions else []
            if any(r not in listed for r in join):
                self.topics_stale.set()
                join = [r for r in join if r in listed]
                if not out and not join:
                    return
        old = list(part.isr)
        isr = [r for r in old if r not in out] + join
        state = PartitionState(self.node_id, part.leader_epoch, isr)
        if join:
            # The swap may take effect and its answer be lost: the joiners count in the high
            # watermark from now until a state of the store is applied (maximal ISR).  A
            # shrink is applied only once written, so the old, bigger ISR counts meanwhile.
            part.expanding(isr)
        if await self.metadata.cas_partition_state(part.topic, part.index, expected, state):
            if out:
                log.warning("%s-%d: ISR shrank from %s to %s", part.topic, part.index, old, isr)
            if join:
                log.info("%s-%d: ISR grew from %s to %s", part.topic, part.index, old, isr)
            # The watch brings the new version, maybe already while the swap was answered:
            # only a version still the old one is stale (forgetting a newer one would stop
            # every later ISR change of this partition until the next state change).
            if part.state_version == expected:
                part.set_isr(isr)
                part.state_version = None
            return
        states = await self.metadata.partition_states(part.topic)  # someone else changed it
        if part.index < len(states) and self.registry.topics.get(part.topic) is topic:
            self.states.become(topic, part.index, states[part.index])

    # ------------------------------------------------------------------ replica APIs

    def _led(self, topic: str, index: int, epoch: int) -> Partition:
        """The partition, if led here in ``epoch``; else the error telling the sender why."""
        part = self.registry.partition(topic, index)
        if not part.is_leader:
            raise NotLeader(f"this broker does not lead {topic}-{index}")
        if epoch < part.leader_epoch:
            raise FencedLeaderEpoch(
                f"{topic}-{index} is in leader epoch {part.leader_epoch}, the request in {epoch}"
            )
        if epoch > part.leader_epoch:
            raise UnknownLeaderEpoch(
                f"{topic}-{index} is in leader epoch {part.leader_epoch} here, the request in {epoch}"
            )
        return part

    async def replica_fetch(self, req: m.ReplicaFetchRequest, _att, _peer: Peer):
        """A follower's long poll: record where it is, then answer with what follows, up to
        the log end, once ``min_bytes`` are there or ``max_wait_ms`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(req.max_wait_ms, 0) / 1000
        v2 = isinstance(req, m.ReplicaFetchRequestV2)
        result_type = m.ReplicaFetchResultV2 if v2 else m.ReplicaFetchResult
        first = True
        while True:
            results, blobs, size, parts = [], [], 0, []
            for rp in req.partitions:
                part = None
                try:
                    part = self._led(rp.topic, rp.partition, rp.leader_epoch)
                    diverging = _diverging(part, rp) if v2 else None
                    if diverging is not None:
                        epoch, end = diverging
                        results.append(result_type(
                            topic=rp.topic, partition=rp.partition, high_watermark=part.high_watermark,
                            log_start_offset=part.log_start_offset, log_end_offset=part.log_end_offset,
                            diverging=True, diverging_epoch=epoch, diverging_end_offset=end,
                        ))
                        continue
                    if first:
                        self._follower_reported(part, req.replica_id, rp)
                    parts.append(part)
                    res = await part.fetch(  # replicas read up to the log end
                        rp.offset, max(min(rp.max_bytes, req.max_bytes - size), 1), part.log_end_offset
                    )
                except BrokerError as exc:
                    results.append(result_type(
                        topic=rp.topic, partition=rp.partition, **error_fields(exc),
                        # out of range: where the follower can start again
                        log_start_offset=part.log_start_offset if part is not None else -1,
                    ))
                    continue
                results.append(result_type(
                    topic=rp.topic, partition=rp.partition, high_watermark=part.high_watermark,
                    log_start_offset=part.log_start_offset, log_end_offset=part.log_end_offset,
                    size=len(res.data),
                ))
                if res.data:
                    blobs.append(res.data)
                    size += len(res.data)
            first = False
            remaining = deadline - loop.time()
            failed = any(r.error or getattr(r, "diverging", False) for r in results)
            # (not answered at once while the broker stops: the server closes followers'
            # connections once the clients' writes are done, server/app.py)
            if size >= req.min_bytes or remaining <= 0 or failed or not parts:
                if v2:
                    return m.ReplicaFetchResponseV2(partitions=results), blobs
                return m.ReplicaFetchResponse(partitions=results), blobs
            await until_woken(
                [p.add_replica_waiter for p in parts], [p.remove_replica_waiter for p in parts], remaining
            )

    def _follower_reported(self, part: Partition, replica: int, rp: m.ReplicaFetchPartition) -> None:
        if rp.offset > part.log_end_offset:
            raise OffsetOutOfRange(
                f"replica {replica} is at {rp.offset}, past the log end {part.log_end_offset} of "
                f"{part.topic}-{part.index}: it must truncate first"
            )
        if rp.storage_error:
            if replica not in part.failed_followers:
                log.warning(
                    "%s-%d: replica %d cannot write (%s); it leaves the ISR",
                    part.topic, part.index, replica, rp.storage_error,
                )
            part.failed_followers.add(replica)
            self.isr_check.set()
        else:
            part.failed_followers.discard(replica)
            part.follower_fetched(replica, rp.offset)
            if replica not in part.isr:
                self.isr_check.set()

    async def offsets_for_leader_epoch(self, req: m.OffsetsForLeaderEpochRequest, _att, _peer: Peer):
        """Where each asked epoch ends in this leader's log (a follower truncates there)."""
        out = []
        for q in req.partitions:
            try:
                part = self._led(q.topic, q.partition, q.current_leader_epoch)
                epoch, end = part.end_offset_for_epoch(q.leader_epoch)
                out.append(m.EpochEndOffset(topic=q.topic, partition=q.partition, leader_epoch=epoch, end_offset=end))
            except BrokerError as exc:
                out.append(m.EpochEndOffset(topic=q.topic, partition=q.partition, **error_fields(exc)))
        return m.OffsetsForLeaderEpochResponse(partitions=out), ()


def _diverging(part: Partition, rp: m.ReplicaFetchPartitionV2) -> tuple[int, int] | None:
    """KIP-320's check of a follower's fetch: None when the follower's log, whose last
    batch is of ``rp.last_fetched_epoch``, can be the leader's up to ``rp.offset`` (the
    leader has that epoch, and it does not end below the offset); else the leader's
    (largest epoch at or below it, where that epoch ends) for the follower to cut at.  A
    follower whose log diverges must not be counted as having copied it."""
    last = rp.last_fetched_epoch
    if last < 0:
        return None
    epoch, end = part.end_offset_for_epoch(last)
    if epoch == last and end >= rp.offset:
        return None
    return epoch, end
