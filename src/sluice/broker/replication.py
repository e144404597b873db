"""Replication on a broker: partition states applied, the ISR kept, replica APIs served.

``ReplicaManager`` is a part of ``Broker`` (a mixin).

- **States.**  The metadata store holds each partition's state {leader, leader epoch, ISR,
  version}.  A task follows the store's watch and applies every change under the admin
  lock (``_become``): a partition this broker holds becomes leader (``make_leader``) when
  the state names this broker, else follower of the named leader (``make_follower``, and
  the replica fetcher of that leader pulls it: broker/fetcher.py).  Topics created or
  grown elsewhere are opened, deleted ones forgotten; replicas moved between brokers are
  applied by broker/reassignment.py, woken by every change.
- **The ISR** is changed by the partition's leader, always by compare-and-swap on the
  state's version: a follower that has not caught up for ``replica_lag_time_max_ms``, or
  that reports a storage error, leaves; one that caught up (at the high watermark and the
  current epoch's start) and that the topic record still lists rejoins (counted in the high
  watermark from the moment the bigger ISR is sent to the store: maximal ISR).  A failed
  swap means someone else (the controller)
  changed the state: it is read again and applied, so a deposed leader learns it was
  deposed.  With the store unreachable the ISR cannot change: ``acks=all`` writes then
  wait until their deadline, never longer.
- **Epochs.**  Every leadership term is a new leader epoch, stamped at the log end before
  any write; a leader restarted within its session, or one that cut its own log, has the
  store start a new epoch before it writes again (``new_leader_epoch``); a replica that
  lost records in a crash leaves the ISR at start (``_check_restarted``).  Replica fetches
  of version 2 carry the epoch of the follower's last batch, and a follower whose log
  diverges from the leader's is told where to cut and is not counted as having copied.
- **Fencing.**  Replica requests carry the sender's leader epoch; an older one is refused
  (``FENCED_LEADER_EPOCH``), a newer one too (``UNKNOWN_LEADER_EPOCH``: this broker has
  not seen the new state yet).  A deposed leader cannot acknowledge: its high watermark
  needs fetches from its ISR, whose members follow the new leader, and it cannot shrink
  the ISR because the version moved on.
"""

from __future__ import annotations

import asyncio
import logging

from sluice.broker.fetcher import ReplicaFetcher
from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.registry import Topic
from sluice.broker.results import error_fields
from sluice.broker.wait import until_woken, wait_event
from sluice.cluster.controller import elect_offline, preferred_election
from sluice.cluster.store import PartitionChange, PartitionState
from sluice.errors import (
    BrokerError,
    EligibleLeadersNotAvailable,
    FencedLeaderEpoch,
    InvalidRequest,
    MetadataUnavailable,
    NotLeader,
    OffsetOutOfRange,
    UnknownLeaderEpoch,
    UnknownPartition,
    UnknownTopic,
)
from sluice.protocol import messages as m

log = logging.getLogger("sluice.replication")


class ReplicaManager:
    """States, ISR and replica APIs of ``Broker`` (see broker.py for its state)."""

    async def _withdraw_lost_replicas(self) -> None:
        """Right after registering with a new data directory (storage/identity.py), before
        opening any partition: leave the ISR and the leadership of every partition the
        cluster lists this node for, since its logs are gone.  Registration comes first: it
        refuses a node id a live broker holds, and a refused start must change nothing.  A
        state the controller changed meanwhile (it may elect this node, alive now and still
        in an ISR) is read again and withdrawn from.  The controller then elects a replica
        that has the logs (the leaderless state wakes it: cluster/controller.py), and this
        broker copies them back as a follower and rejoins the ISR.  A partition of which
        this node was the only in-sync replica has no leader afterwards: its messages were
        here alone, and only ``unclean.leader.election.enable`` accepts the loss."""
        me = self.config.node_id
        for record in (await self.metadata.topics()).values():
            held = [i for i, replicas in enumerate(record.assignment) if me in replicas]
            try:
                states = await self.metadata.partition_states(record.name) if held else []
                for i in held:
                    while not await self._withdraw_from(record.name, i, states[i]):
                        states = await self.metadata.partition_states(record.name)  # changed: again
            except (UnknownTopic, UnknownPartition):
                continue  # deleted meanwhile

    async def _withdraw_from(
        self, topic: str, index: int, st: PartitionState,
        why: str = "this broker's data directory is new, so its replica is empty",
    ) -> bool:
        """Take this node out of ``st`` (leader and ISR); False when the state changed
        meanwhile (read it again)."""
        me = self.config.node_id
        if st.leader != me and me not in st.isr:
            return True
        led = st.leader == me
        isr = [r for r in st.isr if r != me]
        if not await self.metadata.cas_partition_state(
            topic, index, st.version, PartitionState(-1 if led else st.leader, st.leader_epoch + led, isr)
        ):
            return False
        log.warning(
            "%s-%d: %s: it left the %s%s", topic, index, why, "leadership and the ISR" if led else "ISR",
            "" if isr else " (no in-sync replica is left: the partition stays offline unless "
            "unclean.leader.election.enable=true)",
        )
        return True

    # ------------------------------------------------------------------ states

    async def _follow_states(self) -> None:
        """Apply every partition-state change the store reports, in order, for as long as
        the broker runs."""
        while True:
            try:
                async for change in self.metadata.watch_partition_states():
                    async with self._admin_lock:
                        await self._apply_change(change)
                return  # the store was closed
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following partition states failed; starting over")
                await asyncio.sleep(0.5)

    async def _apply_change(self, change: PartitionChange) -> None:
        self._topics_stale.set()  # the topic's record may have changed too (broker/reassignment.py)
        self.controller.poke()  # ... with a pending replica move (cluster/controller.py)
        self.controller.state_changed(change.state)  # ... or leaving it without a leader
        topic = self.topics.get(change.topic)
        if change.state is None:
            if topic is not None and await self.store_is_ours():  # not a wiped store
                await self._forget_topic(change.topic)
            return
        if topic is None or change.partition >= topic.count:
            record = (await self.metadata.topics()).get(change.topic)
            if record is None or change.partition >= record.partitions:
                return  # deleted again meanwhile: its deletion follows
            if topic is None:
                if self._log_dir(record.name, change.partition).exists() and not await self.store_is_ours():
                    return  # data of a topic the store never told this broker of: another cluster's store
                topic = await self._open_topic(record)
            else:
                await self._grow(topic, record)
        self._become(topic, change.partition, change.state)

    async def _grow(self, topic: Topic, record) -> None:
        """Another broker added partitions to ``topic``: open those held here."""
        current = topic.count
        held = self._held(record, range(current, record.partitions))
        new = await self._open_partitions(record.name, held, topic.config)
        topic.record = record
        topic.states.extend([None] * (record.partitions - current))
        for p in new:
            topic.partitions[p.index] = p

    def _become(self, topic: Topic, index: int, state: PartitionState) -> None:
        """Apply ``state`` to partition ``index`` of ``topic``: lead it, follow its leader,
        or (not held here) just know it.  A state older than one applied already (a lower
        epoch, or the same epoch and a lower version: a read after a failed swap raced the
        watch) is ignored: it would shrink the ISR again, or depose a newer leader."""
        part = topic.partitions.get(index)
        if part is not None and (state.leader_epoch, state.version) < (part.leader_epoch, part.seen_version):
            return
        topic.states[index] = state
        if part is None:
            return
        first = part.seen_version < 0
        part.state_version = state.version
        part.seen_version = max(part.seen_version, state.version)
        replicas = topic.record.assignment[index]
        if first and state.version > 0 and len(replicas) > 1:
            self._check_restarted(part, state)
        self._fence(topic, part, state)
        if state.leader == self.config.node_id and state.leader_epoch <= part.stale_epoch:
            # a leadership from before this broker (re)started, or from before its log was
            # cut: led only in a newer epoch (``new_leader_epoch``), never in this one
            self._unfollow(part)
            if part.is_leader:
                part.make_follower(state.leader_epoch)
                self._leadership_changed(part)
            return
        if state.leader == self.config.node_id:
            if part.is_leader and part.leader_epoch == state.leader_epoch:
                part.set_replicas(replicas, state.isr)
                return
            if self._draining:  # stopping: it would be gone before serving anyone
                log.warning(
                    "not leading %s-%d in epoch %d: the broker is shutting down",
                    part.topic, part.index, state.leader_epoch,
                )
                return
            self._unfollow(part)
            part.new_epoch_needed = lambda why, part=part: self.new_leader_epoch(part, why)
            part.make_leader(state.leader_epoch, replicas, state.isr)
            self._leadership_changed(part)
            log.info(
                "leading %s-%d in epoch %d (ISR %s)", part.topic, part.index, state.leader_epoch, state.isr
            )
            return
        part.isr = tuple(state.isr)
        if not part.is_leader and part.leader_epoch == state.leader_epoch and self._following(part) == state.leader:
            return
        was_leader = part.is_leader
        part.make_follower(state.leader_epoch)
        if was_leader:
            self._leadership_changed(part)
        self._unfollow(part)
        if state.leader >= 0 and self._draining:  # stopping: a fetch would only rejoin an ISR it leaves
            log.info("not following broker %d for %s-%d: the broker is shutting down", state.leader, part.topic, part.index)
        elif state.leader >= 0:
            self._fetcher(state.leader).add(part)
            log.info("following broker %d for %s-%d in epoch %d", state.leader, part.topic, part.index, state.leader_epoch)
        else:
            log.warning("%s-%d has no leader (epoch %d)", part.topic, part.index, state.leader_epoch)

    def _check_restarted(self, part: Partition, state: PartitionState) -> None:
        """The first state this process applies to a replicated partition that the store
        knew before: a restart if this broker held the partition already (it has records,
        or checkpointed a high watermark for it).  A replica whose log lost records
        (recovery cut a torn tail, or its log ends below the high watermark it had
        checkpointed: its files were lost) leaves the ISR, and the leadership, until it has
        caught up again, when another in-sync replica has what it lost.  A leader that
        keeps its place starts a new leader epoch before it accepts any write: a leader
        restarted within its session (power loss, ``kill -9``) must not append again in the
        epoch whose tail it may have lost, or followers could keep a divergent suffix.
        (``_fence`` does both.)"""
        me = self.config.node_id
        checkpointed = self.checkpointed_hw.get((part.topic, part.index))
        lost = bool(part.log.cuts) or part.log_end_offset < (checkpointed or 0)
        if not (lost or checkpointed is not None or part.log_end_offset > 0):
            return  # new here (a topic just created elsewhere): nothing from before to fence
        if lost and me in state.isr and any(r != me for r in state.isr):
            part.withdrawing = True
            part.stale_epoch = max(part.stale_epoch, state.leader_epoch)
        elif state.leader == me:
            part.stale_epoch = max(part.stale_epoch, state.leader_epoch)
            log.warning("%s-%d: this broker restarted: a new leader epoch after %d", part.topic, part.index,
                        state.leader_epoch)

    def _fence(self, topic: Topic, part: Partition, state: PartitionState) -> None:
        """Keep ``part`` from leading, or from staying in the ISR, where it must not
        (``_check_restarted``, ``new_leader_epoch``): for each state applied that still
        names it so, one swap is started (once per state version) — leaving the ISR, or a
        new leader epoch; a state that no longer names it ends the withdrawal."""
        me = self.config.node_id
        if part.withdrawing and me not in state.isr and state.leader != me:
            part.withdrawing = False  # out of the ISR: it rejoins once caught up
        if part.fenced_version == state.version:
            return  # its swap is under way
        if part.withdrawing:
            part.fenced_version = state.version
            self._in_background(self._withdraw_until_done(topic, part, state))
        elif state.leader == me and state.leader_epoch <= part.stale_epoch:
            part.fenced_version = state.version
            self._in_background(self._bump_epoch(topic, part, state))

    async def _withdraw_until_done(self, topic: Topic, part: Partition, state: PartitionState) -> None:
        while part.state_version == state.version and self.topics.get(part.topic) is topic and not part.closing:
            try:
                why = f"this replica lost records in a crash (its log ends at {part.log_end_offset})"
                await self._withdraw_from(part.topic, part.index, state, why)
                return  # done, or the state changed: the watch brings it; it rejoins once caught up
            except MetadataUnavailable as exc:
                log.warning("%s-%d: cannot leave the ISR yet: %s", part.topic, part.index, exc)
                await asyncio.sleep(0.5)

    def new_leader_epoch(self, part: Partition, why: str) -> None:
        """Stop leading ``part`` in its current epoch now, and have the metadata store start
        a new epoch with this broker as leader and the same ISR (compare-and-swap on the
        version of the state applied); leadership resumes when that state is applied, and
        the new epoch is stamped at the log end before any write (``make_leader``).

        For every cut of a leader's own log and every restart of a leader: appending again
        in an epoch whose tail followers may have copied would let them keep a divergent
        suffix (they find where their last epoch ends on the leader, KIP-101).  ``acks=all``
        writes waiting fail with ``LeadershipLost`` (maybe stored).  If the state changed
        meanwhile (another leader elected) the swap fails and that state applies; a state
        that still names this broker in the old epoch starts the swap again.  Retried
        while the store is unreachable.  Event loop; no-op for a partition not led here in
        the state applied."""
        topic = self.topics.get(part.topic)
        state = topic.states[part.index] if topic is not None else None
        if state is None or state.leader != self.config.node_id or part.stale_epoch >= state.leader_epoch:
            return
        part.stale_epoch = state.leader_epoch
        log.warning("%s-%d: %s: a new leader epoch after %d", part.topic, part.index, why, state.leader_epoch)
        if part.is_leader:
            part.make_follower(part.leader_epoch)
            self._leadership_changed(part)
        self._fence(topic, part, state)

    async def _bump_epoch(self, topic: Topic, part: Partition, state: PartitionState) -> None:
        new = PartitionState(self.config.node_id, state.leader_epoch + 1, list(state.isr))
        while part.state_version == state.version and self.topics.get(part.topic) is topic and not part.closing:
            try:
                await self.metadata.cas_partition_state(part.topic, part.index, state.version, new)
                return  # swapped, or someone else changed the state: the watch brings it
            except (UnknownTopic, UnknownPartition):
                return
            except MetadataUnavailable as exc:
                log.warning("%s-%d: cannot start a new leader epoch yet: %s", part.topic, part.index, exc)
                await asyncio.sleep(0.5)

    def _in_background(self, coro) -> None:
        """Run a partition-state change beside the watch (cancelled by ``close``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)
        task.add_done_callback(_log_failure)

    def _fetcher(self, leader: int) -> ReplicaFetcher:
        f = self.fetchers.get(leader)
        if f is None:
            f = self.fetchers[leader] = ReplicaFetcher(self, leader)
        return f

    def _following(self, part: Partition) -> int:
        for leader, f in self.fetchers.items():
            if f.has(part):
                return leader
        return -1

    def _unfollow(self, part: Partition) -> None:
        for leader, f in list(self.fetchers.items()):
            if f.remove(part) and f.idle:
                del self.fetchers[leader]
                f.stop()

    # ------------------------------------------------------------------ the ISR

    async def _isr_loop(self) -> None:
        """Leader side: shrink and grow the ISR of the partitions led here."""
        lag_s = self.config.replica_lag_time_max_ms / 1000
        while True:
            await wait_event(self._isr_check, min(lag_s / 4, 1.0))
            self._isr_check.clear()
            for topic in list(self.topics.values()):
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
        out.discard(self.config.node_id)
        # only live brokers join: the controller takes a broker whose session ended out of
        # every ISR, and a leader must not put it back on fetches from before that
        join = [r for r in part.caught_up(lag_s) if r not in part.failed_followers and r in self.live_brokers]
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
                self._topics_stale.set()
                join = [r for r in join if r in listed]
                if not out and not join:
                    return
        old = list(part.isr)
        isr = [r for r in old if r not in out] + join
        state = PartitionState(self.config.node_id, part.leader_epoch, isr)
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
        if part.index < len(states) and self.topics.get(part.topic) is topic:
            self._become(topic, part.index, states[part.index])

    # ------------------------------------------------------------------ replica APIs

    def _led(self, topic: str, index: int, epoch: int) -> Partition:
        """The partition, if led here in ``epoch``; else the error telling the sender why."""
        part = self.partition(topic, index)
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
            self._isr_check.set()
        else:
            part.failed_followers.discard(replica)
            part.follower_fetched(replica, rp.offset)
            if replica not in part.isr:
                self._isr_check.set()

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

    async def elect_leaders(self, req: m.ElectLeadersRequest, _att, _peer: Peer):
        """With ``reassign``, first replace the replicas of brokers that are gone and
        record moves onto brokers holding fewer (broker/reassignment.py); then give
        partitions without a live leader one where a replica is eligible, as the
        controller's reconcile pass does (``elect_offline``: those left without one are
        answered ``ELIGIBLE_LEADERS_NOT_AVAILABLE`` saying why); then move leadership back
        to preferred replicas (alive and in sync) now."""
        names = sorted(self.topics) if req.topics is None else req.topics
        for name in names:
            if name not in self.topics:
                raise UnknownTopic(f"topic {name!r} does not exist")
        if req.topics is not None and not names:
            raise InvalidRequest("no topics named")
        moves = []
        if req.reassign:
            moves = await self._replace_lost_replicas(list(names))
            moves += await self._spread_replicas(list(names))
        records = await self.metadata.topics()  # the store's: a config just altered counts
        live = {b.node_id for b in await self.metadata.brokers()}  # as the store has them now
        out = []
        for name in names:
            record = records.get(name)
            if record is None or name not in self.topics:  # deleted meanwhile
                continue
            try:
                elected, offline = await elect_offline(self.metadata, record, live) if live else ([], [])
                moved = await preferred_election(self.metadata, record, live)
            except BrokerError as exc:
                out.append(m.ElectionResult(topic=name, partition=-1, leader=-1, **error_fields(exc)))
                continue
            changed = dict(elected) | dict(moved)
            out.extend(m.ElectionResult(topic=name, partition=i, leader=leader) for i, leader in sorted(changed.items()))
            out.extend(
                m.ElectionResult(topic=name, partition=i, leader=-1, **error_fields(EligibleLeadersNotAvailable(why)))
                for i, why in offline
            )
        return m.ElectLeadersResponse(partitions=out, moves=moves), ()


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


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("partition state change failed", exc_info=task.exception())
