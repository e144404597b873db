"""Broker: topics and their partitions, and one handler per API.

Handlers take a decoded request struct and the frame's attachments and return the response
struct plus the attachments to send (or None for a produce with ``acks=none``).  They raise
``BrokerError`` for request-level failures; per-partition failures go into the response.
The server connection (server/connection.py) owns bytes and sockets; this module owns none.

Data directory::

    <data>/meta/topics.json        topic definitions (cluster/embedded.py; none with etcd)
    <data>/logs/<topic>-<n>/       one partition log each (storage/log.py)
    <data>/groups/<group>.json     committed offsets, with commit times and clients (broker/groups.py)

Metadata lives in a ``MetadataStore`` (cluster/store.py): the data directory by default, or
etcd with ``sluice serve --cluster etcd://...``.  **Cluster mode is an intermediate step:
there is no replication yet.**  A broker registers itself in etcd, and topics are created,
described and deleted in etcd, but every partition has one replica, on the broker that
created the topic, which leads it.  Each broker serves (and opens at start) only the topics
it leads; it answers for other brokers' topics as for unknown ones.  Leader election, the
controller and followers come with replication.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sluice.broker.groups import Committed, GroupOffsets, check_group_name
from sluice.broker.partition import Partition
from sluice.broker.peer import client_address
from sluice.cluster import open_store
from sluice.cluster.store import BrokerRegistration, MetadataStore, TopicRecord, initial_states
from sluice.config import ServerConfig, TopicConfig, check_partitions, check_topic_name
from sluice.errors import (
    BrokerError,
    CorruptRecord,
    InvalidConfig,
    InvalidPartitions,
    InvalidRecord,
    InvalidRequest,
    MessageTooLarge,
    OffsetOutOfRange,
    RequestTimedOut,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
    storage_error_from_os,
)
from sluice.protocol import messages as m
from sluice.protocol.records import BatchTooLarge, validate_batches
from sluice.storage.log import OutOfRange, PartitionLog

log = logging.getLogger("sluice.broker")

MAX_COMMIT_METADATA = 4096
FETCH_OVERHEAD = 1024 * 1024  # room in a response frame for its header


@dataclass
class Topic:
    name: str
    config: TopicConfig
    partitions: list[Partition]
    internal: bool = False


def _unknown(topic: str) -> UnknownTopic:
    return UnknownTopic(f"topic {topic!r} does not exist")


def _err(exc: BrokerError) -> dict:
    return {"error": exc.code, "message": exc.message}


class Broker:
    def __init__(self, config: ServerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.defaults = TopicConfig.parse(config.topic_defaults)
        self.topics: dict[str, Topic] = {}
        self.write_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="sluice-write")
        self.read_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="sluice-read")
        # metadata writes, directory moves and deletions: never in the way of produce / fetch
        self.housekeeping = ThreadPoolExecutor(1, thread_name_prefix="sluice-housekeeping")
        self._admin_lock = asyncio.Lock()  # topic create / delete run one at a time
        self._draining = False  # shutdown began: fetches answer at once instead of waiting
        self.metadata = store if store is not None else open_store(config)
        self.groups: GroupOffsets | None = None
        self.host, self.port = config.host, config.port
        self._retention_task: asyncio.Task | None = None
        self._expired: list = []  # segments out of their logs whose files are still to delete

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the metadata store, register, and open (recover) the logs of the topics this
        broker leads."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        await self.metadata.start()
        try:
            node = self.config.node_id
            await self.metadata.register_broker(BrokerRegistration(node, self.host, self.port))
            self.groups = GroupOffsets(self.data_dir, self.housekeeping)
            for record in (await self.metadata.topics()).values():
                if await self._leads(record):
                    await self._open_topic(record)
        except BaseException:
            await self.metadata.close()
            raise
        for trash in (self.data_dir / "logs").glob(".trash-*"):  # deletions a crash interrupted
            asyncio.get_running_loop().run_in_executor(self.housekeeping, shutil.rmtree, trash, True)
        self._retention_task = asyncio.get_running_loop().create_task(self._retention_loop())

    def drain(self) -> None:
        """Shutdown has begun: every fetch long poll answers now with what it has (a client
        waiting for new records must not hold the shutdown for its ``max_wait_ms``), and so
        do fetches that come later."""
        self._draining = True
        for topic in self.topics.values():
            for p in topic.partitions:
                p.wake_fetches()

    async def close(self) -> None:
        """Finish queued writes, fsync and close every partition."""
        if self._retention_task:
            self._retention_task.cancel()
        parts = [p for topic in self.topics.values() for p in topic.partitions]
        results = await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        for p, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing %s-%d failed: %r", p.topic, p.index, result)
        await self.metadata.close()
        for executor in (self.write_executor, self.read_executor, self.housekeeping):
            executor.shutdown(wait=True)

    async def _leads(self, record: TopicRecord) -> bool:
        """Whether this broker leads every partition of the topic (see the module docstring)."""
        states = await self.metadata.partition_states(record.name)
        if all(s.leader == self.config.node_id for s in states):
            return True
        log.info("topic %s is served by broker %s, not this one", record.name, states[0].leader)
        return False

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
                    self.write_executor, PartitionLog.open, self._log_dir(name, i), config.log_config
                )
                for cut in plog.cuts:
                    log.warning(
                        "partition %s-%d recovered: cut %d bytes at position %d of %s (%s)",
                        name, i, cut.dropped_bytes, cut.position, cut.segment.name, cut.reason,
                    )
                partitions.append(Partition(name, i, plog, config, self.write_executor, self.read_executor))
        except BaseException:
            await asyncio.gather(*(p.close() for p in partitions), return_exceptions=True)
            raise
        return partitions

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_ms / 1000)
            try:
                await self.enforce_retention()
            except Exception:  # keep enforcing: the cause (a full or read-only disk) may pass
                log.exception("retention pass failed")

    async def enforce_retention(self) -> int:
        """Delete segments past retention; returns how many files sets were deleted.

        Segments leave the log at once; their files are unlinked off the event loop, and a
        deletion that fails is retried on the next pass.
        """
        loop = asyncio.get_running_loop()
        now = int(time.time() * 1000)
        for topic in list(self.topics.values()):
            for p in topic.partitions:
                self._expired.extend(p.take_expired(now))
        pending, self._expired = self._expired, []
        deleted = 0
        for seg in pending:
            try:
                await loop.run_in_executor(self.housekeeping, seg.delete)
                deleted += 1
            except OSError as exc:
                log.error("cannot delete expired segment %s: %s; will retry", seg.path, exc)
                self._expired.append(seg)
        return deleted

    # ------------------------------------------------------------------ lookups

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            raise _unknown(name)
        return t

    def partition(self, topic: str, index: int) -> Partition:
        t = self.topic(topic)
        if not 0 <= index < len(t.partitions):
            raise UnknownPartition(f"topic {topic!r} has partitions 0-{len(t.partitions) - 1}, not {index}")
        return t.partitions[index]

    # ------------------------------------------------------------------ handlers: admin

    async def api_versions(self, req: m.ApiVersionsRequest, _att):
        return m.ApiVersionsResponse(apis=m.supported_versions()), ()

    async def metadata_(self, req: m.MetadataRequest, _att):
        names = sorted(self.topics) if req.topics is None else req.topics
        node = self.config.node_id
        topics = []
        for name in names:
            t = self.topics.get(name)
            if t is None:
                topics.append(m.TopicMetadata(name=name, **_err(_unknown(name))))
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
                    results.append(m.TopicResult(name=name, **_err(exc)))
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

    async def _create_topic(self, new: m.NewTopic, validate_only: bool) -> None:
        """Validate, open the partitions, then record the topic; all or nothing. Admin lock held."""
        check_topic_name(new.name)
        check_partitions(new.partitions)
        TopicConfig.parse(new.config, self.defaults)
        if new.name in self.topics:
            raise TopicAlreadyExists(f"topic {new.name!r} already exists")
        self._check_capacity(new.partitions)
        if validate_only:
            return
        record = TopicRecord(
            new.name, new.partitions, dict(new.config),
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
        """Forget the topic, let in-flight writes answer, then move its data to the trash."""
        topic = self.topic(name)
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
                out.append(m.TopicDescription(name=name, **_err(_unknown(name))))
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

    # ------------------------------------------------------------------ handlers: groups

    def _group_partition(self, topic: str, index: int, c: Committed | None) -> m.GroupPartition:
        """What is known of one partition for a group: its commit (if any) and the log."""
        known = {} if c is None else {
            "committed_offset": c.offset, "metadata": c.metadata,
            "commit_time_ms": c.time_ms, "committed_by": c.client,
        }
        try:
            part = self.partition(topic, index)
        except BrokerError as exc:
            return m.GroupPartition(topic=topic, partition=index, **known, **_err(exc))
        hw = part.high_watermark
        return m.GroupPartition(
            topic=topic, partition=index, **known, log_start_offset=part.log_start_offset,
            high_watermark=hw, lag=-1 if c is None else max(hw - c.offset, 0),
        )

    async def list_groups(self, req: m.ListGroupsRequest, _att):
        out = []
        for name in self.groups.names():
            committed = self.groups.get(name)
            lags = (self._group_partition(t, p, c).lag for (t, p), c in committed.items())
            out.append(
                m.GroupListing(
                    name=name, topics=sorted({t for t, _ in committed}), partitions=len(committed),
                    lag=sum(lag for lag in lags if lag > 0),
                    last_commit_ms=max((c.time_ms for c in committed.values()), default=-1),
                )
            )
        return m.ListGroupsResponse(groups=out), ()

    async def describe_groups(self, req: m.DescribeGroupsRequest, _att):
        """Per group: every partition of every topic it committed to, committed or not."""
        out = []
        for name in req.names:
            try:
                committed = self.groups.existing(name)
            except BrokerError as exc:
                out.append(m.GroupDescription(name=name, **_err(exc)))
                continue
            keys = set(committed)
            for t in {t for t, _ in committed}:
                if t in self.topics:
                    keys.update((t, i) for i in range(len(self.topics[t].partitions)))
            partitions = [self._group_partition(t, p, committed.get((t, p))) for t, p in sorted(keys)]
            out.append(m.GroupDescription(name=name, partitions=partitions))
        return m.DescribeGroupsResponse(groups=out), ()

    async def delete_groups(self, req: m.DeleteGroupsRequest, _att):
        """Delete groups' offsets.  No membership exists to check: a consumer of the group
        still running recreates it with its next commit."""
        results = []
        for name in req.names:
            try:
                await self.groups.delete(name)
                results.append(m.GroupResult(name=name))
            except BrokerError as exc:
                results.append(m.GroupResult(name=name, **_err(exc)))
        return m.DeleteGroupsResponse(groups=results), ()

    # ------------------------------------------------------------------ handlers: data

    async def produce(self, req: m.ProduceRequest, att: memoryview):
        """Validate each partition's batches, queue them on its writer, await the acks."""
        total = sum(p.size for p in req.partitions)
        if total != len(att) or any(p.size < 0 for p in req.partitions):
            raise InvalidRequest(f"partition sizes add up to {total}, attachments hold {len(att)} bytes")
        results: list[m.ProducePartitionResult | None] = []
        pending: list[tuple[int, asyncio.Future]] = []
        pos = 0
        for p in req.partitions:
            chunk = att[pos : pos + p.size]
            pos += p.size
            try:
                part = self.partition(p.topic, p.partition)
                max_bytes = part.config.max_message_bytes
                try:
                    spans = validate_batches(chunk, max_bytes)
                except BatchTooLarge as exc:
                    raise MessageTooLarge(
                        f"batch of {exc.size} bytes exceeds max.message.bytes={max_bytes} of topic {p.topic!r}"
                    ) from None
                except CorruptRecord as exc:
                    raise InvalidRecord(str(exc)) from None
            except BrokerError as exc:
                results.append(m.ProducePartitionResult(topic=p.topic, partition=p.partition, **_err(exc)))
                continue
            pending.append((len(results), part.append(chunk, spans)))
            results.append(None)
        if req.acks == m.ACKS_NONE:
            # no answer, but the frame stays counted against the connection until written
            if pending:
                await asyncio.wait([f for _, f in pending])
            for _, fut in pending:
                _consume_exception(fut)
            return None
        if pending:
            try:
                await asyncio.wait([f for _, f in pending], timeout=max(req.timeout_ms, 1) / 1000)
            except asyncio.CancelledError:
                # The connection is gone: nobody will learn the outcome, and the client may
                # already be retrying elsewhere.  Withdraw what no writer has taken yet, so
                # the broker never runs an abandoned copy beside the retry.
                for _, fut in pending:
                    fut.cancel()
                raise
        for i, fut in pending:
            p = req.partitions[i]
            part = self.topics.get(p.topic)
            if not fut.done():
                fut.add_done_callback(_consume_exception)
                late = RequestTimedOut(f"write not completed within {req.timeout_ms} ms")
                results[i] = m.ProducePartitionResult(topic=p.topic, partition=p.partition, **_err(late))
            elif fut.exception() is not None:
                results[i] = m.ProducePartitionResult(topic=p.topic, partition=p.partition, **_err(fut.exception()))
            else:
                r = fut.result()
                start = part.partitions[p.partition].log_start_offset if part else -1
                results[i] = m.ProducePartitionResult(
                    topic=p.topic, partition=p.partition, base_offset=r.base_offset,
                    log_append_time=r.append_time, log_start_offset=start,
                )
        return m.ProduceResponse(partitions=results), ()

    async def fetch(self, req: m.FetchRequest, _att):
        """Long poll: answer once ``min_bytes`` are there or ``max_wait_ms`` has passed."""
        if len({(fp.topic, fp.partition) for fp in req.partitions}) != len(req.partitions):
            raise InvalidRequest("a fetch names a partition more than once")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(req.max_wait_ms, 0) / 1000
        while True:
            results, blobs, size = await self._fetch_once(req)
            remaining = deadline - loop.time()
            if size >= req.min_bytes or remaining <= 0 or self._draining or any(r.error for r in results):
                return m.FetchResponse(partitions=results), blobs
            woken = loop.create_future()

            def wake(fut=woken):
                if not fut.done():
                    fut.set_result(None)

            parts = [self.partition(fp.topic, fp.partition) for fp in req.partitions]
            for part in parts:
                part.add_waiter(wake)
            try:
                await asyncio.wait_for(woken, remaining)
            except TimeoutError:
                pass
            finally:
                for part in parts:
                    part.remove_waiter(wake)

    async def _fetch_once(self, req: m.FetchRequest):
        """One pass over the partitions, within the request's byte budget.

        The budget is ``max_bytes`` capped below the frame size; each partition reads at
        most its own ``max_bytes`` of what is left.  Only the first partition with data may
        go over (by at most one batch, itself capped by max.message.bytes) so a consumer
        always makes progress; partitions after the budget is spent get no data this time.
        """
        results, blobs, size = [], [], 0
        frame = self.config.max_frame_bytes
        budget = min(req.max_bytes, max(frame // 2, frame - FETCH_OVERHEAD))
        for fp in req.partitions:
            try:
                part = self.partition(fp.topic, fp.partition)
                limit = min(fp.max_bytes, budget - size)
                if size and limit <= 0:
                    results.append(m.FetchPartitionResult(
                        topic=fp.topic, partition=fp.partition, high_watermark=part.high_watermark,
                        log_start_offset=part.log_start_offset,
                    ))
                    continue
                try:
                    res = await part.read(fp.offset, max(limit, 1))
                except OutOfRange:
                    raise OffsetOutOfRange(
                        f"offset {fp.offset} of {fp.topic}-{fp.partition} is outside "
                        f"[{part.log_start_offset}, {part.high_watermark}]"
                    ) from None
                except OSError as exc:
                    raise storage_error_from_os(exc, f"read {fp.topic}-{fp.partition}") from exc
            except BrokerError as exc:
                results.append(m.FetchPartitionResult(topic=fp.topic, partition=fp.partition, **_err(exc)))
                continue
            data = res.data
            results.append(
                m.FetchPartitionResult(
                    topic=fp.topic, partition=fp.partition, high_watermark=res.high_watermark,
                    log_start_offset=res.log_start_offset, size=len(data),
                )
            )
            if data:
                blobs.append(data)
            size += len(data)
        return results, blobs, size

    async def list_offsets(self, req: m.ListOffsetsRequest, _att):
        out = []
        for lp in req.partitions:
            try:
                part = self.partition(lp.topic, lp.partition)
                ts = -1
                if lp.timestamp == m.EARLIEST:
                    offset = part.log_start_offset
                elif lp.timestamp == m.LATEST:
                    offset = part.high_watermark
                elif lp.timestamp < 0:
                    raise InvalidRequest(f"bad timestamp {lp.timestamp}: use -1, -2 or ms since the epoch")
                else:
                    found = await part.offset_for_time(lp.timestamp)
                    offset = part.high_watermark if found is None else found
                    ts = lp.timestamp if found is not None else -1
                out.append(m.ListOffsetsResult(topic=lp.topic, partition=lp.partition, offset=offset, timestamp=ts))
            except BrokerError as exc:
                out.append(m.ListOffsetsResult(topic=lp.topic, partition=lp.partition, **_err(exc)))
        return m.ListOffsetsResponse(partitions=out), ()

    async def offset_commit(self, req: m.OffsetCommitRequest, _att):
        check_group_name(req.group)
        now_ms, client = int(time.time() * 1000), client_address.get()
        ok: dict = {}
        results = []
        for c in req.offsets:
            try:
                self.partition(c.topic, c.partition)
                if c.offset < 0:
                    raise InvalidRequest(f"cannot commit negative offset {c.offset}")
                if len(c.metadata) > MAX_COMMIT_METADATA:
                    raise InvalidRequest(f"commit metadata is limited to {MAX_COMMIT_METADATA} characters")
                ok[(c.topic, c.partition)] = Committed(c.offset, c.metadata, now_ms, client)
                results.append(m.PartitionError(topic=c.topic, partition=c.partition))
            except BrokerError as exc:
                results.append(m.PartitionError(topic=c.topic, partition=c.partition, **_err(exc)))
        if ok:
            try:
                await self.groups.commit(req.group, ok)
            except BrokerError as exc:
                results = [
                    r if r.error else m.PartitionError(topic=r.topic, partition=r.partition, **_err(exc))
                    for r in results
                ]
        return m.OffsetCommitResponse(partitions=results), ()

    async def offset_fetch(self, req: m.OffsetFetchRequest, _att):
        committed = self.groups.get(req.group)
        keys = committed.keys() if req.partitions is None else [(tp.topic, tp.partition) for tp in req.partitions]
        out = []
        for key in sorted(keys):
            c = committed.get(key, Committed(-1))
            out.append(m.FetchedOffset(topic=key[0], partition=key[1], offset=c.offset, metadata=c.metadata))
        return m.OffsetFetchResponse(offsets=out), ()

    def handlers(self) -> dict:
        """API key -> handler: the dispatch table of the server connection."""
        return {
            m.Api.API_VERSIONS: self.api_versions,
            m.Api.METADATA: self.metadata_,
            m.Api.CREATE_TOPICS: self.create_topics,
            m.Api.DELETE_TOPICS: self.delete_topics,
            m.Api.DESCRIBE_TOPICS: self.describe_topics,
            m.Api.PRODUCE: self.produce,
            m.Api.FETCH: self.fetch,
            m.Api.LIST_OFFSETS: self.list_offsets,
            m.Api.OFFSET_COMMIT: self.offset_commit,
            m.Api.OFFSET_FETCH: self.offset_fetch,
            m.Api.LIST_GROUPS: self.list_groups,
            m.Api.DESCRIBE_GROUPS: self.describe_groups,
            m.Api.DELETE_GROUPS: self.delete_groups,
            m.Api.ALTER_TOPIC_CONFIGS: self.alter_topic_configs,
            m.Api.CREATE_PARTITIONS: self.create_partitions,
        }


def _consume_exception(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
