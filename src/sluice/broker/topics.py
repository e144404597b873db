"""The topic service: the topic admin APIs (metadata, create, delete, describe, alter
config, add partitions) and the lifecycle of topics they start.

Changes run one at a time under the broker's admin lock, each all or nothing.  A new
topic's replicas are spread over the live brokers (cluster/assignment.py); the creating
broker opens the partitions it holds (broker/registry.py) before the topic is recorded,
and takes their roles at once; the others open theirs when the metadata store tells them
(broker/replication/states.py).  A deleted topic is forgotten here, whoever deleted it
(``forget_topic``: replication calls it when the store reports the deletion).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Protocol

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.produce import PRODUCED_INTERNAL
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.results import error_fields
from sluice.cluster.assignment import assign_replicas
from sluice.cluster.store import (
    MetadataStore,
    PartitionState,
    TopicRecord,
    initial_states,
    unknown_topic,
)
from sluice.config import ServerConfig, TopicConfig, check_partitions, check_topic_name
from sluice.errors import (
    BrokerError,
    BrokerShuttingDown,
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidRequest,
    MetadataUnavailable,
    TopicAlreadyExists,
    storage_error_from_os,
)
from sluice.protocol import messages as m

log = logging.getLogger("sluice.broker")


INTERNAL_REPLICAS = 3  # a cluster's internal topics' factor (unless --replication-factor says)
KEEPING_CONFIGS = frozenset({"cleanup.policy", "retention.ms", "retention.bytes"})


def _check_min_insync(config: TopicConfig, factor: int, name: str) -> None:
    """A topic whose ``min.insync.replicas`` exceeds its replicas could never take an
    ``acks=all`` write: refused when it is created or altered, not at every produce."""
    if config.min_insync_replicas > factor:
        raise InvalidConfig(
            f"min.insync.replicas={config.min_insync_replicas} for topic {name!r}: it has "
            f"{factor} replica(s)"
        )


def _check_not_internal(topic: Topic, change: str) -> None:
    if topic.internal:
        raise InvalidRequest(f"topic {topic.name} is internal: it cannot be {change}")


class Roles(Protocol):
    """What the topic service asks of replication (broker/replication/): the role of a
    partition held here follows its state."""

    def become(self, topic: Topic, index: int, state: PartitionState) -> None: ...

    def unfollow(self, part: Partition) -> None: ...


class TopicSubscriptions(Protocol):
    """What the topic service asks of the subscriptions (broker/subscriptions/)."""

    async def names(self, topic: str) -> set[str]: ...

    async def forget_topic(self, topic: str) -> None: ...


class TopicService:
    """METADATA, CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_TOPICS, ALTER_TOPIC_CONFIGS,
    CREATE_PARTITIONS; ``create_topic`` for the broker's internal topics; ``forget_topic``.
    Event loop only.

    Collaborators: ``config``, the server's (node id, replication factors, cluster);
    ``registry``, the topics and partitions held here; ``view``, the live brokers,
    controller, store state and whether the broker stops; ``store``, the metadata store
    topics are recorded in; ``admin_lock``, held by every change of topics and partition
    states (replication applies the store's changes under it too); ``roles``, replication
    (narrow: ``become``, ``unfollow``); ``subscriptions``, asked before a topic becomes
    compacted and told of deletions; ``coordinator``, the group coordinator (None until
    ``__groups`` exists), told of deletions."""

    def __init__(
        self, config: ServerConfig, registry: TopicRegistry, view: ClusterView, store: MetadataStore,
        admin_lock: asyncio.Lock, roles: Roles, subscriptions: TopicSubscriptions,
        coordinator: Callable[[], GroupCoordinator | None],
    ) -> None:
        self.config = config
        self.defaults = registry.defaults
        self.registry = registry
        self.view = view
        self.metadata = store
        self.admin_lock = admin_lock
        self.roles = roles
        self.subscriptions = subscriptions
        self._coordinator = coordinator

    def handlers(self) -> dict:
        return {
            m.Api.METADATA: self.metadata_,
            m.Api.CREATE_TOPICS: self.create_topics,
            m.Api.DELETE_TOPICS: self.delete_topics,
            m.Api.DESCRIBE_TOPICS: self.describe_topics,
            m.Api.ALTER_TOPIC_CONFIGS: self.alter_topic_configs,
            m.Api.CREATE_PARTITIONS: self.create_partitions,
        }

    async def metadata_(self, req: m.MetadataRequest, _att, _peer: Peer):
        """Topics, partition leaders, replicas and ISR as the metadata store has them
        (this broker's latest view), and the live brokers."""
        names = sorted(self.registry.topics) if req.topics is None else req.topics
        topics = []
        for name in names:
            t = self.registry.topics.get(name)
            if t is None:
                topics.append(m.TopicMetadata(name=name, **error_fields(unknown_topic(name))))
                continue
            parts = []
            for i in range(t.count):
                st = t.states[i]
                parts.append(m.PartitionMetadata(
                    partition=i, leader=st.leader if st else -1, replicas=t.record.assignment[i],
                    isr=st.isr if st else [], leader_epoch=st.leader_epoch if st else 0,
                ))
            topics.append(m.TopicMetadata(
                name=name, partitions=parts, max_message_bytes=t.config.max_message_bytes,
                internal=t.internal, replication_factor=t.record.full_factor,
            ))
        brokers = [m.BrokerInfo(node_id=b.node_id, host=b.host, port=b.port) for b in self.view.live_brokers.values()]
        store_error = ""
        if self.view.store_unreachable is not None:  # known: answer at once, saying so
            since, why = self.view.store_unreachable
            store_error = (
                f"{why} (no answer for {time.monotonic() - since:.0f} s; brokers, leaders and "
                f"in-sync replicas are as this broker last saw them)"
            )
        elif self.view.controller_id < 0:  # not known yet (just started, or mid-election): ask
            with contextlib.suppress(MetadataUnavailable):
                controller = await self.metadata.controller()
                self.view.controller_id = -1 if controller is None else controller
        # without the store no controller can act: none is shown (not the last one seen)
        controller = -1 if store_error else self.view.controller_id
        return m.MetadataResponse(
            brokers=brokers, controller_id=controller, topics=topics, store_error=store_error
        ), ()

    async def _each_topic(
        self, changes: Iterable[tuple[str, Callable[[], Awaitable[None]]]]
    ) -> list[m.TopicResult]:
        """Run topic changes one at a time under the admin lock; one result per topic.

        They run in a task of their own: a client that disconnects cannot cancel one
        half-way.  Each change is all or nothing, and a failed one does not stop the next.
        """

        async def run() -> list[m.TopicResult]:
            results = []
            for name, change in changes:
                try:
                    async with self.admin_lock:
                        await change()
                    results.append(m.TopicResult(name=name))
                except BrokerError as exc:
                    results.append(m.TopicResult(name=name, **error_fields(exc)))
            return results

        return await asyncio.shield(asyncio.ensure_future(run()))

    async def create_topics(self, req: m.CreateTopicsRequest, _att, _peer: Peer):
        results = await self._each_topic(
            (new.name, partial(self.create_topic, new, req.validate_only)) for new in req.topics
        )
        return m.CreateTopicsResponse(topics=results), ()

    async def create_topic(self, new: m.NewTopic, validate_only: bool, internal: bool = False) -> None:
        """Validate, assign replicas, open the partitions held here, then record the topic;
        all or nothing.  Admin lock held.  ``internal``: a topic only brokers write (its
        name starts with ``__``), created only in this broker's cluster's store; never for
        a client's request."""
        check_topic_name(new.name, internal_ok=internal)
        check_partitions(new.partitions)
        config = TopicConfig.parse(new.config, self.defaults)
        if new.name in self.registry.topics:
            raise TopicAlreadyExists(f"topic {new.name!r} already exists")
        live = sorted(self.view.live_brokers)
        factor = new.replication_factor or self.config.default_replication_factor or min(3, len(live))
        intended = 0
        if internal and self.config.cluster is not None:
            # brokers down now are still the cluster's: the topic starts with the live ones
            # and is brought up to its factor as they return (cluster/strength.py)
            wanted = new.replication_factor or self.config.default_replication_factor or INTERNAL_REPLICAS
            factor = min(wanted, len(live))
            intended = wanted if wanted > factor else 0
        if not 1 <= factor <= len(live):
            raise InvalidReplicationFactor(
                f"replication factor {factor} for topic {new.name!r}: {len(live)} broker(s) alive "
                f"({', '.join(map(str, live))})"
            )
        if not internal:  # (brokers create theirs whatever the defaults say)
            _check_min_insync(config, factor, new.name)
        assignment = assign_replicas(new.partitions, factor, live, self.registry.replica_load())
        self.registry.check_capacity(sum(self.config.node_id in r for r in assignment))
        if validate_only:
            return
        if self.view.draining:  # its partitions led here would have no leader until it is gone
            raise BrokerShuttingDown(f"the broker is shutting down: topic {new.name!r} is not created")
        if internal and not await self.view.store_is_ours(wait=False):  # a wiped store: the broker stops
            raise MetadataUnavailable(f"the metadata store is not this broker's cluster's: {new.name!r} is not created")
        record = TopicRecord(
            new.name, new.partitions, dict(new.config), internal=internal,
            replication_factor=factor, assignment=assignment, intended_replication_factor=intended,
        )
        states = initial_states(record)
        loop = asyncio.get_running_loop()
        try:
            held = self.registry.held(record, range(record.partitions))
            await loop.run_in_executor(self.registry.housekeeping, self.registry.set_aside_leftovers, record.name, held)
            topic = await self.registry.open_topic(record, states)
            try:
                await self.metadata.create_topic(record, states)
            except BaseException:
                del self.registry.topics[record.name]
                await asyncio.gather(*(p.abort() for p in topic.partitions.values()), return_exceptions=True)
                raise
        except OSError as exc:
            raise storage_error_from_os(exc, f"create topic {new.name!r}") from exc
        for p in topic.partitions.values():  # lead at once: the store's watch confirms later
            self.roles.become(topic, p.index, states[p.index])
        log.info(
            "created topic %s with %d partition%s, replication factor %d%s", new.name, new.partitions,
            "" if new.partitions == 1 else "s", factor,
            f" (of {intended}: it grows as brokers return)" if intended else "",
        )

    async def delete_topics(self, req: m.DeleteTopicsRequest, _att, _peer: Peer):
        results = await self._each_topic((name, partial(self._delete_topic, name)) for name in req.names)
        return m.DeleteTopicsResponse(topics=results), ()

    async def _delete_topic(self, name: str) -> None:
        """Delete the topic from the metadata store, then here (the other replicas delete
        theirs when the store tells them).  Internal topics cannot be deleted: they hold
        the brokers' state.  Admin lock held."""
        _check_not_internal(self.registry.topic(name), "deleted")
        await self.metadata.delete_topic(name)
        await self.forget_topic(name)

    async def forget_topic(self, name: str) -> None:
        """Forget a deleted topic: let in-flight writes answer, then move its data to the
        trash.  Admin lock held."""
        topic = self.registry.topics.pop(name, None)
        if topic is None:
            return
        parts = list(topic.partitions.values())
        await self.subscriptions.forget_topic(name)
        for p in parts:
            self.roles.unfollow(p)
        await asyncio.gather(*(p.abort() for p in parts), return_exceptions=True)
        groups = self._coordinator()
        if groups is not None:
            await groups.forget_topic(name)
        for p in parts:
            self.registry.trash(name, p.index)
        log.info("deleted topic %s", name)

    async def describe_topics(self, req: m.DescribeTopicsRequest, _att, _peer: Peer):
        """Config and partitions; offsets and sizes from this broker's replica when it
        leads the partition (else -1: ask its leader)."""
        names = sorted(self.registry.topics) if req.names is None else req.names
        out = []
        for name in names:
            t = self.registry.topics.get(name)
            if t is None:
                out.append(m.TopicDescription(name=name, **error_fields(unknown_topic(name))))
                continue
            out.append(m.TopicDescription(
                name=name, config=t.config.to_strings(),
                partitions=[self._describe_partition(t, i) for i in range(t.count)],
                replication_factor=t.record.replication_factor, internal=t.internal,
            ))
        return m.DescribeTopicsResponse(topics=out), ()

    @staticmethod
    def _describe_partition(t: Topic, i: int) -> m.PartitionDescription:
        st = t.states[i]
        fields = dict(
            partition=i, leader=st.leader if st else -1, replicas=t.record.assignment[i],
            isr=st.isr if st else [], leader_epoch=st.leader_epoch if st else 0,
        )
        p = t.partitions.get(i)
        if p is None or not p.is_leader:
            return m.PartitionDescription(
                **fields, log_start_offset=-1, high_watermark=-1, size_bytes=-1, segments=-1,
                log_end_offset=-1,
            )
        return m.PartitionDescription(
            **fields, log_start_offset=p.log_start_offset, high_watermark=p.high_watermark,
            size_bytes=p.log.size_bytes, segments=len(p.log.segments), log_end_offset=p.log_end_offset,
        )

    async def alter_topic_configs(self, req: m.AlterTopicConfigsRequest, _att, _peer: Peer):
        results = await self._each_topic(
            (c.name, partial(self._alter_topic_config, c, req.validate_only)) for c in req.topics
        )
        return m.AlterTopicConfigsResponse(topics=results), ()

    async def _alter_topic_config(self, change: m.TopicConfigChange, validate_only: bool) -> None:
        """Validate the topic's new overrides, record them, then apply them to its live
        partitions: all or nothing, no restart.  A topic with subscriptions cannot become
        compacted (``InvalidConfig`` naming them).  Admin lock held."""
        topic = self.registry.topic(change.name)
        keeping = sorted(KEEPING_CONFIGS & (set(change.config) | set(change.delete)))
        if topic.internal and topic.name not in PRODUCED_INTERNAL and keeping:
            raise InvalidRequest(
                f"topic {topic.name} is internal: its {', '.join(keeping)} cannot be changed "
                "(brokers rebuild their state from it)"
            )
        both = sorted(set(change.config) & set(change.delete))
        if both:
            raise InvalidConfig(f"{', '.join(both)}: both set and deleted")
        for key in change.delete:
            TopicConfig.key(key)
        record = (await self.metadata.topics())[change.name]
        TopicConfig.parse(change.config, self.defaults)  # the new settings, as any new ones
        overrides = {k: v for k, v in record.config.items() if k not in change.delete}
        overrides.update(change.config)
        parsed = TopicConfig.parse(overrides, self.defaults, stored=True)
        _check_min_insync(parsed, record.replication_factor, change.name)
        if parsed.cleanup_policy == "compact" and topic.config.cleanup_policy != "compact":
            # a compacted topic takes no subscriptions: those it has would be stranded
            names = await self.subscriptions.names(change.name)
            if names:
                raise InvalidConfig(
                    f"topic {change.name!r} has subscriptions ({', '.join(sorted(names))}): it cannot be "
                    "compacted while it has them; delete them first"
                )
        if validate_only:
            return
        try:
            await self.metadata.update_topic(dataclasses.replace(record, config=overrides))
        except OSError as exc:
            raise storage_error_from_os(exc, f"alter config of topic {change.name!r}") from exc
        self.registry.reconfigure(topic, dataclasses.replace(record, config=overrides))
        log.info("altered config of topic %s: %s", change.name, overrides)

    async def create_partitions(self, req: m.CreatePartitionsRequest, _att, _peer: Peer):
        results = await self._each_topic(
            (inc.name, partial(self._add_partitions, inc, req.validate_only)) for inc in req.topics
        )
        return m.CreatePartitionsResponse(topics=results), ()

    async def _add_partitions(self, inc: m.PartitionsIncrease, validate_only: bool) -> None:
        """Grow a topic to ``inc.total`` partitions: open the new ones empty, record the new
        count, then make them visible (metadata, produce, fetch); all or nothing.  Admin
        lock held."""
        topic = self.registry.topic(inc.name)
        _check_not_internal(topic, "given partitions")
        current = topic.count
        check_partitions(inc.total)
        if inc.total <= current:
            raise InvalidPartitions(
                f"topic {inc.name!r} has {current} partitions; partitions can only be added, "
                f"so the new total must be above {current}, not {inc.total}"
            )
        self.registry.check_capacity(inc.total - current)  # at most: fewer when replicas are spread
        if validate_only:
            return
        added = range(current, inc.total)
        old = (await self.metadata.topics())[inc.name]
        more = assign_replicas(
            len(added), old.replication_factor, sorted(self.view.live_brokers), self.registry.replica_load(), start=current
        )
        record = dataclasses.replace(old, partitions=inc.total, assignment=[*old.assignment, *more])
        states = initial_states(record)[current:]
        loop = asyncio.get_running_loop()
        try:
            held = self.registry.held(record, added)
            await loop.run_in_executor(self.registry.housekeeping, self.registry.set_aside_leftovers, inc.name, held)
            new = await self.registry.open_partitions(inc.name, held, topic.config)
            try:
                await self.metadata.update_topic(record, states)
            except BaseException:
                await asyncio.gather(*(p.close() for p in new), return_exceptions=True)
                raise
        except OSError as exc:
            raise storage_error_from_os(exc, f"add partitions to topic {inc.name!r}") from exc
        topic.record = record
        topic.states.extend(states)
        for p in new:
            topic.partitions[p.index] = p
            self.roles.become(topic, p.index, states[p.index - current])
        log.info("topic %s grew from %d to %d partitions", inc.name, current, inc.total)
