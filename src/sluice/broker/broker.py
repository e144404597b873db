"""Broker: topics and their partitions, and the dispatch table of the APIs.

Handlers take a decoded request struct and the frame's attachments and return the response
struct plus the attachments to send (or None for a produce with ``acks=none``).  They raise
``BrokerError`` for request-level failures; per-partition failures go into the response.
The server connection (server/connection.py) owns bytes and sockets; this module owns none.

Data directory::

    <data>/meta/topics.json        topic definitions (cluster/embedded.py; none with etcd)
    <data>/logs/<topic>-<n>/       one partition log each (storage/log.py)
    <data>/logs/replication-offset-checkpoint   high watermarks (storage/checkpoint.py)
    <data>/logs/__groups-<n>/      committed offsets of consumer groups: the internal topic
                                   __groups (broker/coordinator.py, protocol/group_records.py)
    <data>/groups.migrated/        group offset files of older brokers, kept after their
                                   import into __groups (broker/group_migration.py)

All durable broker state lives in partitions: internal topics (``__groups``) are created at
start when missing, like any topic but with ``internal`` set; clients may read them, only
brokers write them.  The ``__groups`` partitions a broker leads make it the coordinator of
their groups (``GroupCoordinator.load`` / ``unload`` follow leadership).

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
import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.fetch import FetchHandlers
from sluice.broker.group_migration import migrate_legacy_groups
from sluice.broker.groups import GroupHandlers
from sluice.broker.partition import Partition
from sluice.broker.produce import ProduceHandler
from sluice.broker.topics import Topic, TopicAdmin, unknown_topic
from sluice.cluster import open_store
from sluice.cluster.store import BrokerRegistration, MetadataStore, TopicRecord
from sluice.config import ServerConfig, TopicConfig
from sluice.errors import UnknownPartition
from sluice.protocol import messages as m
from sluice.protocol.coordinator import GROUPS_TOPIC
from sluice.storage.checkpoint import read_offsets, write_offsets

log = logging.getLogger("sluice.broker")

HW_CHECKPOINT = "replication-offset-checkpoint"

# Group offsets are state, not data: compacted (the latest offset of each key is kept),
# never deleted by age or size, and fsynced before a commit is answered, whatever the
# broker's topic defaults say.
GROUPS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "flush.messages": "1",
}


class Broker(TopicAdmin, GroupHandlers, ProduceHandler, FetchHandlers):
    """Topics and partitions, lifecycle, lookups and the API dispatch table.

    The handlers live by concept in topics.py, groups.py, produce.py and fetch.py.
    """

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
        self.groups: GroupCoordinator | None = None
        self.host, self.port = config.host, config.port
        self._retention_task: asyncio.Task | None = None
        self._checkpoint_task: asyncio.Task | None = None
        self._expired: list = []  # segments out of their logs whose files are still to delete
        self.checkpointed_hw: dict[tuple[str, int], int] = {}  # as last written (or read)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the metadata store, register, open (recover) the logs of the topics this
        broker leads, create the internal topics when missing, load the groups of the
        ``__groups`` partitions it leads, and import group offset files of older brokers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        try:
            self.checkpointed_hw = read_offsets(self._hw_path)
        except ValueError as exc:  # derived data: every partition starts from its log end
            log.error("%s; high watermarks start from the logs", exc)
        await self.metadata.start()
        try:
            node = self.config.node_id
            await self.metadata.register_broker(BrokerRegistration(node, self.host, self.port))
            for record in (await self.metadata.topics()).values():
                if await self._leads(record):
                    await self._open_topic(record)
            await self._ensure_internal_topics()
            await self._start_coordinator()
        except BaseException:
            await asyncio.gather(
                *(p.close() for t in self.topics.values() for p in t.partitions), return_exceptions=True
            )
            await self.metadata.close()
            raise
        for trash in (self.data_dir / "logs").glob(".trash-*"):  # deletions a crash interrupted
            asyncio.get_running_loop().run_in_executor(self.housekeeping, shutil.rmtree, trash, True)
        self._retention_task = asyncio.get_running_loop().create_task(self._retention_loop())
        self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint_loop())

    async def _ensure_internal_topics(self) -> None:
        """Create ``__groups`` (``groups_partitions`` partitions, compacted) unless the
        cluster has it, through the normal creation path.  An existing one keeps its
        partition count: groups are placed by it."""
        record = (await self.metadata.topics()).get(GROUPS_TOPIC)
        if record is None:
            new = m.NewTopic(name=GROUPS_TOPIC, partitions=self.config.groups_partitions, config=GROUPS_TOPIC_CONFIG)
            async with self._admin_lock:
                await self._create_topic(new, validate_only=False, internal=True)
        elif record.partitions != self.config.groups_partitions:
            log.warning(
                "%s has %d partitions; --groups-partitions %d applies only when it is created",
                GROUPS_TOPIC, record.partitions, self.config.groups_partitions,
            )

    async def _start_coordinator(self) -> None:
        """Load the groups of the ``__groups`` partitions this broker leads, then import the
        group offset files of older brokers (broker/group_migration.py)."""
        count = (await self.metadata.topics())[GROUPS_TOPIC].partitions

        def replica(p: int) -> Partition | None:
            topic = self.topics.get(GROUPS_TOPIC)
            return topic.partitions[p] if topic is not None and p < len(topic.partitions) else None

        self.groups = GroupCoordinator(replica, count, self.read_executor, self.config.node_id)
        led = [p for p in range(count) if (part := replica(p)) is not None and part.is_leader]
        await asyncio.gather(*(self.groups.load(p) for p in led))
        await migrate_legacy_groups(self.data_dir, self.groups, self.housekeeping)

    async def close(self) -> None:
        """Finish queued writes, fsync and close every partition."""
        for task in (self._retention_task, self._checkpoint_task):
            if task:
                task.cancel()
        parts = [p for topic in self.topics.values() for p in topic.partitions]
        results = await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        for p, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing %s-%d failed: %r", p.topic, p.index, result)
        try:
            await self.checkpoint_high_watermarks()
        except OSError as exc:
            log.error("cannot checkpoint high watermarks: %s", exc)
        await self.metadata.close()
        for executor in (self.write_executor, self.read_executor, self.housekeeping):
            executor.shutdown(wait=True)

    def drain(self) -> None:
        """Shutdown has begun: every fetch long poll answers now with what it has (a client
        waiting for new records must not hold the shutdown for its ``max_wait_ms``), and so
        do fetches that come later."""
        self._draining = True
        for topic in self.topics.values():
            for p in topic.partitions:
                p.wake_fetches()

    async def _leads(self, record: TopicRecord) -> bool:
        """Whether this broker leads every partition of the topic (see the module docstring)."""
        states = await self.metadata.partition_states(record.name)
        if all(s.leader == self.config.node_id for s in states):
            return True
        log.info("topic %s is served by broker %s, not this one", record.name, states[0].leader)
        return False

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_ms / 1000)
            try:
                await self.enforce_retention()
            except Exception:  # keep enforcing: the cause (a full or read-only disk) may pass
                log.exception("retention pass failed")

    @property
    def _hw_path(self) -> Path:
        return self.data_dir / "logs" / HW_CHECKPOINT

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.hw_checkpoint_ms / 1000)
            try:
                await self.checkpoint_high_watermarks()
            except OSError as exc:  # keep trying: the cause (a full disk) may pass
                log.error("cannot checkpoint high watermarks: %s", exc)

    async def checkpoint_high_watermarks(self) -> bool:
        """Write every partition's high watermark (tmp + fsync + rename) if one changed
        since the last write; True if written.  Partitions reopen at min(checkpoint, log
        end)."""
        hws = {(p.topic, p.index): p.high_watermark for t in self.topics.values() for p in t.partitions}
        if hws == self.checkpointed_hw:
            return False
        await asyncio.get_running_loop().run_in_executor(self.housekeeping, write_offsets, self._hw_path, hws)
        self.checkpointed_hw = hws
        return True

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
                seg.close()  # now, or when its last reader is done
                deleted += 1
            except OSError as exc:
                log.error("cannot delete expired segment %s: %s; will retry", seg.path, exc)
                self._expired.append(seg)
        return deleted

    # ------------------------------------------------------------------ lookups

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            raise unknown_topic(name)
        return t

    def partition(self, topic: str, index: int) -> Partition:
        t = self.topic(topic)
        if not 0 <= index < len(t.partitions):
            raise UnknownPartition(f"topic {topic!r} has partitions 0-{len(t.partitions) - 1}, not {index}")
        return t.partitions[index]

    # ------------------------------------------------------------------ handlers

    async def api_versions(self, req: m.ApiVersionsRequest, _att):
        return m.ApiVersionsResponse(apis=m.supported_versions()), ()

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

