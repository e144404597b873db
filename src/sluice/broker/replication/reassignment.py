"""Replica reassignment on a broker: lost replicas replaced, replicas spread onto brokers
that joined, new replicas opened, dropped ones trashed.

``Reassignment`` plans no leadership (that is the controller's, cluster/controller.py) and
changes no ISR (the leader's, leader.py).

- **Planning** (``ELECT_LEADERS`` with ``reassign``: ``sluice cluster rebalance``): the
  broker that receives the request replaces, in every partition with a live leader, the
  replicas of brokers that are not alive by live brokers holding none of it, the least
  loaded first (``replace_lost_replicas``, cluster/assignment.py), and writes the new
  lists with ``MetadataStore.reassign``: one atomic change per topic, the dropped replicas
  leave the ISR, the replication factor stays.  Partitions without a live leader keep
  their replicas: a dead one may hold the only copy of their data.
- **Growing** (the same request, after that): a topic short of its replication factor
  (an internal topic created while brokers were down: ``TopicRecord.full_factor``) gets
  replicas on live brokers (cluster/strength.py; the controller does the same on each
  reconcile pass).
- **Spreading** (the same request, after that): when live brokers hold uneven numbers
  of replicas (a broker joined), ``spread_replicas`` (cluster/assignment.py) plans moves
  that even them out, and each is recorded as the first of two phases (Kafka's
  reassignment): the list grows by the new replicas and the store keeps the ones to drop
  (``TopicRecord.moving``), so the partition never has fewer in-sync replicas than
  before.  The controller drops them once the new ones are in the ISR
  (cluster/controller.py, ``complete_moves``).  Partitions with a pending move, a dead
  replica or no live leader are not planned.
- **Applying** (every broker): the store has no topic watch, so the topic records are
  read again soon after any partition state changes (``reassign`` rewrites the states it
  touches, so every broker wakes at once) and every ``TOPICS_RESYNC_S`` anyway.  Under the
  admin lock, the partitions held here are made to match each record: a broker newly
  listed opens the partition (empty) as a follower of its leader, whose ISR upkeep admits
  it once it caught up; a broker no longer listed closes its replica and moves its
  directory to the trash; a leader learns its new followers.  Config changes made on
  other brokers are applied the same way.
- **At start** (``trash_unlisted``): the directories of partitions that no longer list
  this broker (reassigned while it was down) go to the trash.
"""

from __future__ import annotations

import asyncio
import logging

from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.replication.follower import Followers
from sluice.broker.replication.states import PartitionStates
from sluice.broker.results import error_fields
from sluice.broker.wait import wait_event
from sluice.cluster.assignment import replace_lost_replicas, spread_replicas
from sluice.cluster.store import MetadataStore, TopicRecord
from sluice.cluster.strength import restore_strength
from sluice.errors import (
    BrokerBusy,
    BrokerError,
    InvalidReplicationFactor,
    MetadataUnavailable,
    NotLeader,
)
from sluice.protocol import messages as m

log = logging.getLogger("sluice.reassignment")

TOPICS_RESYNC_S = 2.0  # topic records changed on other brokers are read at least this often


class Reassignment:
    """Replica moves planned (``replace_lost_replicas``, ``spread_replicas``) and applied
    (``resync_topics``, ``apply_record``, ``trash_unlisted``).  Event loop only.

    Collaborators: ``node_id``, this broker's; ``store``, the metadata store the moves
    are recorded in and the records read from; ``registry``, the partitions held here
    (opened, reconfigured, trashed); ``view``, the live brokers, and whether the store is
    ours (asked before a replica is dropped); ``admin_lock``, held while records apply;
    ``states``, whose ``become`` gives a new replica its role; ``followers``, told of a
    dropped replica; ``isr_check``, set when a leader learns new followers;
    ``topics_stale``, set to read the records again soon (and waited on)."""

    def __init__(
        self, node_id: int, store: MetadataStore, registry: TopicRegistry, view: ClusterView,
        admin_lock: asyncio.Lock, states: PartitionStates, followers: Followers,
        isr_check: asyncio.Event, topics_stale: asyncio.Event,
    ) -> None:
        self.node_id = node_id
        self.metadata = store
        self.registry = registry
        self.view = view
        self.admin_lock = admin_lock
        self.states = states
        self.followers = followers
        self.isr_check = isr_check
        self.topics_stale = topics_stale

    # ------------------------------------------------------------------ planning

    async def replace_lost_replicas(self, names: list[str]) -> list[m.ReplicaMove]:
        """Replace the replicas of brokers not alive in the partitions of ``names`` (known
        topics) that have a live leader, then add the replicas missing from topics short
        of their replication factor (``_grow_replicas``); one ``ReplicaMove`` per partition
        changed (or whose topic's change failed, with the error)."""
        live = set(self.view.live_brokers)
        records = await self.metadata.topics()
        names = [n for n in names if n in records]
        keep = {(name, p) for name in names for p in records[name].moving}
        for name in names:
            for i, st in enumerate(await self.metadata.partition_states(name)):
                if st.leader not in live:
                    keep.add((name, i))
        plan = replace_lost_replicas(
            {n: r.assignment for n, r in records.items()}, live, topics=names, keep=keep
        )
        moves = self._kept_dead_replicas(records, names, keep, plan, live)
        for name, changes in plan.items():
            old = records[name].assignment
            try:
                await self.metadata.reassign(name, changes)
                failed = {}
            except BrokerError as exc:
                failed = error_fields(exc)
                log.warning("cannot reassign replicas of %s: %s", name, exc)
            for p, new in sorted(changes.items()):
                moves.append(m.ReplicaMove(topic=name, partition=p, old=list(old[p]), new=new, **failed))
                if not failed:
                    log.info("%s-%d: replicas %s -> %s (live brokers %s)", name, p, old[p], new, sorted(live))
        self.topics_stale.set()
        return moves + await self._grow_replicas(names)

    @staticmethod
    def _kept_dead_replicas(records, names, keep, plan, live) -> list[m.ReplicaMove]:
        """A refused ``ReplicaMove`` (with why) for each partition of ``names`` that names a
        dead broker and that the plan leaves as it is."""
        out = []
        for name in names:
            for p, replicas in enumerate(records[name].assignment):
                dead = [r for r in replicas if r not in live]
                if not dead or p in plan.get(name, {}):
                    continue
                if p in records[name].moving:
                    exc = BrokerBusy("replicas kept: a replica move of it is pending; retry once it is done")
                elif (name, p) in keep:
                    exc = NotLeader("replicas kept: it has no live leader (its dead replicas may hold its only copy)")
                else:
                    exc = InvalidReplicationFactor(
                        f"replicas kept: no live broker outside its replicas can take the place of broker(s) {dead}"
                    )
                out.append(m.ReplicaMove(topic=name, partition=p, old=list(replicas), new=list(replicas),
                                         **error_fields(exc)))
        return out

    async def _grow_replicas(self, names: list[str]) -> list[m.ReplicaMove]:
        """Add replicas on live brokers to the topics of ``names`` short of their replication
        factor; one ``ReplicaMove`` (old list, grown list) per partition grown (with the
        error when its topic's change failed)."""
        moves = []
        for growth in await restore_strength(self.metadata, set(self.view.live_brokers), names):
            failed = error_fields(growth.error) if growth.error is not None else {}
            moves.extend(
                m.ReplicaMove(topic=growth.topic, partition=p, old=list(growth.old[p]), new=new, **failed)
                for p, new in sorted(growth.new.items())
            )
        self.topics_stale.set()
        return moves

    async def spread_replicas(self, names: list[str]) -> list[m.ReplicaMove]:
        """Record the first phase of the moves that even out the replica load of the live
        brokers, in the partitions of ``names``; one pending ``ReplicaMove`` (old list,
        target list) per partition planned (with the error when its topic's change failed)."""
        live = set(self.view.live_brokers)
        records = await self.metadata.topics()
        names = [n for n in names if n in records]
        keep = {(name, p) for name in names for p in records[name].moving}
        leaders = {}
        for name in names:
            states = await self.metadata.partition_states(name)
            leaders[name] = [st.leader for st in states]
            keep.update((name, i) for i, st in enumerate(states) if st.leader not in live)
        targets = {n: [r.target(p) for p in range(r.partitions)] for n, r in records.items()}
        plan = spread_replicas(targets, live, leaders=leaders, topics=names, keep=keep)
        moves = []
        for name, changes in sorted(plan.items()):
            old = records[name].assignment
            drop = {p: [r for r in old[p] if r not in new] for p, new in changes.items()}
            try:
                await self.metadata.reassign(name, {p: new + drop[p] for p, new in changes.items()}, drop)
                failed = {}
            except BrokerError as exc:
                failed = error_fields(exc)
                log.warning("cannot move replicas of %s: %s", name, exc)
            for p, new in sorted(changes.items()):
                moves.append(m.ReplicaMove(topic=name, partition=p, old=list(old[p]), new=new, pending=True, **failed))
                if not failed:
                    log.info("%s-%d: replicas moving %s -> %s (live brokers %s)", name, p, old[p], new, sorted(live))
        self.topics_stale.set()
        return moves

    # ------------------------------------------------------------------ applying

    async def resync_topics(self) -> None:
        """Apply the topic records as the store has them: soon after a partition state
        changed (``_topics_stale``), else every ``TOPICS_RESYNC_S``."""
        while True:
            await wait_event(self.topics_stale, TOPICS_RESYNC_S)
            self.topics_stale.clear()
            try:
                async with self.admin_lock:  # read under the lock: no local change interleaves
                    for name, record in (await self.metadata.topics()).items():
                        t = self.registry.topics.get(name)
                        if t is not None and record.partitions == t.count:
                            await self.apply_record(t, record)
                        # else created, deleted or grown: the partition states' watch applies it
            except MetadataUnavailable:
                continue
            except Exception:
                log.exception("applying topic records failed; trying again")

    async def apply_record(self, topic: Topic, record: TopicRecord) -> None:
        """Make the replicas held here, and the followers known to the partitions led here,
        match ``record`` (same partition count as ``topic``); apply its config.  Admin
        lock held."""
        reconfigured = record.config != topic.record.config
        topic.record = record
        node = self.node_id
        for i, replicas in enumerate(record.assignment):
            part = topic.partitions.get(i)
            if node in replicas and part is None:
                await self._add_replica(topic, i)
            elif node not in replicas and part is not None:
                if await self.view.store_is_ours():  # not another cluster's store
                    await self._drop_replica(topic, part)
            elif part is not None and part.is_leader and set(part.followers) != set(replicas) - {node}:
                # not a state of the store: an ISR expansion being written still counts
                part.set_replicas(replicas, list(part.isr), settled=False)
                self.isr_check.set()
                log.info("%s-%d: followers now %s", topic.name, i, sorted(part.followers))
        if reconfigured:
            self.registry.reconfigure(topic, record)

    async def _add_replica(self, topic: Topic, index: int) -> None:
        """Open partition ``index`` (empty, or what this broker kept of it) and follow its
        leader as its state says."""
        [part] = await self.registry.open_partitions(topic.name, [index], topic.config)
        topic.partitions[index] = part
        log.info("%s-%d: this broker is a new replica", topic.name, index)
        state = topic.states[index]
        if state is not None:
            self.states.become(topic, index, state)

    async def _drop_replica(self, topic: Topic, part: Partition) -> None:
        """Stop holding ``part``: stop fetching, give up leading (waiting ``acks=all``
        writes fail with ``LeadershipLost``), close it and move its directory to the trash."""
        del topic.partitions[part.index]
        self.followers.unfollow(part)
        if part.is_leader:
            part.make_follower(part.leader_epoch)
            self.states.leadership_changed(part)
        try:
            await part.close()
        except Exception:  # its files go to the trash either way
            log.exception("closing %s-%d failed", part.topic, part.index)
        self.registry.trash(topic.name, part.index)
        log.info("%s-%d: this broker is no longer a replica; its data went to the trash", topic.name, part.index)

    def trash_unlisted(self, record: TopicRecord) -> None:
        """Move to the trash the directories of ``record``'s partitions that do not list this
        broker (reassigned while it was down).  At start, before the partitions are used."""
        node = self.node_id
        for i, replicas in enumerate(record.assignment):
            if node not in replicas and self.registry.log_dir(record.name, i).exists():
                self.registry.trash(record.name, i)
                log.info("%s-%d: reassigned away from this broker; its data went to the trash", record.name, i)
