"""Partition states applied on this broker: the role of each partition held here follows
the metadata store.

The metadata store holds each partition's state {leader, leader epoch, ISR, version}.  A
task follows the store's watch and applies every change under the admin lock
(``become``): a partition this broker holds becomes leader (``make_leader``) when the
state names this broker, else follower of the named leader (``make_follower``, and the
follower side fetches it: follower.py).  Topics created or grown elsewhere are opened,
deleted ones forgotten (the topic service's ``forget_topic``); replicas moved between
brokers are applied by reassignment.py, woken by every change (``topics_stale``).

- **Epochs.**  Every leadership term is a new leader epoch, stamped at the log end before
  any write; a leader restarted within its session, one that cut its own log, or one
  whose disk failed with no successor (stepdown.py), has the store start a new epoch
  before it writes again (``new_leader_epoch``); a replica that lost records in a crash
  leaves the ISR at start (``_check_restarted``).
- **Fencing.**  A state older than one applied is ignored; a deposed leader cannot
  acknowledge: its high watermark needs fetches from its ISR, whose members follow the
  new leader, and it cannot shrink the ISR because the version moved on (leader.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.replication.follower import Followers
from sluice.cluster.controller import Controller
from sluice.cluster.store import MetadataStore, PartitionChange, PartitionState
from sluice.errors import MetadataUnavailable, UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.replication")


class PartitionStates:
    """Applies partition states to the partitions held here.  Event loop only.

    Collaborators: ``node_id``, this broker's; ``store``, the metadata store watched and
    swapped; ``registry``, the topics and partitions held here (opened and grown when the
    store tells); ``view``, whether the store is ours and whether the broker stops;
    ``admin_lock``, held while a change applies (topic changes hold it too);
    ``controller``, poked by every change (cluster/controller.py); ``followers``, which
    fetch the partitions followed here; ``leadership_changed(partition)``, told when a
    partition begins or stops leading here (group coordinator, subscriptions);
    ``forget_topic(name)``, the topic service's, for a deletion the store reports;
    ``topics_stale``, set by every change (the topic records are read again:
    reassignment.py)."""

    def __init__(
        self, node_id: int, store: MetadataStore, registry: TopicRegistry, view: ClusterView,
        admin_lock: asyncio.Lock, controller: Controller, followers: Followers,
        leadership_changed: Callable[[Partition], None], forget_topic: Callable[[str], Awaitable[None]],
        topics_stale: asyncio.Event,
    ) -> None:
        self.node_id = node_id
        self.metadata = store
        self.registry = registry
        self.view = view
        self.admin_lock = admin_lock
        self.controller = controller
        self.followers = followers
        self.leadership_changed = leadership_changed
        self.forget_topic = forget_topic
        self.topics_stale = topics_stale
        self._background: set[asyncio.Task] = set()  # state swaps beside the watch

    async def close(self) -> None:
        """Cancel the state swaps under way."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def withdraw_lost_replicas(self) -> None:
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
        me = self.node_id
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
        me = self.node_id
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

    async def follow_states(self) -> None:
        """Apply every partition-state change the store reports, in order, for as long as
        the broker runs."""
        while True:
            try:
                async for change in self.metadata.watch_partition_states():
                    async with self.admin_lock:
                        await self._apply_change(change)
                return  # the store was closed
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following partition states failed; starting over")
                await asyncio.sleep(0.5)

    async def _apply_change(self, change: PartitionChange) -> None:
        self.topics_stale.set()  # the topic's record may have changed too (reassignment.py)
        self.controller.poke()  # ... with a pending replica move (cluster/controller.py)
        self.controller.state_changed(change.state)  # ... or leaving it without a leader
        topic = self.registry.topics.get(change.topic)
        if change.state is None:
            if topic is not None and await self.view.store_is_ours():  # not a wiped store
                await self.forget_topic(change.topic)
            return
        if topic is None or change.partition >= topic.count:
            record = (await self.metadata.topics()).get(change.topic)
            if record is None or change.partition >= record.partitions:
                return  # deleted again meanwhile: its deletion follows
            if topic is None:
                if self.registry.log_dir(record.name, change.partition).exists() and not await self.view.store_is_ours():
                    return  # data of a topic the store never told this broker of: another cluster's store
                topic = await self.registry.open_topic(record)
            else:
                await self.registry.grow(topic, record)
        self.become(topic, change.partition, change.state)

    def become(self, topic: Topic, index: int, state: PartitionState) -> None:
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
        if state.leader == self.node_id and state.leader_epoch <= part.stale_epoch:
            # a leadership from before this broker (re)started, or from before its log was
            # cut: led only in a newer epoch (``new_leader_epoch``), never in this one
            self.followers.unfollow(part)
            if part.is_leader:
                part.make_follower(state.leader_epoch)
                self.leadership_changed(part)
            return
        if state.leader == self.node_id:
            if part.is_leader and part.leader_epoch == state.leader_epoch:
                part.set_replicas(replicas, state.isr)
                return
            if self.view.draining:  # stopping: it would be gone before serving anyone
                log.warning(
                    "not leading %s-%d in epoch %d: the broker is shutting down",
                    part.topic, part.index, state.leader_epoch,
                )
                return
            self.followers.unfollow(part)
            part.make_leader(state.leader_epoch, replicas, state.isr)
            self.leadership_changed(part)
            log.info(
                "leading %s-%d in epoch %d (ISR %s)", part.topic, part.index, state.leader_epoch, state.isr
            )
            return
        part.isr = tuple(state.isr)
        if not part.is_leader and part.leader_epoch == state.leader_epoch and self.followers.following(part) == state.leader:
            return
        was_leader = part.is_leader
        part.make_follower(state.leader_epoch)
        if was_leader:
            self.leadership_changed(part)
        self.followers.unfollow(part)
        if state.leader >= 0 and self.view.draining:  # stopping: a fetch would only rejoin an ISR it leaves
            log.info("not following broker %d for %s-%d: the broker is shutting down", state.leader, part.topic, part.index)
        elif state.leader >= 0:
            self.followers.follow(part, state.leader)
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
        me = self.node_id
        checkpointed = self.registry.checkpointed_hw.get((part.topic, part.index))
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
        me = self.node_id
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
        while part.state_version == state.version and self.registry.topics.get(part.topic) is topic and not part.closing:
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
        topic = self.registry.topics.get(part.topic)
        state = topic.states[part.index] if topic is not None else None
        if state is None or state.leader != self.node_id or part.stale_epoch >= state.leader_epoch:
            return
        part.stale_epoch = state.leader_epoch
        log.warning("%s-%d: %s: a new leader epoch after %d", part.topic, part.index, why, state.leader_epoch)
        if part.is_leader:
            part.make_follower(part.leader_epoch)
            self.leadership_changed(part)
        self._fence(topic, part, state)

    async def _bump_epoch(self, topic: Topic, part: Partition, state: PartitionState) -> None:
        new = PartitionState(self.node_id, state.leader_epoch + 1, list(state.isr))
        while part.state_version == state.version and self.registry.topics.get(part.topic) is topic and not part.closing:
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
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("partition state change failed", exc_info=task.exception())
