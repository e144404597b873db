"""Topics: their definition, lifecycle (open, create, delete, grow) and admin handlers.

``TopicAdmin`` is a part of ``Broker`` (a mixin): the handlers of the topic admin APIs
(metadata, create, delete, describe, alter config, add partitions) and the opening of a
topic's partitions.  Changes run one at a time under the broker's admin lock, each all or
nothing.  ``error_fields`` and ``unknown_topic`` are shared by every handler module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sluice.broker.partition import Partition
from sluice.cluster.store import TopicRecord, initial_states
from sluice.config import TopicConfig, check_partitions, check_topic_name
from sluice.errors import (
    BrokerError,
    InvalidConfig,
    InvalidPartitions,
    InvalidRequest,
    TopicAlreadyExists,
    UnknownTopic,
    storage_error_from_os,
)
from sluice.protocol import messages as m
from sluice.storage.log import PartitionLog

log = logging.getLogger("sluice.broker")


@dataclass
class Topic:
    name: str
    config: TopicConfig
    partitions: list[Partition]
    internal: bool = False


def unknown_topic(topic: str) -> UnknownTopic:
    return UnknownTopic(f"topic {topic!r} does not exist")


def error_fields(exc: BrokerError) -> dict:
    """The ``error`` and ``message`` fields of a result that failed with ``exc``."""
    return {"error": exc.code, "message": exc.message}


def _check_not_internal(topic: Topic, change: str) -> None:
    if topic.internal:
        raise InvalidRequest(f"topic {topic.name} is internal: it cannot be {change}")


class TopicAdmin:
    """Topic lifecycle and admin handlers of ``Broker`` (see broker.py for its state)."""

    def _log_dir(self, topic: str, index: int) -> Path:
        return self.data_dir / "logs" / f"{topic}-{index}"

    async def _open_topic(self, record: TopicRecord) -> Topic:
        config = TopicConfig.parse(record.config, self.defaults)
        partitions = await self._open_partitions(record.name, range(record.partitions), config)
        topic = Topic(record.name, config, partitions, record.internal)
        self.topics[record.name] = topic
        return topic

    async def _open_partitions(self, name: str, indexes: range, config: TopicConfig) -> list[Partition]:
        """Open (create or recover) partitions ``indexes`` of topic ``name``; all or none."""
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
                    replica_id=self.config.node_id,
                ))
        except BaseException:
            await asyncio.gather(*(p.close() for p in partitions), return_exceptions=True)
            raise
        return partitions

    async def metadata_(self, req: m.MetadataRequest, _att):
        names = sorted(self.topics) if req.topics is None else req.topics
        node = self.config.node_id
        topics = []
        for name in names:
            t = self.topics.get(name)
            if t is None:
                topics.append(m.TopicMetadata(name=name, **error_fields(unknown_topic(name))))
                continue
            topics.append(
                m.TopicMetadata(
                    name=name,
                    partitions=[
                        m.PartitionMetadata(partition=i, leader=node, replicas=[node], isr=[node])
                        for i in range(len(t.partitions))
                    ],
                    max_message_bytes=t.config.max_message_bytes,
                    internal=t.internal,
                )
            )
        brokers = [m.BrokerInfo(node_id=node, host=self.host, port=self.port)]
        return m.MetadataResponse(brokers=brokers, controller_id=node, topics=topics), ()

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

    async def create_topics(self, req: m.CreateTopicsRequest, _att):
        results = await self._each_topic(
            (new.name, partial(self._create_topic, new, req.validate_only)) for new in req.topics
        )
        return m.CreateTopicsResponse(topics=results), ()

    async def _create_topic(self, new: m.NewTopic, validate_only: bool, internal: bool = False) -> None:
        """Validate, open the partitions, then record the topic; all or nothing. Admin lock
        held.  ``internal``: a topic only brokers write (its name starts with ``__``); never
        for a client's request."""
        check_topic_name(new.name, internal_ok=internal)
        check_partitions(new.partitions)
        TopicConfig.parse(new.config, self.defaults)
        if new.name in self.topics:
            raise TopicAlreadyExists(f"topic {new.name!r} already exists")
        self._check_capacity(new.partitions)
        if validate_only:
            return
        record = TopicRecord(
            new.name, new.partitions, dict(new.config), internal=internal,
            assignment=[[self.config.node_id] for _ in range(new.partitions)],
        )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self.housekeeping, self._set_aside_leftovers, record.name, range(record.partitions)
            )
            topic = await self._open_topic(record)
            try:
                await self.metadata.create_topic(record, initial_states(record))
            except BaseException:
                del self.topics[record.name]
                await asyncio.gather(*(p.abort() for p in topic.partitions), return_exceptions=True)
                raise
        except OSError as exc:
            raise storage_error_from_os(exc, f"create topic {new.name!r}") from exc
        log.info("created topic %s with %d partitions", new.name, new.partitions)

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

    async def delete_topics(self, req: m.DeleteTopicsRequest, _att):
        results = await self._each_topic((name, partial(self._delete_topic, name)) for name in req.names)
        return m.DeleteTopicsResponse(topics=results), ()

    async def _delete_topic(self, name: str) -> None:
        """Forget the topic, let in-flight writes answer, then move its data to the trash.
        Internal topics cannot be deleted: they hold the brokers' state."""
        topic = self.topic(name)
        _check_not_internal(topic, "deleted")
        loop = asyncio.get_running_loop()
        await self.metadata.delete_topic(name)
        del self.topics[name]
        await asyncio.gather(*(p.abort() for p in topic.partitions), return_exceptions=True)
        await self.groups.forget_topic(name)
        for p in topic.partitions:
            src = self._log_dir(name, p.index)
            trash = src.with_name(f".trash-{uuid.uuid4().hex}")
            try:
                os.replace(src, trash)
            except OSError as exc:  # the topic is gone either way; its files wait for a restart
                log.error("cannot move %s to the trash: %s", src, exc)
                continue
            loop.run_in_executor(self.housekeeping, shutil.rmtree, trash, True)
        log.info("deleted topic %s", name)

    async def describe_topics(self, req: m.DescribeTopicsRequest, _att):
        names = sorted(self.topics) if req.names is None else req.names
        out = []
        for name in names:
            t = self.topics.get(name)
            if t is None:
                out.append(m.TopicDescription(name=name, **error_fields(unknown_topic(name))))
                continue
            out.append(
                m.TopicDescription(
                    name=name,
                    config=t.config.to_strings(),
                    partitions=[
                        m.PartitionDescription(
                            partition=p.index,
                            leader=self.config.node_id,
                            log_start_offset=p.log_start_offset,
                            high_watermark=p.high_watermark,
                            size_bytes=p.log.size_bytes,
                            segments=len(p.log.segments),
                        )
                        for p in t.partitions
                    ],
                )
            )
        return m.DescribeTopicsResponse(topics=out), ()

    async def alter_topic_configs(self, req: m.AlterTopicConfigsRequest, _att):
        results = await self._each_topic(
            (c.name, partial(self._alter_topic_config, c, req.validate_only)) for c in req.topics
        )
        return m.AlterTopicConfigsResponse(topics=results), ()

    async def _alter_topic_config(self, change: m.TopicConfigChange, validate_only: bool) -> None:
        """Validate the topic's new overrides, record them, then apply them to its live
        partitions: all or nothing, no restart. Admin lock held."""
        topic = self.topic(change.name)
        both = sorted(set(change.config) & set(change.delete))
        if both:
            raise InvalidConfig(f"{', '.join(both)}: both set and deleted")
        for key in change.delete:
            TopicConfig.key(key)
        record = (await self.metadata.topics())[change.name]
        overrides = {k: v for k, v in record.config.items() if k not in change.delete}
        overrides.update(change.config)
        config = TopicConfig.parse(overrides, self.defaults)
        if validate_only:
            return
        try:
            await self.metadata.update_topic(dataclasses.replace(record, config=overrides))
        except OSError as exc:
            raise storage_error_from_os(exc, f"alter config of topic {change.name!r}") from exc
        topic.config = config
        for p in topic.partitions:
            p.reconfigure(config)
        log.info("altered config of topic %s: %s", change.name, overrides)

    async def create_partitions(self, req: m.CreatePartitionsRequest, _att):
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
        current = len(topic.partitions)
        check_partitions(inc.total)
        if inc.total <= current:
            raise InvalidPartitions(
                f"topic {inc.name!r} has {current} partitions; partitions can only be added, "
                f"so the new total must be above {current}, not {inc.total}"
            )
        self._check_capacity(inc.total - current)
        if validate_only:
            return
        added = range(current, inc.total)
        old = (await self.metadata.topics())[inc.name]
        record = dataclasses.replace(
            old, partitions=inc.total,
            assignment=[*old.assignment, *([self.config.node_id] for _ in added)],
        )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.housekeeping, self._set_aside_leftovers, inc.name, added)
            new = await self._open_partitions(inc.name, added, topic.config)
            try:
                await self.metadata.update_topic(record, initial_states(record)[current:])
            except BaseException:
                await asyncio.gather(*(p.close() for p in new), return_exceptions=True)
                raise
        except OSError as exc:
            raise storage_error_from_os(exc, f"add partitions to topic {inc.name!r}") from exc
        topic.partitions.extend(new)
        log.info("topic %s grew from %d to %d partitions", inc.name, current, inc.total)
