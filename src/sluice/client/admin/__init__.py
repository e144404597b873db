"""Administration: topics (create, delete, list, describe, alter config, add partitions,
list offsets), subscriptions, consumer groups (list, describe, delete, reset offsets),
transactions, and the cluster (status, preferred-leader election, rebalance).

``Admin`` is the one public face: each of its methods hands the call to the object of its
noun, built with the collaborators it needs, all sharing one ``Routing`` over one
``Cluster`` (metadata and connections):

- routing.py        where a request goes: any broker, each partition's leader, a group's
                    coordinator (retried on ``NOT_COORDINATOR`` within the request timeout)
- topics.py         ``Topics``; ``add_partitions`` extends the topic's subscriptions
- subscriptions.py  ``Subscriptions``
- groups.py         ``Groups`` (lags from the partitions' leaders), ``OffsetReset``
- cluster.py        ``ClusterAdmin``: status with probes, rebalance; ``Rebalance``
- transactions.py   listing and ending unresolved transactions and delayed messages

Thin: each method is one request to a broker (the controller when metadata names one), or
a few for offset resets, and turns per-topic or per-partition error codes into exceptions
with ``errors.raise_for_code``.  Belongs to one event loop; ``client.sync.SyncAdmin`` is
the blocking twin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sluice.client.admin import transactions
from sluice.client.admin.cluster import PROBE_TIMEOUT_MS, ClusterAdmin, Rebalance
from sluice.client.admin.groups import Groups, OffsetReset
from sluice.client.admin.routing import Routing
from sluice.client.admin.subscriptions import Subscriptions
from sluice.client.admin.topics import Topics
from sluice.client.cluster import Cluster
from sluice.client.status import ClusterStatus
from sluice.client.transport import ConnectionFactory
from sluice.protocol import messages
from sluice.protocol.messages import (
    ElectionResult,
    GroupDescription,
    GroupListing,
    ReplicaMove,
    SubscriptionPartitionInfo,
    TopicDescription,
    TopicMetadata,
)
from sluice.protocol.subscriptions import SubscriptionConfig

__all__ = [
    "Admin",
    "ClusterStatus",
    "ElectionResult",
    "GroupDescription",
    "GroupListing",
    "OffsetReset",
    "Rebalance",
    "ReplicaMove",
    "TopicDescription",
    "TopicMetadata",
]


class Admin:
    """Administrative requests against a cluster; each method's contract is that of the
    noun object it hands the call to (named in its docstring)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: float = 30000,
        connect_timeout_ms: float = 10000,
        connection_factory: ConnectionFactory | None = None,
    ) -> None:
        self._cluster = Cluster(
            bootstrap,
            connection_factory=connection_factory,
            connect_timeout=connect_timeout_ms / 1000,
            request_timeout=request_timeout_ms / 1000,
        )
        routing = self._routing = Routing(self._cluster)
        self._subscriptions = Subscriptions(routing)
        self._topics = Topics(routing, self._subscriptions)
        self._groups = Groups(routing, self._topics)
        self._cluster_admin = ClusterAdmin(routing, connection_factory)  # the factory: also for probes

    async def start(self) -> None:
        """Optional: connect now (methods connect on first use)."""
        await self._cluster.refresh([])

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _request(self, request):
        """``request`` to any broker; the response (``Routing.request``)."""
        return await self._routing.request(request)

    # ------------------------------------------------------------------ transactions

    async def list_transactions(
        self, topics: Iterable[str] | None = None, delayed: bool = False
    ) -> list[messages.TransactionInfo]:
        """Unresolved half messages, or pending delayed messages: ``transactions.list_transactions``."""
        return await transactions.list_transactions(self._cluster, topics, delayed)

    async def end_transaction(self, txn_id: str, commit: bool, retry_timeout_ms: float = 10_000):
        """Commit or roll back a half message by id: ``transactions.end_transaction``."""
        return await transactions.end_transaction(self._cluster, txn_id, commit, retry_timeout_ms)

    # ------------------------------------------------------------------ subscriptions

    async def create_subscription(
        self,
        topic: str,
        name: str,
        config: SubscriptionConfig | None = None,
        *,
        start: str | int = "earliest",
        if_not_exists: bool = False,
    ) -> None:
        """Create a subscription on every partition of ``topic``: ``Subscriptions.create``."""
        await self._subscriptions.create(topic, name, config, start=start, if_not_exists=if_not_exists)

    async def delete_subscription(self, topic: str, name: str) -> None:
        """Delete the subscription from every partition: ``Subscriptions.delete``."""
        await self._subscriptions.delete(topic, name)

    async def seek_subscription(self, topic: str, name: str, to: str | int) -> dict[int, int]:
        """Move the subscription's cursors: ``Subscriptions.seek``."""
        return await self._subscriptions.seek(topic, name, to)

    async def describe_subscription(self, topic: str, name: str | None = None) -> list[SubscriptionPartitionInfo]:
        """Cursor, backlog and counts per partition: ``Subscriptions.describe``."""
        return await self._subscriptions.describe(topic, name)

    async def list_subscriptions(self, topic: str | None = None) -> dict[str, list[str]]:
        """Topic -> the names of its subscriptions (of ``topic`` only, if given)."""
        topics = [topic] if topic is not None else [t.name for t in await self.list_topics()]
        return await self._subscriptions.names(topics, keep_empty=topic is not None)

    # ------------------------------------------------------------------ topics

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        replication_factor: int = 0,
    ) -> None:
        """Create a topic: ``Topics.create``."""
        await self._topics.create(name, partitions, config, replication_factor)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic: ``Topics.delete``."""
        await self._topics.delete(name)

    async def alter_topic_config(
        self,
        name: str,
        config: dict[str, str] | None = None,
        *,
        delete: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set and drop a topic's config overrides: ``Topics.alter_config``."""
        await self._topics.alter_config(name, config, delete=delete, validate_only=validate_only)

    async def add_partitions(
        self, name: str, *, total: int | None = None, count: int | None = None, validate_only: bool = False
    ) -> int:
        """Grow a topic and its subscriptions: ``Topics.add_partitions``."""
        return await self._topics.add_partitions(name, total=total, count=count, validate_only=validate_only)

    async def list_topics(self, include_internal: bool = False) -> list[TopicMetadata]:
        """Metadata of every topic: ``Topics.listing``."""
        return await self._topics.listing(include_internal)

    async def describe_topic(self, name: str) -> TopicDescription:
        """Config, replication and log state of a topic: ``Topics.describe``."""
        return await self._topics.describe(name)

    async def list_offsets(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        timestamp: int = messages.LATEST,
    ) -> dict[int, int]:
        """Offsets of a topic's partitions at ``timestamp``: ``Topics.list_offsets``."""
        return await self._topics.list_offsets(topic, partitions, timestamp)

    # ------------------------------------------------------------------ cluster

    async def cluster_status(self, probe_timeout_ms: float = PROBE_TIMEOUT_MS) -> ClusterStatus:
        """Brokers, controller, partitions in trouble, each broker probed: ``ClusterAdmin.status``."""
        return await self._cluster_admin.status(probe_timeout_ms)

    async def elect_leaders(self, topics: Iterable[str] | None = None) -> list[ElectionResult]:
        """Give every partition of ``topics`` (None: of all topics) that has no live leader
        one, where a replica is eligible (alive and in sync, or alive when the topic allows
        unclean elections), then move the leadership of every partition back to its
        preferred replica, the first of its replicas, where that one is alive and in sync.

        Returns the partitions whose leader changed (``error`` 0, ``leader`` the new one)
        or could not (``error`` and ``message`` say why: ``ELIGIBLE_LEADERS_NOT_AVAILABLE``
        for a partition left without a leader; ``errors.error_for_code`` turns them into
        the exception), by topic and partition.  Partitions already led by their preferred
        replica are not listed: an empty list means nothing had to move.
        Raises ``UnsupportedVersion`` when the broker does not serve leader election (an
        older broker).
        """
        return (await self.rebalance(topics, reassign=False)).elections

    async def rebalance(self, topics: Iterable[str] | None = None, *, reassign: bool = True) -> Rebalance:
        """Replace dead replicas, even out replicas, elect leaders: ``ClusterAdmin.rebalance``."""
        return await self._cluster_admin.rebalance(topics, reassign=reassign)

    # ------------------------------------------------------------------ consumer groups

    async def list_groups(self) -> list[GroupListing]:
        """Every group with committed offsets, with its lag: ``Groups.listing``."""
        return await self._groups.listing()

    async def describe_group(self, group: str) -> GroupDescription:
        """Committed offsets, log state and lag per partition: ``Groups.describe``."""
        return await self._groups.describe(group)

    async def delete_group(self, group: str) -> None:
        """Delete a group's committed offsets: ``Groups.delete``."""
        await self._groups.delete(group)

    async def reset_group_offsets(
        self,
        group: str,
        topic: str,
        *,
        to: str | int | datetime | None = None,
        shift_by: int | None = None,
        partitions: Iterable[int] | None = None,
        dry_run: bool = False,
    ) -> list[OffsetReset]:
        """Move a group's committed offsets of a topic: ``Groups.reset_offsets``."""
        return await self._groups.reset_offsets(
            group, topic, to=to, shift_by=shift_by, partitions=partitions, dry_run=dry_run
        )
