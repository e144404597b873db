"""Topics: their definition, lifecycle (open, create, delete, grow) and admin handlers.

``TopicAdmin`` is a part of ``Broker`` (a mixin): the handlers of the topic admin APIs
(metadata, create, delete, describe, alter config, add partitions) and the opening of a
topic's partitions.  Changes run one at a time under the broker's admin lock, each all or
nothing.  ``error_fields`` (and ``unknown_topic``, from cluster/store.py) are shared by
every handler module.

Every broker knows every topic of the cluster (``Topic``: its record and the state of each
partition, from the metadata store) and holds the partitions assigned to it
(``Topic.partitions``, by index).  A new topic's replicas are spread over the live brokers
(cluster/assignment.py); the creating broker opens the partitions it holds before the
topic is recorded, the others open theirs when the metadata store tells them
(broker/replication.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from pathlib import Path

from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.produce import PRODUCED_INTERNAL
from sluice.broker.registry import Topic
from sluice.broker.results import error_fields
from sluice.cluster.assignment import assign_replicas, replica_load
from sluice.cluster.store import PartitionState, TopicRecord, initial_states, unknown_topic
from sluice.config import TopicConfig, check_partitions, check_topic_name
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
from sluice.storage.log import PartitionLog

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


class TopicAdmin:
    """Topic lifecycle and admin handlers of ``Broker`` (see broker.py for its state)."""

    def _log_dir(self, topic: str, index: int) -> Path:
        return self.data_dir / "logs" / f"{topic}-{index}"

    def _held(self, record: TopicRecord, indexes: Iterable[int]) -> list[int]:
        """Which of ``indexes`` this broker holds a replica of."""
        node = self.config.node_id
        return [i for i in indexes if node in record.assignment[i]]

    async def _open_topic(self, record: TopicRecord, states: list[PartitionState] | None = None) -> Topic:
        """Know ``record`` and open the partitions this broker holds (as followers: their
        states make them leaders)."""
        config = TopicConfig.parse(record.config, self.defaults, stored=True)
        held = self._held(record, range(record.partitions))
        partitions = await self._open_partitions(record.name, held, config)
        topic = Topic(
            record.name, config, record,
            list(states) if states is not None else [None] * record.partitions,
            {p.index: p for p in partitions},
        )
        self.topics[record.name] = topic
        return topic

    async def _open_partitions(self, name: str, indexes: Iterable[int], config: TopicConfig) -> list[Partition]:
        """Open (create or recover) partitions ``indexes`` of topic ``name``; all or none.
        They start as followers of no one: ``_become`` (broker/replication.py) applies
        their state."""
        loop = asyncio.get_running_loop()
        partitions = []
        try:
            for i in indexes:
                plog = await loop.run_in_executor(
                    self.write_executor, PartitionLog.open, self._log_dir(name, i),
                    config.log_config, self.checkpointed_hw.get((name, i)),
                )
                for cut in plog.cuts:
                    log.warning(
                        "partition %s-%d recovered: cut %d bytes at position %d of %s (%s)",
                        name, i, cut.dropped_bytes, cut.position, cut.segment.name, cut.reason,
                    )
                partitions.append(Partition(
                    name, i, plog, config, self.write_executor, self.read_executor,
                    replica_id=self.config.node_id, leader=False,
                    tail_cache_bytes=self.config.tail_cache_bytes, syncer=self.syncer,
                    on_disk_failure=self.disk_step_down.disk_failed,
                ))
        except BaseException:
            await asyncio.gather(*(p.close() for p in partitions), return_exceptions=True)
            raise
        return partitions

    async def metadata_(self, req: m.MetadataRequest, _att, _peer: Peer):
        """Topics, partition leaders, replicas and ISR as the metadata store has them
        (this broker's latest view), and the live brokers."""
        names = sorted(self.topics) if req.topics is None else req.topics
        topics = []
        for name in names:
            t = self.topics.get(name)
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
        brokers = [m.BrokerInfo(node_id=b.node_id, host=b.host, port=b.port) for b in self.live_brokers.values()]
        store_error = ""
        if self.store_unreachable is not None:  # known: answer at once, saying so
            since, why = self.store_unreachable
            store_error = (
                f"{why} (no answer for {time.monotonic() - since:.0f} s; brokers, leaders and "
                f"in-sync replicas are as this broker last saw them)"
            )
        elif self.controller_id < 0:  # not known yet (just started, or mid-election): ask
            with contextlib.suppress(MetadataUnavailable):
                controller = await self.metadata.controller()
                self.controller_id = -1 if controller is None else controller
        # without the store no controller can act: none is shown (not the last one seen)
        controller = -1 if store_error else self.controller_id
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
                    async with self._admin_lock:
                        await change()
                    results.append(m.TopicResult(name=name))
                except BrokerError as exc:
                    results.append(m.TopicResult(name=name, **error_fields(exc)))
            return results

        return await asyncio.shield(asyncio.ensure_future(run()))

    def _check_capacity(self, more: int) -> None:
        held = sum(len(t.partitions) for t in self.topics.values())
        if held + more > self.config.max_partitions:
            raise InvalidPartitions(
                f"the broker holds {held} partitions; {more} more would pass its "
                f"limit of {self.config.max_partitions} (sluice serve --max-partitions)"
            )

    async def create_topics(self, req: m.CreateTopicsRequest, _att, _peer: Peer):
        results = await self._each_topic(
            (new.name, partial(self._create_topic, new, req.validate_only)) for new in req.topics
        )
        return m.CreateTopicsResponse(topics=results), ()

    async def _create_topic(self, new: m.NewTopic, validate_only: bool, internal: bool = False) -> None:
        """Validate, assign replicas, open the partitions held here, then record the topic;
        all or nothing.  Admin lock held.  ``internal``: a topic only brokers write (its
        name starts with ``__``), created only in this broker's cluster's store; never for
        a client's request."""
        check_topic_name(new.name, internal_ok=internal)
        check_partitions(new.partitions)
        config = TopicConfig.parse(new.config, self.defaults)
        if new.name in self.topics:
            raise TopicAlreadyExists(f"topic {new.name!r} already exists")
        live = sorted(self.live_brokers)
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
        assignment = assign_replicas(new.partitions, factor, live, self._replica_load())
        self._check_capacity(sum(self.config.node_id in r for r in assignment))
        if validate_only:
            return
        if self._draining:  # its partitions led here would have no leader until it is gone
            raise BrokerShuttingDown(f"the broker is shutting down: topic {new.name!r} is not created")
        if internal and not await self.store_is_ours(wait=False):  # a wiped store: the broker stops
            raise MetadataUnavailable(f"the metadata store is not this broker's cluster's: {new.name!r} is not created")
        record = TopicRecord(
            new.name, new.partitions, dict(new.config), internal=internal,
            replication_factor=factor, assignment=assignment, intended_replication_factor=intended,
        )
        states = initial_states(record)
        loop = asyncio.get_running_loop()
        try:
            held = self._held(record, range(record.partitions))
            await loop.run_in_executor(self.housekeeping, self._set_aside_leftovers, record.name, held)
            topic = await self._open_topic(record, states)
            try:
                await self.metadata.create_topic(record, states)
            except BaseException:
                del self.topics[record.name]
                await asyncio.gather(*(p.abort() for p in topic.partitions.values()), return_exceptions=True)
                raise
        except OSError as exc:
            raise storage_error_from_os(exc, f"create topic {new.name!r}") from exc
        for p in topic.partitions.values():  # lead at once: the store's watch confirms later
            self._become(topic, p.index, states[p.index])
        log.info(
            "created topic %s with %d partition%s, replication factor %d%s", new.name, new.partitions,
            "" if new.partitions == 1 else "s", factor,
            f" (of {intended}: it grows as brokers return)" if intended else "",
        )

    def _replica_load(self) -> dict[int, int]:
        """How many partition replicas each broker holds (to spread new ones evenly)."""
        return replica_load(t.record.assignment for t in self.topics.values())

    def _set_aside_leftovers(self, name: str, indexes: range) -> None:
        """Move partition directories no topic owns (an interrupted create or partition
        increase) out of the way.

        Never deleted: they may hold the only copy of data whose metadata was lost.
        """
        for i in indexes:
            d = self._log_dir(name, i)
            if d.exists():
                aside = d.with_name(f".stale-{uuid.uuid4().hex}")
                os.replace(d, aside)
                log.warning("moved leftover directory %s aside to %s", d, aside)

    async def delete_topics(self, req: m.DeleteTopicsRequest, _att, _peer: Peer):
        results = await self._each_topic((name, partial(self._delete_topic, name)) for name in req.names)
        return m.DeleteTopicsResponse(topics=results), ()

    async def _delete_topic(self, name: str) -> None:
        """Delete the topic from the metadata store, then here (the other replicas delete
        theirs when the store tells them).  Internal topics cannot be deleted: they hold
        the brokers' state.  Admin lock held."""
        _check_not_internal(self.topic(name), "deleted")
        await self.metadata.delete_topic(name)
        await self._forget_topic(name)

    async def _forget_topic(self, name: str) -> None:
        """Forget a deleted topic: let in-flight writes answer, then move its data to the
        trash.  Admin lock held."""
        topic = self.topics.pop(name, None)
        if topic is None:
            return
        parts = list(topic.partitions.values())
        await self.subscriptions.forget_topic(name)
        for p in parts:
            self._unfollow(p)
        await asyncio.gather(*(p.abort() for p in parts), return_exceptions=True)
        if self.groups is not None:
            await self.groups.forget_topic(name)
        for p in parts:
            self._trash(name, p.index)
        log.info("deleted topic %s", name)

    def _trash(self, name: str, index: int) -> None:
        """Move the directory of partition ``index`` of ``name`` (closed) to the trash and
        delete it in the background; a crash meanwhile leaves it to the next start.  A
        failed move is logged: the replica is gone from this broker either way."""
        src = self._log_dir(name, index)
        trash = src.with_name(f".trash-{uuid.uuid4().hex}")
        try:
            os.replace(src, trash)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("cannot move %s to the trash: %s", src, exc)
            return
        asyncio.get_running_loop().run_in_executor(self.housekeeping, shutil.rmtree, trash, True)

    async def describe_topics(self, req: m.DescribeTopicsRequest, _att, _peer: Peer):
        """Config and partitions; offsets and sizes from this broker's replica when it
        leads the partition (else -1: ask its leader)."""
        names = sorted(self.topics) if req.names is None else req.names
        out = []
        for name in names:
            t = self.topics.get(name)
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
        topic = self.topic(change.name)
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
        self._reconfigure(topic, dataclasses.replace(record, config=overrides))
        log.info("altered config of topic %s: %s", change.name, overrides)

    def _reconfigure(self, topic: Topic, record: TopicRecord) -> None:
        """Apply ``record``'s config (validated when it was stored) to a live topic."""
        topic.config = TopicConfig.parse(record.config, self.defaults, stored=True)
        topic.record = record
        for p in topic.partitions.values():
            p.reconfigure(topic.config)
        self.controller.config_changed(record)  # an unclean election may be allowed now

    async def create_partitions(self, req: m.CreatePartitionsRequest, _att, _peer: Peer):
        results = await self._each_topic(
            (inc.name, partial(self._add_partitions, inc, req.validate_only)) for inc in req.topics
        )
        return m.CreatePartitionsResponse(topics=results), ()

    async def _add_partitions(self, inc: m.PartitionsIncrease, validate_only: bool) -> None:
        """Grow a topic to ``inc.total`` partitions: open the new ones empty, record the new
        count, then make them visible (metadata, produce, fetch); all or nothing.  Admin
        lock held."""
        topic = self.topic(inc.name)
        _check_not_internal(topic, "given partitions")
        current = topic.count
        check_partitions(inc.total)
        if inc.total <= current:
            raise InvalidPartitions(
                f"topic {inc.name!r} has {current} partitions; partitions can only be added, "
                f"so the new total must be above {current}, not {inc.total}"
            )
        self._check_capacity(inc.total - current)  # at most: fewer when replicas are spread
        if validate_only:
            return
        added = range(current, inc.total)
        old = (await self.metadata.topics())[inc.name]
        more = assign_replicas(
            len(added), old.replication_factor, sorted(self.live_brokers), self._replica_load(), start=current
        )
        record = dataclasses.replace(old, partitions=inc.total, assignment=[*old.assignment, *more])
        states = initial_states(record)[current:]
        loop = asyncio.get_running_loop()
        try:
            held = self._held(record, added)
            await loop.run_in_executor(self.housekeeping, self._set_aside_leftovers, inc.name, held)
            new = await self._open_partitions(inc.name, held, topic.config)
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
            self._become(topic, p.index, states[p.index - current])
        log.info("topic %s grew from %d to %d partitions", inc.name, current, inc.total)
