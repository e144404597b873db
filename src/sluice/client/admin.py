"""Administration: topics (create, delete, list, describe, alter config, add partitions,
list offsets), consumer groups (list, describe, delete, reset offsets) and the cluster
(status, preferred-leader election).

Thin: each method is one request to a broker (the controller when metadata names one), or
a few for offset resets, and turns per-topic or per-partition error codes into exceptions
with ``errors.raise_for_code``.  Group requests go to the group's coordinator (the leader of
its ``__groups`` partition) and are retried on ``NOT_COORDINATOR`` within the request
timeout; ``list_groups`` asks every live broker.  Belongs to one event loop;
``client.sync.SyncAdmin`` is the blocking twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from sluice import errors
from sluice.client.config import position
from sluice.client.status import ClusterStatus
from sluice.client.transport import Cluster, Connection, ConnectionFactory
from sluice.config import MAX_PARTITIONS
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

log = logging.getLogger(__name__)

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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PROBE_TIMEOUT_MS = 1000  # cluster_status: a live broker that does not answer within this is shown so


def _raise_first(results) -> None:
    """Raise the error of the first failed per-topic or per-group result, if any."""
    for r in results:
        errors.raise_for_code(r.error, r.message or r.name)


def _check_coordinator(resp) -> None:
    """Raise a group result's ``NotCoordinator`` (retried); other errors are the caller's."""
    for g in resp.groups:
        if g.error == errors.NotCoordinator.code:
            errors.raise_for_code(g.error, g.message or g.name)


def _raise_partition_errors(resp) -> None:
    for r in resp.partitions:
        errors.raise_for_code(r.error, r.message)


def _with_log(p: messages.GroupPartition, logs: dict) -> messages.GroupPartition:
    """``p`` with its leader's log start and high watermark from ``logs`` (-1 when not
    there: unknown) and the lag they give."""
    if p.error:
        return p
    start, hw = logs.get((p.topic, p.partition), (-1, -1))
    return msgspec.structs.replace(p, log_start_offset=start, high_watermark=hw, lag=_lag(p, logs))


def _lag(p: messages.GroupPartition, logs: dict) -> int:
    """Leader's high watermark minus the committed offset, at least 0; -1 when either is
    unknown."""
    _, hw = logs.get((p.topic, p.partition), (-1, -1))
    return max(hw - p.committed_offset, 0) if hw >= 0 and p.committed_offset >= 0 else -1


@dataclass(frozen=True)
class OffsetReset:
    """One partition of an offset reset: the group's committed offset before and after."""

    topic: str
    partition: int
    old: int | None  # None: the group had committed nothing for this partition
    new: int


@dataclass(frozen=True)
class Rebalance:
    """What ``Admin.rebalance`` changed: replicas replaced or moving (``moves``, each with
    ``error`` 0; ``pending`` for moves onto brokers holding fewer, done in two phases) or
    not (an error), then leaders moved or not (``elections``), by topic and partition."""

    moves: list[ReplicaMove]
    elections: list[ElectionResult]


class Admin:
    """Administrative requests against a cluster."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: float = 30000,
        connect_timeout_ms: float = 10000,
        connection_factory: ConnectionFactory | None = None,
    ) -> None:
        self._factory = connection_factory  # also for the probes of cluster_status
        self._cluster = Cluster(
            bootstrap,
            connection_factory=connection_factory,
            connect_timeout=connect_timeout_ms / 1000,
            request_timeout=request_timeout_ms / 1000,
        )

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
        return (await self._cluster.request(request))[0]

    # ------------------------------------------------------------------ transactions

    async def list_transactions(
        self, topics: Iterable[str] | None = None, delayed: bool = False
    ) -> list[messages.TransactionInfo]:
        """Unresolved half messages, oldest first: each broker answers for the partitions
        it leads, so every broker of the cluster is asked.  ``delayed=True``: the pending
        delayed messages instead (one entry per stored batch, ``count`` messages due at
        ``deliver_at``), soonest due first; ``end_transaction`` on one's id delivers it
        now (commit) or cancels it (rollback)."""
        resp = await self._cluster.refresh(None if topics is None else list(topics))
        for t in resp.topics if topics is not None else ():
            errors.raise_for_code(t.error, t.message or t.name)
        request = messages.ListTransactionsRequest(topics=None if topics is None else list(topics), delayed=delayed)
        out: list[messages.TransactionInfo] = []
        for node in sorted(self._cluster.brokers):
            conn = await self._cluster.connection(node)
            response, _ = await conn.request(request, (), self._cluster.request_timeout)
            out += response.transactions
        seen, unique = set(), []
        for t in sorted(out, key=lambda t: (t.deliver_at, t.timestamp, t.topic, t.partition, t.offset)):
            if (t.topic, t.partition, t.offset) not in seen:  # a leader moving while asked
                seen.add((t.topic, t.partition, t.offset))
                unique.append(t)
        return unique

    async def end_transaction(self, txn_id: str, commit: bool, retry_timeout_ms: float = 10_000):
        """Commit or roll back the half message ``topic/partition/offset`` at its leader (see
        ``TransactionProducer.end_transaction``); ``ConfigError`` for a malformed id."""
        from sluice.client.transaction import end_transaction, parse_id

        try:
            topic, partition, offset = parse_id(txn_id)
        except ValueError as exc:
            raise errors.ConfigError(str(exc)) from None
        return await end_transaction(
            self._cluster, topic, partition, offset, commit, retry_timeout_ms / 1000, self._cluster.request_timeout
        )

    async def _leaders(self, topic: str, partitions: Iterable[int]) -> dict[int, list[int]]:
        """Partitions of ``topic`` by their leader, from fresh metadata (``NotLeader`` for
        a partition with no leader now)."""
        resp = await self._cluster.refresh([topic])
        for t in resp.topics:
            errors.raise_for_code(t.error, t.message or topic)
        count = self._cluster.topic(topic).partitions
        out: dict[int, list[int]] = {}
        for p in partitions:
            if not 0 <= p < count:
                raise errors.unknown_partition(topic, p, count)
            node = self._cluster.leader(topic, p)
            if node < 0:
                raise errors.NotLeader(f"{topic}-{p} has no leader now; retry")
            out.setdefault(node, []).append(p)
        return out

    async def _to_leaders(
        self, topic: str, partitions: Iterable[int], make, results, *, skip_unreachable: bool = False
    ) -> list:
        """Send ``make(partitions)`` to each leader of ``topic``'s ``partitions`` and return
        the results (``results(response)``) of all; asks again, with fresh metadata, for
        partitions whose leader moved meanwhile (a few times).  ``skip_unreachable``: a
        leader that cannot be reached (down, its death not noticed yet) gives no results
        instead of failing the call."""
        todo, out = list(partitions), []
        for attempt in range(5):
            moved = []
            for node, group in (await self._leaders(topic, todo)).items():
                try:
                    conn = await self._cluster.connection(node)
                    resp, _ = await conn.request(make(group), timeout=self._cluster.request_timeout)
                except (errors.ConnectionClosed, errors.RequestTimedOut):
                    if not skip_unreachable:
                        raise
                    continue
                for r in results(resp):
                    if getattr(r, "error", 0) == errors.NotLeader.code and attempt < 4:
                        moved.append(r.partition)
                    else:
                        out.append(r)
            if not moved:
                return out
            todo = moved
            await asyncio.sleep(0.1 * (attempt + 1))
        return out
    # ------------------------------------------------------------------ subscriptions

    async def _each_partition(self, topic: str, make, results, partitions: Iterable[int] | None = None) -> list:
        """``make(partitions)`` at each leader of ``partitions`` of ``topic`` (default:
        every one); the per-partition results, the first error raised."""
        if partitions is None:
            partitions = await self._partitions(topic)
        out = await self._to_leaders(topic, partitions, make, results)
        for r in out:
            errors.raise_for_code(r.error, r.message)
        return out

    async def create_subscription(
        self,
        topic: str,
        name: str,
        config: SubscriptionConfig | None = None,
        *,
        start: str | int = "earliest",
        if_not_exists: bool = False,
    ) -> None:
        """Create subscription ``name`` on every partition of ``topic``, its cursor at
        ``start`` (``earliest``, ``latest``, an offset, ``time:<ms since the epoch>``).
        ``SubscriptionAlreadyExists`` unless ``if_not_exists``."""
        cfg = config or SubscriptionConfig()
        await self._each_partition(topic, lambda group: messages.CreateSubscriptionRequest(
            topic=topic, subscription=name, partitions=group, config=cfg, start=position(start),
            if_not_exists=if_not_exists,
        ), lambda resp: resp.partitions)

    async def delete_subscription(self, topic: str, name: str) -> None:
        """Delete the subscription from every partition (its consumers are told)."""
        await self._each_partition(topic, lambda group: messages.DeleteSubscriptionRequest(
            topic=topic, subscription=name, partitions=group,
        ), lambda resp: resp.partitions)

    async def seek_subscription(self, topic: str, name: str, to: str | int) -> dict[int, int]:
        """Move the subscription's cursor on every partition to ``to`` (``earliest``,
        ``latest``, an offset, ``time:<ms>``): replay from there, or skip to there.  An
        offset outside a partition's log goes to its nearest end.  Returns partition ->
        the offset its cursor went to."""
        results = await self._each_partition(topic, lambda group: messages.SeekSubscriptionRequest(
            topic=topic, subscription=name, partitions=group, position=position(to),
        ), lambda resp: resp.partitions)
        return {r.partition: r.offset for r in sorted(results, key=lambda r: r.partition)}

    async def describe_subscription(self, topic: str, name: str | None = None) -> list[SubscriptionPartitionInfo]:
        """Per partition (and subscription, when ``name`` is None): the cursor, backlog,
        in flight, retrying and dead-lettered counts; sorted by subscription, partition."""
        infos = await self._each_partition(topic, lambda group: messages.DescribeSubscriptionsRequest(
            topic=topic, partitions=group, subscription=name,
        ), lambda resp: resp.subscriptions)
        return sorted(infos, key=lambda i: (i.subscription, i.partition))

    async def list_subscriptions(self, topic: str | None = None) -> dict[str, list[str]]:
        """Topic -> the names of its subscriptions (of ``topic`` only, if given)."""
        topics = [topic] if topic is not None else [t.name for t in await self.list_topics()]
        out = {}
        for t in topics:
            names = sorted({i.subscription for i in await self.describe_subscription(t)})
            if names or topic is not None:
                out[t] = names
        return out

    async def _group_request(self, group: str, request, check: Callable[[object], None] | None = None):
        """``request`` to ``group``'s coordinator; ``NotCoordinator`` is retried (with fresh
        metadata, backoff 0.1 s doubling to 1 s) until the request timeout has passed."""
        deadline = time.monotonic() + self._cluster.request_timeout
        delay = 0.1
        while True:
            try:
                return await self._cluster.coordinator_request(group, request, check)
            except errors.NotCoordinator:
                if time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        replication_factor: int = 0,
    ) -> None:
        """Create a topic of ``partitions`` partitions with ``replication_factor`` replicas
        each (0: the broker's default).

        Raises ``TopicAlreadyExists``, ``InvalidTopicName``, ``InvalidPartitions``,
        ``InvalidReplicationFactor`` (more replicas than live brokers), ``InvalidConfig``.
        """
        for what, value in (("partitions", partitions), ("replication_factor", replication_factor)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise errors.ConfigError(f"{what} must be an int, got {value!r}")
        # the ranges are the broker's to check: it answers INVALID_PARTITIONS and
        # INVALID_REPLICATION_FACTOR, knowing how many brokers are alive
        cfg = {str(k): str(v) for k, v in (config or {}).items()}
        topic = messages.NewTopic(
            name=name, partitions=partitions, config=cfg, replication_factor=replication_factor
        )
        resp = await self._request(messages.CreateTopicsRequest(topics=[topic]))
        _raise_first(resp.topics)

    async def delete_topic(self, name: str) -> None:
        resp = await self._request(messages.DeleteTopicsRequest(names=[name]))
        _raise_first(resp.topics)

    async def alter_topic_config(
        self,
        name: str,
        config: dict[str, str] | None = None,
        *,
        delete: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set the overrides in ``config`` and drop those named in ``delete`` (back to the
        broker's default) for topic ``name``.

        All or nothing, durable, and in effect on the running broker at once: produce
        checks the new ``max.message.bytes``, the next write follows the new flush policy,
        the next retention pass and segment roll the new limits.  Overrides not named stay
        as they are.  ``validate_only``: check everything, change nothing.  Raises
        ``UnknownTopic``, ``InvalidConfig`` (unknown key, bad value, a key both set and
        deleted).
        """
        change = messages.TopicConfigChange(
            name=name, config={str(k): str(v) for k, v in (config or {}).items()}, delete=list(delete)
        )
        req = messages.AlterTopicConfigsRequest(topics=[change], validate_only=validate_only)
        resp = await self._request(req)
        _raise_first(resp.topics)

    async def add_partitions(
        self, name: str, *, total: int | None = None, count: int | None = None, validate_only: bool = False
    ) -> int:
        """Grow topic ``name`` to ``total`` partitions, or by ``count``: give exactly one.

        Returns the new partition count.  New partitions start empty; existing ones keep
        their data, so keys hashed to a partition may map to another one from now on.
        Producers and subscribed consumers pick the new partitions up with their next
        metadata refresh.  Every subscription of the topic is extended to the new
        partitions, from their start, with its own settings (one that cannot be within
        the request timeout, its leaders away, is logged; a running Subscriber of it
        extends it when it sees them): this call may take that long.
        Durable; partitions are never removed.  Raises ``InvalidPartitions`` unless the
        new total is above the current one (and within the broker's limits),
        ``UnknownTopic``.  ``validate_only``: check, change nothing.
        """
        if (total is None) == (count is None):
            raise errors.ConfigError("give exactly one of total= and count=")
        for value in (total, count):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise errors.ConfigError(f"partition counts are ints, got {value!r}")
        if count is not None and count < 1:
            raise errors.InvalidPartitions(f"partitions to add must be at least 1, got {count}")
        before = len(await self._partitions(name))
        if total is None:
            if before + count > MAX_PARTITIONS:  # say what was given, not the total it makes
                raise errors.InvalidPartitions(
                    f"topic {name!r} has {before} partitions and may have {MAX_PARTITIONS}: "
                    f"at most {max(MAX_PARTITIONS - before, 0)} more, not {count}"
                )
            total = before + count
        req = messages.CreatePartitionsRequest(
            topics=[messages.PartitionsIncrease(name=name, total=total)], validate_only=validate_only
        )
        resp = await self._request(req)
        _raise_first(resp.topics)
        if not validate_only:
            try:
                await self._extend_subscriptions(name, before, total)
            except errors.SluiceError as exc:  # the subscriptions could not be listed
                log.warning("subscriptions of %s not extended to its new partitions yet: %s", name, exc)
        return total

    async def _extend_subscriptions(self, topic: str, before: int, total: int) -> None:
        """Create every subscription of ``topic``'s first ``before`` partitions on the
        partitions ``before..total-1``, from their start, with its settings (those of the
        lowest partition that has it).  Retried while the new partitions get leaders."""
        infos = await self._to_leaders(topic, range(before), lambda group: messages.DescribeSubscriptionsRequest(
            topic=topic, partitions=group,
        ), lambda resp: resp.subscriptions)
        configs: dict[str, SubscriptionConfig] = {}
        for i in sorted(infos, key=lambda i: i.partition):
            if not i.error:
                configs.setdefault(i.subscription, i.config)
        deadline = time.monotonic() + self._cluster.request_timeout
        for name, cfg in sorted(configs.items()):
            while True:
                try:
                    await self._each_partition(topic, lambda group, name=name, cfg=cfg: (
                        messages.CreateSubscriptionRequest(
                            topic=topic, subscription=name, partitions=group, config=cfg,
                            start=position("earliest"), if_not_exists=True,
                        )
                    ), lambda resp: resp.partitions, range(before, total))
                    break
                except errors.SluiceError as exc:  # UnknownPartition: metadata without them yet
                    again = exc.retriable or isinstance(exc, errors.UnknownPartition)
                    if not again or time.monotonic() > deadline:
                        log.warning("subscription %s of %s not extended to its new partitions yet: %s",
                                    name, topic, exc)
                        break
                    await asyncio.sleep(0.1)

    async def list_topics(self, include_internal: bool = False) -> list[TopicMetadata]:
        """Metadata of every topic (partition leaders, replicas, max message bytes); the
        internal topics (``__groups``: state written by brokers) only with
        ``include_internal``."""
        resp = await self._request(messages.MetadataRequest(topics=None))
        return [t for t in resp.topics if include_internal or not t.internal]

    async def describe_topic(self, name: str) -> TopicDescription:
        """Config, replication factor and, per partition, the replication state (leader,
        replicas, ISR, leader epoch) and log state (log start, high watermark, log end,
        size, segments) of a topic, the log state from each partition's leader: -1 where
        that leader could not be reached."""
        resp = await self._request(messages.DescribeTopicsRequest(names=[name]))
        for t in resp.topics:
            if t.name == name:
                errors.raise_for_code(t.error, t.message or name)
                return await self._with_leaders_view(t)
        raise errors.UnknownTopic(name)

    async def _with_leaders_view(self, t: TopicDescription) -> TopicDescription:
        """``t`` with each partition's log state as its leader sees it (the answering
        broker fills only the partitions it leads)."""
        others = [p.partition for p in t.partitions if p.log_end_offset < 0 and p.leader >= 0]
        if not others:
            return t

        def results(resp):
            [d] = resp.topics  # a leader that has not seen the topic yet: -1 stays
            return [p for p in d.partitions if p.partition in wanted] if not d.error else []

        wanted = set(others)
        found = await self._to_leaders(  # an unreachable leader's partitions keep -1
            t.name, others, lambda _: messages.DescribeTopicsRequest(names=[t.name]), results,
            skip_unreachable=True,
        )
        by_index = {p.partition: p for p in found if p.log_end_offset >= 0}
        return msgspec.structs.replace(
            t, partitions=[by_index.get(p.partition, p) for p in t.partitions]
        )

    async def list_offsets(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        timestamp: int = messages.LATEST,
    ) -> dict[int, int]:
        """Offsets of ``topic``'s partitions (all by default) at ``timestamp``.

        ``messages.LATEST`` (-1): the next offset to be written; ``messages.EARLIEST`` (-2):
        the first offset kept; a time in ms: the first offset with a timestamp >= it (-1 if
        none).  Returns {partition: offset}.
        """
        if partitions is None:
            partitions = await self._partitions(topic)

        def request(group):
            return messages.ListOffsetsRequest(partitions=[
                messages.ListOffsetsPartition(topic=topic, partition=p, timestamp=timestamp) for p in group
            ])

        out = {}
        for r in await self._to_leaders(topic, partitions, request, lambda resp: resp.partitions):
            errors.raise_for_code(r.error, r.message)
            out[r.partition] = r.offset
        return out

    async def _partitions(self, topic: str) -> list[int]:
        """The partition numbers of ``topic``; ``UnknownTopic`` if there is no such topic."""
        resp = await self._request(messages.MetadataRequest(topics=[topic]))
        for t in resp.topics:
            errors.raise_for_code(t.error, t.message or topic)
        return sorted(p.partition for t in resp.topics for p in t.partitions)

    # ------------------------------------------------------------------ cluster

    async def cluster_status(self, probe_timeout_ms: float = PROBE_TIMEOUT_MS) -> ClusterStatus:
        """The live brokers, the controller, and the under-replicated and offline
        partitions of every topic, from one metadata request (see ``client.status``); then
        each broker listed as alive is asked directly, on a connection of its own, within
        ``probe_timeout_ms`` (0: not asked): one that died or is paused stays listed until
        its registration lapses, and is shown as not answering (``BrokerStatus.no_answer``)."""
        resp = await self._request(messages.MetadataRequest(topics=None))
        status = ClusterStatus.from_metadata(resp)
        if probe_timeout_ms <= 0 or not resp.brokers:
            return status
        timeout = probe_timeout_ms / 1000
        reasons = await asyncio.gather(*(self._probe(b.host, b.port, timeout) for b in resp.brokers))
        return status.with_probes({b.node_id: why for b, why in zip(resp.brokers, reasons, strict=True) if why})

    async def _probe(self, host: str, port: int, timeout: float) -> str:
        """Why the broker at ``host:port`` did not answer a metadata request (for no topic)
        on a new connection within ``timeout`` seconds, connecting included; ``""`` when it
        did."""
        conn = None
        try:
            async with asyncio.timeout(timeout):
                if self._factory is not None:
                    conn = await self._factory(host, port)
                else:
                    conn = await Connection.open(host, port, connect_timeout=timeout, handshake_timeout=timeout)
                await conn.request(messages.MetadataRequest(topics=[]), timeout=timeout)
        except TimeoutError:
            return f"no answer within {timeout:g} s"
        except errors.SluiceError as exc:
            return str(exc)
        finally:
            if conn is not None:
                conn.close()
        return ""

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
        """With ``reassign``, first replace the replicas of brokers that are not alive in
        every partition of ``topics`` (None: all topics) that has a live leader: each by
        the least loaded live broker not yet holding the partition (the new replica copies
        it from the leader and joins the ISR once caught up; the dead broker drops its copy
        when it comes back).  Then, where live brokers hold uneven numbers of replicas (a
        broker joined), record moves that even them out (``pending`` moves: the new
        replica is added, the old one dropped by the controller once the new one is in
        sync).  Then give partitions without a live leader one, and move leadership back
        to preferred replicas, as ``elect_leaders`` does.

        A broker older than replica reassignment ignores ``reassign``: ``moves`` is then
        empty.  Raises ``UnsupportedVersion`` when the broker does not serve leader
        election at all.
        """
        req = messages.ElectLeadersRequest(
            topics=None if topics is None else sorted(set(topics)), reassign=reassign
        )
        try:
            resp = await self._request(req)
        except errors.UnsupportedVersion as exc:
            raise errors.UnsupportedVersion(
                f"the broker does not support leader election (ELECT_LEADERS): upgrade the "
                f"brokers ({exc.message})"
            ) from exc
        return Rebalance(
            moves=sorted(resp.moves, key=lambda r: (r.topic, r.partition)),
            elections=sorted(resp.partitions, key=lambda r: (r.topic, r.partition)),
        )

    # ------------------------------------------------------------------ consumer groups
    #
    # A group is the offsets committed under its name; the broker has no membership
    # protocol, so it cannot tell whether a consumer of the group is running.

    async def list_groups(self) -> list[GroupListing]:
        """Every group with committed offsets: its topics, partitions, total lag and the
        time of its latest commit, by name.  Every live broker is asked for the groups it
        coordinates (a broker that cannot be reached fails the call: a partial list would
        mislead); a group two brokers list while its coordinator moves is listed once.

        The lag is summed over the group's committed partitions from each partition's
        leader (see ``describe_group``), whichever broker coordinates the group; a
        partition with no reachable leader now adds nothing, and is counted in
        ``lag_unknown``.  That costs one DESCRIBE_GROUPS per coordinator and one
        LIST_OFFSETS per partition leader."""
        await self._cluster.refresh([])
        found: dict[str, tuple[int, GroupListing]] = {}  # name -> (its coordinator, listing)
        for node in sorted(self._cluster.brokers):
            conn = await self._cluster.connection(node)
            resp, _ = await conn.request(messages.ListGroupsRequest(), (), self._cluster.request_timeout)
            for g in resp.groups:
                if g.name not in found or g.last_commit_ms > found[g.name][1].last_commit_ms:
                    found[g.name] = (node, g)
        by_node: dict[int, list[str]] = {}
        for name, (node, _) in found.items():
            by_node.setdefault(node, []).append(name)
        described: dict[str, GroupDescription] = {}
        for node, names in sorted(by_node.items()):
            conn = await self._cluster.connection(node)
            req = messages.DescribeGroupsRequest(names=sorted(names))
            resp, _ = await conn.request(req, (), self._cluster.request_timeout)
            for d in resp.groups:
                if d.error == errors.NotCoordinator.code:  # it moved since: ask its new coordinator
                    with contextlib.suppress(errors.UnknownGroup):
                        described[d.name] = await self._group_description(d.name)
                elif d.error != errors.UnknownGroup.code:  # else deleted since it was listed
                    errors.raise_for_code(d.error, d.message or d.name)
                    described[d.name] = d
        committed = {
            (p.topic, p.partition) for d in described.values() for p in d.partitions if p.committed_offset >= 0
        }
        logs = await self._log_offsets(committed)
        out = []
        for name in sorted(described):
            lags = [_lag(p, logs) for p in described[name].partitions if not p.error and p.committed_offset >= 0]
            out.append(msgspec.structs.replace(
                found[name][1], lag=sum(lag for lag in lags if lag > 0), lag_unknown=lags.count(-1)
            ))
        return out

    async def describe_group(self, group: str) -> GroupDescription:
        """Per partition of every topic ``group`` committed to: the committed offset (-1 if
        none), log start, high watermark, lag, when the last commit came and from which
        client address.  ``UnknownGroup`` if the group has no committed offsets.

        The committed offsets come from the group's coordinator; log start and high
        watermark from each partition's leader (one LIST_OFFSETS per leader), whichever
        broker coordinates the group.  They are -1 where the partition has no leader now
        (or its leader cannot be reached); the lag is -1 there and where nothing is
        committed."""
        d = await self._group_description(group)
        logs = await self._log_offsets((p.topic, p.partition) for p in d.partitions if not p.error)
        return msgspec.structs.replace(d, partitions=[_with_log(p, logs) for p in d.partitions])

    async def _group_description(self, group: str) -> GroupDescription:
        """``group`` as its coordinator describes it (the log state of only the partitions
        it holds a replica of)."""
        resp = await self._group_request(group, messages.DescribeGroupsRequest(names=[group]), _check_coordinator)
        for g in resp.groups:
            if g.name == group:
                errors.raise_for_code(g.error, g.message or group)
                return g
        raise errors.UnknownGroup(group)

    async def _log_offsets(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(log start, high watermark) of each (topic, partition) of ``keys`` as its leader
        has them now, from fresh metadata: one LIST_OFFSETS request per leader, all sent at
        once.  Partitions whose leader moved meanwhile are asked again (a few times).  A
        partition with no leader now, or whose leader cannot be reached or answers with
        another error, is left out: its log state is unknown."""
        todo, out = sorted(set(keys)), {}
        for attempt in range(3):
            if not todo:
                break
            if attempt:
                await asyncio.sleep(0.1 * attempt)
            await self._cluster.refresh(sorted({t for t, _ in todo}))
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for t, p in todo:
                node = self._cluster.leader(t, p)
                if node >= 0:
                    by_leader.setdefault(node, []).append((t, p))
            answers = await asyncio.gather(*(self._log_offsets_at(n, parts) for n, parts in by_leader.items()))
            moved = []
            for found, not_leader in answers:
                out.update(found)
                moved += not_leader
            todo = moved
        return out

    async def _log_offsets_at(self, node: int, keys: list[tuple[str, int]]):
        """``_log_offsets`` of one leader: ({(topic, partition): (log start, high
        watermark)}, the partitions it no longer leads); nothing if it cannot be reached."""
        asked = [
            messages.ListOffsetsPartition(topic=t, partition=p, timestamp=ts)
            for t, p in keys for ts in (messages.EARLIEST, messages.LATEST)
        ]
        try:
            conn = await self._cluster.connection(node)
            resp, _ = await conn.request(messages.ListOffsetsRequest(partitions=asked), (), self._cluster.request_timeout)
        except (errors.ConnectionClosed, errors.RequestTimedOut, errors.NotLeader):
            self._cluster.node_failed(node)
            return {}, []
        found: dict[tuple[str, int], list[int]] = {}
        not_leader = set()
        for a, r in zip(asked, resp.partitions, strict=False):  # answered in the order asked
            key = (a.topic, a.partition)
            if (r.topic, r.partition) != key:
                break
            if r.error == errors.NotLeader.code:
                not_leader.add(key)
            elif not r.error:
                found.setdefault(key, []).append(r.offset)
        return {k: (v[0], v[1]) for k, v in found.items() if len(v) == 2}, sorted(not_leader)

    async def delete_group(self, group: str) -> None:
        """Delete ``group``'s committed offsets, durably; ``UnknownGroup`` if it has none.

        Nothing stops a consumer of the group that is still running: its next commit
        creates the group again.
        """
        resp = await self._group_request(group, messages.DeleteGroupsRequest(names=[group]), _check_coordinator)
        _raise_first(resp.groups)

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
        """Move ``group``'s committed offsets of ``topic`` (all its partitions, or
        ``partitions``); return the old and new offset of each partition, by partition.

        Exactly one of ``to`` and ``shift_by``.  ``to``: ``"earliest"`` (the log start),
        ``"latest"`` (the high watermark), an ``int`` offset, or a ``datetime`` (the first
        offset with a timestamp at or after it, else the high watermark; a naive datetime
        is UTC).  ``shift_by``: the committed offset plus N (negative: back); every
        partition must have one, else ``InvalidRequest``.  New offsets are clamped to
        ``[log start, high watermark]``.  All partitions are committed in one request; a
        group that does not exist yet is created.  ``dry_run``: compute, commit nothing.

        There is no membership to check: a consumer of the group that is running keeps its
        own positions and overwrites the reset with its next commit.  Stop it first.
        """
        if (to is None) == (shift_by is None):
            raise errors.ConfigError("give exactly one of to= and shift_by=")
        if to is not None and not (
            to in ("earliest", "latest") or isinstance(to, datetime)
            or (isinstance(to, int) and not isinstance(to, bool) and to >= 0)
        ):
            raise errors.ConfigError(f"to= takes 'earliest', 'latest', an offset >= 0 or a datetime, got {to!r}")
        if shift_by is not None and (not isinstance(shift_by, int) or isinstance(shift_by, bool)):
            raise errors.ConfigError(f"shift_by= takes an int, got {shift_by!r}")
        parts = await self._partitions(topic) if partitions is None else sorted(set(partitions))
        earliest = await self.list_offsets(topic, parts, messages.EARLIEST)
        latest = await self.list_offsets(topic, parts, messages.LATEST)
        committed = await self._committed(group, topic, parts)
        if shift_by is not None:
            missing = [p for p in parts if committed[p] is None]
            if missing:
                raise errors.InvalidRequest(
                    f"group {group!r} has no committed offset to shift for {topic} partition(s) "
                    f"{', '.join(map(str, missing))}"
                )
            target = {p: committed[p] + shift_by for p in parts}
        elif to == "earliest":
            target = earliest
        elif to == "latest":
            target = latest
        elif isinstance(to, datetime):
            when = to if to.tzinfo is not None else to.replace(tzinfo=UTC)
            target = await self.list_offsets(topic, parts, (when - _EPOCH) // timedelta(milliseconds=1))
        else:
            target = dict.fromkeys(parts, to)
        resets = [
            OffsetReset(topic, p, committed[p], min(max(target[p], earliest[p]), latest[p])) for p in parts
        ]
        if not dry_run and resets:
            req = messages.OffsetCommitRequest(
                group=group,
                offsets=[messages.CommitOffset(topic=topic, partition=r.partition, offset=r.new) for r in resets],
            )
            await self._group_request(group, req, _raise_partition_errors)
        return resets

    async def _committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        req = messages.OffsetFetchRequest(
            group=group, partitions=[messages.TopicPartition(topic=topic, partition=p) for p in partitions]
        )
        out: dict[int, int | None] = dict.fromkeys(partitions)
        for r in (await self._group_request(group, req)).offsets:
            errors.raise_for_code(r.error)
            out[r.partition] = r.offset if r.offset >= 0 else None
        return out

