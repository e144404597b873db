"""The cluster metadata store: one interface, two implementations.

``MetadataStore`` is everything a broker and the controller keep outside their logs:
live brokers, topic definitions with their replica assignment, the state of every
partition (leader, leader epoch, in-sync replicas) and producer-id blocks, plus the
election of the controller.  Two implementations keep the same contract:

- ``cluster/embedded.py``: one broker, its data directory; the default (no etcd needed);
- ``cluster/etcd.py``: etcd, shared by the brokers of a cluster.

Rules every implementation keeps:

- Errors come from ``sluice.errors``: ``MetadataUnavailable`` (retriable) when the store
  cannot be reached within its request timeout, whatever the operation; the outcome of a
  write that failed that way is unknown (read it back).  No call hangs.
- A partition state's ``version`` is opaque and compared for equality only: every write of
  that partition's state gives it a new one, never given before to that (topic, partition),
  even across a delete and re-create of the topic.  Every change of a partition state after
  its creation goes through ``cas_partition_state``, or ``reassign`` (with its replicas).
- Watches start with the current state, then follow changes in order.  When the store was
  unreachable for a while they catch up (by re-reading) instead of failing; they end when
  the store is closed.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sluice.config import check_topic_name
from sluice.errors import (
    InvalidPartitions,
    InvalidRequest,
    InvalidTopicName,
    UnknownTopic,
    unknown_partition,
)

EMBEDDED_CLUSTER_ID = "embedded"  # the cluster id of every single-node (embedded) data directory
MAX_PRODUCER_ID = (1 << 63) - 1  # producer ids are int64 on the wire
MAX_PRODUCER_ID_BLOCK = 1 << 20


@dataclass(frozen=True)
class BrokerRegistration:
    """A live broker: its id and the address clients and peers connect to."""

    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class TopicRecord:
    """What the store keeps of one topic.

    ``assignment[p]`` lists the replicas (node ids) of partition ``p``, preferred leader
    first; it has ``partitions`` entries of ``replication_factor`` distinct ids each, plus
    the replicas to drop of a pending move.  ``moving[p]`` (only for partitions with a
    pending move: cluster/assignment.py, ``spread_replicas``) lists the replicas of ``p``
    that leave once the others are all in sync; they are in ``assignment[p]`` meanwhile.
    ``config`` holds only the overrides of the broker's topic defaults.
    ``intended_replication_factor`` (0: none beyond ``replication_factor``) is the factor an
    internal topic created while brokers were down is brought up to as brokers become
    available (cluster/strength.py): its ``replication_factor`` grows, never past it.
    """

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    internal: bool = False
    replication_factor: int = 1
    assignment: list[list[int]] = field(default_factory=list)
    moving: dict[int, list[int]] = field(default_factory=dict)
    intended_replication_factor: int = 0

    @property
    def full_factor(self) -> int:
        """The replication factor the topic is meant to have (``replication_factor`` unless
        an internal topic was created short of brokers)."""
        return max(self.replication_factor, self.intended_replication_factor)

    def target(self, partition: int) -> list[int]:
        """The replicas ``partition`` keeps once its pending move (if any) is done."""
        drop = self.moving.get(partition, ())
        return [r for r in self.assignment[partition] if r not in drop]


@dataclass(frozen=True)
class PartitionState:
    """Who leads a partition, in which leader epoch, and which replicas are in sync.

    ``version`` is set by the store when it reads a state (see the module docstring); the
    version of a state passed to the store is ignored.
    """

    leader: int
    leader_epoch: int
    isr: list[int]
    version: int = 0


@dataclass(frozen=True)
class PartitionChange:
    """One change seen by ``watch_partition_states``: ``state`` is None when the partition
    is gone (its topic was deleted)."""

    topic: str
    partition: int
    state: PartitionState | None


class Leadership:
    """This node's term as controller.

    ``epoch`` grows with every election in the cluster (a deposed controller's epoch is
    always lower than its successor's).  ``lost`` is set once the term ended: resigned, the
    store closed, or the store lost its session (etcd unreachable for longer than the
    session timeout: another node may be elected from then on).  A controller stops acting
    as soon as ``lost`` is set.
    """

    def __init__(self, node_id: int, epoch: int) -> None:
        self.node_id = node_id
        self.epoch = epoch
        self.lost = asyncio.Event()

    def __repr__(self) -> str:
        return f"Leadership(node_id={self.node_id}, epoch={self.epoch}, lost={self.lost.is_set()})"


class MetadataStore(abc.ABC):
    """Cluster metadata: brokers, topics, partition states, controller, producer ids."""

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect (etcd) or load (embedded).  Raises ``MetadataUnavailable`` when etcd
        cannot be reached, ``StorageError`` when the data directory's metadata is unreadable."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Resign if controller, end this store's registration (at once where possible, else
        when its lease expires), end the watches.  Never raises; idempotent."""

    @abc.abstractmethod
    async def claim_cluster_id(self, known: str | None) -> str:
        """The id of the cluster whose metadata this store holds.

        ``known``: the id a data directory recorded (``storage/identity.py``), None for a
        directory that has none yet.  A store without an id gets a new one when ``known``
        is None (a new cluster).  Raises ``ClusterIdMismatch`` when ``known`` is given and
        the store holds another id or none (its metadata were wiped or it is another
        store), and ``MetadataUnavailable`` when it cannot be asked.  Brokers call it at
        start and again before they delete data because the metadata say so."""

    def leaving(self) -> None:
        """The broker is stopping: a session that ends from now on (its peers may end it
        early, broker/liveness.py) is not replaced, so the broker is not registered again
        and does not campaign again before ``close``.  Call from the event loop.  (A store
        without sessions has nothing to do.)"""
        return None

    # ------------------------------------------------------------------ brokers

    @abc.abstractmethod
    async def register_broker(self, reg: BrokerRegistration) -> None:
        """Register this broker for as long as the store is open and its session lives.

        The registration is held by a lease kept alive in the background; it disappears
        ``session_timeout`` after the process stops renewing it (at once on ``close``).
        After a lapsed session the store registers again by itself when it can.
        Raises ``NodeIdInUse`` when another live broker holds ``reg.node_id`` with another
        address; an identical live registration (the same broker restarted before its old
        lease expired) is taken over.
        """

    @abc.abstractmethod
    async def brokers(self) -> list[BrokerRegistration]:
        """The live registrations, by node id."""

    @abc.abstractmethod
    def watch_brokers(self) -> AsyncIterator[list[BrokerRegistration]]:
        """The live registrations (by node id) at once, then again each time they change."""

    async def registration_token(self, node_id: int) -> int | None:
        """A token naming ``node_id``'s registration as the store holds it now (its session:
        a broker that restarts registers under a new one), for ``end_registration``; None
        when it is not registered, or when this store has no sessions to end (embedded)."""
        return None

    async def end_registration(self, node_id: int, token: int) -> bool:
        """End the registration ``token`` named now, as if its session had lapsed: its
        broker leaves the live brokers and, if it was the controller, its term ends.  Only
        for a broker known to be dead (broker/liveness.py).  A registration made since under
        another session is untouched.  Returns whether it was still there to end; raises
        ``MetadataUnavailable``."""
        return False

    # ------------------------------------------------------------------ topics

    @abc.abstractmethod
    async def topics(self) -> dict[str, TopicRecord]:
        """Every topic, by name."""

    @abc.abstractmethod
    async def create_topic(self, record: TopicRecord, states: Sequence[PartitionState]) -> None:
        """Create a topic with the initial state of each of its partitions, atomically.

        Raises ``TopicAlreadyExists`` if a topic of that name exists, ``InvalidRequest`` /
        ``InvalidPartitions`` when record and states do not agree (``check_new_topic``).
        """

    @abc.abstractmethod
    async def delete_topic(self, name: str) -> None:
        """Delete a topic and the states of its partitions, atomically.  ``UnknownTopic``
        if there is no such topic."""

    @abc.abstractmethod
    async def update_topic(
        self, record: TopicRecord, new_states: Sequence[PartitionState] = ()
    ) -> None:
        """Replace a topic's config and/or add partitions, with the initial states of the
        added partitions, atomically.

        The existing partitions and their assignment cannot change here
        (``check_topic_update``).  Raises ``UnknownTopic``, ``InvalidPartitions``,
        ``InvalidRequest``.
        """

    @abc.abstractmethod
    async def reassign(
        self, topic: str, assignments: Mapping[int, Sequence[int]],
        moving: Mapping[int, Sequence[int]] | None = None, replication_factor: int | None = None,
    ) -> None:
        """Replace the replica lists of existing partitions of ``topic`` (partition -> new
        list, preferred leader first), atomically with their states and pending moves.

        Each touched partition's pending move becomes ``moving[p]`` (the replicas of the new
        list to drop later: the list then holds that many more than the replication
        factor), or none when ``moving`` does not name it; untouched partitions keep theirs.

        Each touched partition's state is rewritten (a new version, so that its watchers
        wake) as ``reassigned_state`` says: replicas no longer listed leave the ISR, and a
        leader no longer listed leaves its partition without one.  A state changed
        concurrently is read again and the change retried, never overwritten.  The
        replication factor changes only when ``replication_factor`` says so, and only up to
        the topic's ``full_factor`` (``check_reassignment``).  Raises ``UnknownTopic``, ``UnknownPartition``,
        ``InvalidRequest`` (``check_reassignment``).
        """

    # ------------------------------------------------------------------ partition state

    @abc.abstractmethod
    async def partition_states(self, topic: str) -> list[PartitionState]:
        """The state of each partition of ``topic``, by partition.  ``UnknownTopic`` if
        there is no such topic."""

    @abc.abstractmethod
    async def cas_partition_state(
        self, topic: str, partition: int, expected_version: int, new_state: PartitionState
    ) -> bool:
        """Replace a partition's state if its version is still ``expected_version``.

        Returns False (nothing written) when the version moved on (also when the topic was
        deleted and created again meanwhile: versions are never reused).  Raises
        ``UnknownTopic`` / ``UnknownPartition`` when the topic or partition does not exist
        now, ``InvalidRequest`` for a state this store cannot hold.
        """

    @abc.abstractmethod
    def watch_partition_states(self) -> AsyncIterator[PartitionChange]:
        """Every partition's current state at once, then each change (creations, CAS,
        deletions) in order.  After an outage it yields what changed meanwhile."""

    # ------------------------------------------------------------------ controller

    @abc.abstractmethod
    async def campaign(self, node_id: int) -> Leadership:
        """Wait until ``node_id`` is the controller and return its term.

        Waits through outages of the store (retrying); bound it with a timeout if needed.
        While this store holds a term that is not lost, returns that term.
        """

    @abc.abstractmethod
    async def controller(self) -> int | None:
        """The node id of the current controller, or None when there is none."""

    @abc.abstractmethod
    async def resign(self) -> None:
        """End this store's term as controller (its ``lost`` is set at once) so another
        node can be elected.  Does nothing when this store is not the controller."""

    # ------------------------------------------------------------------ producer ids

    @abc.abstractmethod
    async def allocate_producer_ids(self, block_size: int) -> tuple[int, int]:
        """Reserve ``block_size`` producer ids: returns ``(first, last)``, inclusive.

        Blocks never overlap, across stores of the same cluster and across restarts.
        ``InvalidRequest`` for a block size outside 1..2**20.
        """


# ---------------------------------------------------------------------- shared rules


def initial_states(record: TopicRecord) -> list[PartitionState]:
    """The state of each partition of a new topic: its preferred replica leads, epoch 0,
    every replica in sync."""
    return [PartitionState(replicas[0], 0, list(replicas)) for replicas in record.assignment]


def check_new_topic(record: TopicRecord, states: Sequence[PartitionState]) -> None:
    """Raise unless ``record`` is well formed and ``states`` has one state per partition."""
    _check_assignment(record)
    if record.moving:
        raise InvalidRequest(f"topic {record.name!r}: a new topic has no pending moves")
    if len(states) != record.partitions:
        raise InvalidRequest(
            f"topic {record.name!r} has {record.partitions} partitions but {len(states)} states"
        )


def check_topic_update(
    current: TopicRecord, record: TopicRecord, new_states: Sequence[PartitionState]
) -> None:
    """Raise unless ``record`` only changes ``current``'s config and adds partitions (with
    one state in ``new_states`` per added partition)."""
    _check_assignment(record)
    if record.partitions < current.partitions:
        raise InvalidPartitions(
            f"topic {record.name!r} has {current.partitions} partitions; they cannot be "
            f"reduced to {record.partitions}"
        )
    if (record.internal, record.replication_factor) != (current.internal, current.replication_factor):
        raise InvalidRequest(f"topic {record.name!r}: internal and replication factor cannot change")
    if record.assignment[: current.partitions] != current.assignment or record.moving != current.moving:
        raise InvalidRequest(f"topic {record.name!r}: the replicas of existing partitions cannot change here")
    added = record.partitions - current.partitions
    if len(new_states) != added:
        raise InvalidRequest(
            f"topic {record.name!r} gains {added} partitions but {len(new_states)} states were given"
        )


def check_reassignment(
    current: TopicRecord, assignments: Mapping[int, Sequence[int]],
    moving: Mapping[int, Sequence[int]] | None = None, replication_factor: int | None = None,
) -> None:
    """Raise unless each of ``assignments`` names an existing partition of ``current`` and
    lists ``replication_factor`` distinct node ids plus those of its pending move
    (``moving``: a non-empty part of the list, keeping at least one replica, only for
    partitions of ``assignments``).

    A ``replication_factor`` other than the current one must be a growth up to
    ``full_factor``, of a topic with no pending move, naming every partition, each new
    list starting with its old one (the added replicas copy the partition and join the
    ISR once caught up; the preferred leader stays)."""
    moving = moving or {}
    factor = current.replication_factor if replication_factor is None else replication_factor
    if factor != current.replication_factor:
        if not current.replication_factor < factor <= current.full_factor:
            raise InvalidRequest(
                f"topic {current.name!r}: its replication factor {current.replication_factor} can only grow, "
                f"up to {current.full_factor}, not become {factor}"
            )
        if current.moving or moving:
            raise InvalidRequest(f"topic {current.name!r}: its replication factor cannot grow during a replica move")
        if set(assignments) != set(range(current.partitions)) or any(
            list(replicas[: current.replication_factor]) != current.assignment[p]
            for p, replicas in assignments.items()
        ):
            raise InvalidRequest(
                f"topic {current.name!r}: growing the replication factor adds replicas to the end of every "
                f"partition's list"
            )
    for p in moving:
        if p not in assignments:
            raise InvalidRequest(f"topic {current.name!r} partition {p}: a pending move needs its new replica list")
    for p, replicas in assignments.items():
        if not 0 <= p < current.partitions:
            raise unknown_partition(current.name, p, current.partitions)
        drop = list(moving.get(p, ()))
        if (
            len(replicas) != factor + len(drop) or len(set(replicas)) != len(replicas)
            or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in replicas)
        ):
            raise InvalidRequest(
                f"topic {current.name!r} partition {p}: replicas {list(replicas)} are not "
                f"{factor} distinct node ids"
                + (f" plus the {len(drop)} leaving" if drop else "")
            )
        if p in moving and (not drop or len(set(drop)) != len(drop) or not set(drop) <= set(replicas)):
            raise InvalidRequest(
                f"topic {current.name!r} partition {p}: replicas to drop {drop} are not distinct "
                f"replicas of {list(replicas)}"
            )


def reassigned_record(
    current: TopicRecord, assignments: Mapping[int, Sequence[int]],
    moving: Mapping[int, Sequence[int]] | None = None, replication_factor: int | None = None,
) -> TopicRecord:
    """``current`` with the replica lists, pending moves and replication factor of
    ``reassign`` (checked)."""
    check_reassignment(current, assignments, moving, replication_factor)
    pending = {p: d for p, d in current.moving.items() if p not in assignments}
    pending.update({p: list(d) for p, d in (moving or {}).items()})
    return replace(
        current,
        assignment=[list(assignments.get(p, r)) for p, r in enumerate(current.assignment)],
        moving=dict(sorted(pending.items())),
        replication_factor=current.replication_factor if replication_factor is None else replication_factor,
    )


def reassigned_state(state: PartitionState, replicas: Sequence[int]) -> PartitionState:
    """The state of a partition whose replicas become ``replicas``: the ISR keeps only
    those still listed; a leader no longer listed gives way to none (leader -1, in a new
    epoch: the controller elects a listed in-sync replica)."""
    isr = [r for r in state.isr if r in replicas]
    if state.leader == -1 or state.leader in replicas:
        return PartitionState(state.leader, state.leader_epoch, isr)
    return PartitionState(-1, state.leader_epoch + 1, isr)


def _check_assignment(record: TopicRecord) -> None:
    if len(record.assignment) != record.partitions:
        raise InvalidPartitions(
            f"topic {record.name!r} has {record.partitions} partitions but "
            f"{len(record.assignment)} replica lists"
        )
    for p, replicas in enumerate(record.assignment):
        extra = len(record.moving.get(p, ()))
        if len(replicas) != record.replication_factor + extra or len(set(replicas)) != len(replicas):
            raise InvalidRequest(
                f"topic {record.name!r} partition {p}: replicas {replicas} are not "
                f"{record.replication_factor} distinct node ids"
            )


def unknown_topic(name: str) -> UnknownTopic | InvalidTopicName:
    """The error for a topic that is not there: ``InvalidTopicName`` when no topic could
    have ``name`` (a mistyped name is named as such, not as merely missing), else
    ``UnknownTopic``."""
    try:
        check_topic_name(name, internal_ok=True)
    except InvalidTopicName as exc:
        return exc
    return UnknownTopic(f"topic {name!r} does not exist")


def check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= MAX_PRODUCER_ID_BLOCK:
        raise InvalidRequest(f"producer id block size must be 1-{MAX_PRODUCER_ID_BLOCK}, got {block_size!r}")


def producer_id_block(next_id: int, block_size: int) -> tuple[int, int]:
    """The block starting at ``next_id``; ``InvalidRequest`` once ids would pass int64."""
    last = next_id + block_size - 1
    if last > MAX_PRODUCER_ID:
        raise InvalidRequest("producer ids are exhausted")
    return next_id, last
