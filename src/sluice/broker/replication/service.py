"""Replication on a broker, composed: the partition states applied (states.py), the
leader side (leader.py: ISR upkeep, replica APIs), the follower side (follower.py: replica
fetchers), replica moves (reassignment.py), controlled shutdown (handoff.py) and the
step-down from a failed disk (stepdown.py).

A single broker runs the same replication: it is a cluster of one, where every partition
has one replica and its own log end is its high watermark.

``ReplicationService`` is what the rest of the broker sees: the handlers of
REPLICA_FETCH, OFFSETS_FOR_LEADER_EPOCH and ELECT_LEADERS, the loops the broker runs,
``become`` / ``unfollow`` for the topic service, ``disk_failed`` for the partitions, and
``hand_off`` for the shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine

from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.replication.follower import Followers
from sluice.broker.replication.handoff import hand_off
from sluice.broker.replication.leader import LeaderSide
from sluice.broker.replication.reassignment import Reassignment
from sluice.broker.replication.states import PartitionStates
from sluice.broker.replication.stepdown import DiskStepDown
from sluice.broker.results import error_fields
from sluice.cluster.controller import Controller, elect_offline, preferred_election
from sluice.cluster.store import MetadataStore, PartitionState
from sluice.config import ServerConfig
from sluice.errors import (
    BrokerError,
    EligibleLeadersNotAvailable,
    InvalidRequest,
    StorageError,
    UnknownTopic,
)
from sluice.protocol import messages as m


class ReplicationService:
    """The replication of the partitions held here (module docstring).  Event loop only.

    Collaborators: ``config``, the server's (node id, ``replica_lag_time_max_ms``);
    ``store``, the metadata store (partition states, topic records); ``registry``, the
    topics and partitions held here; ``view``, the live brokers, whether the store is ours
    and whether the broker stops; ``admin_lock``, held by every change of topics and
    states; ``controller``, poked by state changes; ``leadership_changed(partition)``,
    told when a partition begins or stops leading here; ``forget_topic(name)``, the topic
    service's, for a deletion the store reports (a late-bound callable: the topic service
    is built after this one, and asks it to ``become``)."""

    def __init__(
        self, config: ServerConfig, store: MetadataStore, registry: TopicRegistry, view: ClusterView,
        admin_lock: asyncio.Lock, controller: Controller, leadership_changed: Callable[[Partition], None],
        forget_topic: Callable[[str], Awaitable[None]],
    ) -> None:
        node = config.node_id
        self.node_id = node
        self.metadata = store
        self.registry = registry
        self.view = view
        self.isr_check = asyncio.Event()  # wakes the ISR upkeep at once
        self.topics_stale = asyncio.Event()  # wakes the topic records' resync at once
        self.followers = Followers(node, view)
        self.states = PartitionStates(
            node, store, registry, view, admin_lock, controller, self.followers, leadership_changed,
            forget_topic, self.topics_stale,
        )
        self.leader = LeaderSide(
            node, config.replica_lag_time_max_ms, store, registry, view, self.states, self.isr_check,
            self.topics_stale,
        )
        self.reassignment = Reassignment(
            node, store, registry, view, admin_lock, self.states, self.followers, self.isr_check, self.topics_stale,
        )
        self.step_down = DiskStepDown(node, store, self._live, self.states.new_leader_epoch)

    def _live(self) -> set[int]:
        return set(self.view.live_brokers)

    def handlers(self) -> dict:
        return {
            m.Api.REPLICA_FETCH: self.leader.replica_fetch,
            m.Api.OFFSETS_FOR_LEADER_EPOCH: self.leader.offsets_for_leader_epoch,
            m.Api.ELECT_LEADERS: self.elect_leaders,
        }

    def loops(self) -> list[Coroutine]:
        """What the broker runs while it is up: the states' watch, the ISR upkeep, the
        topic records' resync."""
        return [self.states.follow_states(), self.leader.isr_loop(), self.reassignment.resync_topics()]

    def become(self, topic: Topic, index: int, state: PartitionState) -> None:
        """Apply ``state`` to partition ``index`` of ``topic`` (states.py)."""
        self.states.become(topic, index, state)

    def unfollow(self, part: Partition) -> None:
        """Stop fetching ``part`` (follower.py)."""
        self.followers.unfollow(part)

    def disk_failed(self, part: Partition, err: StorageError) -> None:
        """``part``'s disk failed while it leads here: hand its leadership away (stepdown.py)."""
        self.step_down.disk_failed(part, err)

    async def withdraw_lost_replicas(self) -> None:
        """A new data directory: leave the ISR and leadership of the replicas listed here
        (states.py)."""
        await self.states.withdraw_lost_replicas()

    def trash_unlisted(self, record) -> None:
        """At start: trash the directories of ``record``'s partitions reassigned away."""
        self.reassignment.trash_unlisted(record)

    async def hand_off(self) -> int:
        """Shutdown: hand each partition led here to a live in-sync follower that fetches
        (handoff.py); returns how many moved."""
        return await hand_off(self.node_id, self.metadata, self.registry, self._live, self.states.become)

    async def close(self) -> None:
        """Cancel the state swaps under way, stop the replica fetchers."""
        await self.states.close()
        await self.followers.close()

    async def elect_leaders(self, req: m.ElectLeadersRequest, _att, _peer: Peer):
        """With ``reassign``, first replace the replicas of brokers that are gone and
        record moves onto brokers holding fewer (reassignment.py); then give
        partitions without a live leader one where a replica is eligible, as the
        controller's reconcile pass does (``elect_offline``: those left without one are
        answered ``ELIGIBLE_LEADERS_NOT_AVAILABLE`` saying why); then move leadership back
        to preferred replicas (alive and in sync) now."""
        names = sorted(self.registry.topics) if req.topics is None else req.topics
        for name in names:
            if name not in self.registry.topics:
                raise UnknownTopic(f"topic {name!r} does not exist")
        if req.topics is not None and not names:
            raise InvalidRequest("no topics named")
        moves = []
        if req.reassign:
            moves = await self.reassignment.replace_lost_replicas(list(names))
            moves += await self.reassignment.spread_replicas(list(names))
        records = await self.metadata.topics()  # the store's: a config just altered counts
        live = {b.node_id for b in await self.metadata.brokers()}  # as the store has them now
        out = []
        for name in names:
            record = records.get(name)
            if record is None or name not in self.registry.topics:  # deleted meanwhile
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
