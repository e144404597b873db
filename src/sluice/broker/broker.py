"""Broker: lifecycle and the dispatch table; the services do the work.

A handler is a function ``handler(request, attachments, peer)`` (broker/peer.py) returning
the response struct plus the attachments to send (or None for a produce with
``acks=none``).  It raises ``BrokerError`` for request-level failures; per-item failures go
into the response.  The server connection (server/connection.py) owns bytes and sockets;
the broker owns none, and a second front door calls the same handlers.

The broker builds its services, each with the collaborators its constructor names::

    ClusterView          broker/membership.py   live brokers, controller, store state
    TopicRegistry        broker/registry.py     topics known, partitions held, their dirs
    ReplicationService   broker/replication/    states, leader and follower sides, moves
    TopicService         broker/topics.py       topic admin APIs and topic lifecycle
    ProduceService       broker/produce.py      PRODUCE, producer ids, in-process append
    FetchService         broker/fetch.py        FETCH, LIST_OFFSETS
    GroupService         broker/groups.py       committed offsets (GroupCoordinator)
    TransactionManager   broker/transactions/  half messages
    SubscriptionManager  broker/subscriptions/
    DelayedDelivery      broker/transactions/delays.py

``handlers()`` maps each API key to its service's handler.  Lifecycle (``start``,
``drain``, ``hand_off_leadership``, ``close``), retention and the high watermarks
checkpoint stay here.

Data directory::

    <data>/meta/topics.json        topic definitions (cluster/embedded.py; none with etcd)
    <data>/logs/<topic>-<n>/       one partition log each (storage/log.py)
    <data>/logs/replication-offset-checkpoint   high watermarks (storage/checkpoint.py)
    <data>/logs/__groups-<n>/      committed offsets of consumer groups: the internal topic
                                   __groups (broker/coordinator.py, protocol/group_records.py)
    <data>/logs/__txn_discarded-0/  half messages given up after their checks (audit copies;
                                   broker/transactions/); transactions themselves live in
                                   their data partitions
    subscriptions: no files; their cursors are control batches in the data partitions
                                   (broker/subscriptions/, protocol/subscriptions.py)
    <data>/groups.migrated/        group offset files of older brokers, kept after their
                                   import into __groups (broker/group_migration.py)

All durable broker state lives in partitions: internal topics (``__groups``) are created at
start when missing, like any topic but with ``internal`` set; clients may read them, only
brokers write them.  The ``__groups`` partitions a broker leads make it the coordinator of
their groups (``GroupCoordinator.load`` / ``unload`` follow leadership).

Metadata lives in a ``MetadataStore`` (cluster/store.py): the data directory by default, or
etcd with ``sluice serve --cluster etcd://...``.  Either way the broker runs the same
replication (broker/replication/); the controller (cluster/controller.py), elected through
the store, moves leadership when brokers come and go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.fetch import FetchService
from sluice.broker.group_migration import migrate_legacy_groups
from sluice.broker.groups import GroupService
from sluice.broker.liveness import PeerLiveness
from sluice.broker.membership import ClusterView
from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.produce import ProduceService
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.replication import ReplicationService
from sluice.broker.subscriptions import SubscriptionManager
from sluice.broker.topics import INTERNAL_REPLICAS, TopicService
from sluice.broker.transactions import DelayedDelivery, TransactionManager
from sluice.cluster import open_store
from sluice.cluster.controller import Controller
from sluice.cluster.store import BrokerRegistration, MetadataStore
from sluice.config import ServerConfig, TopicConfig
from sluice.errors import ConfigError, StorageError, TopicAlreadyExists
from sluice.protocol import messages as m
from sluice.protocol.coordinator import GROUPS_TOPIC
from sluice.storage import faults, identity
from sluice.storage.syncer import Syncer

log = logging.getLogger("sluice.broker")

GROUPS_WARN_EVERY_S = 30.0  # "cannot start the group coordinator yet", at most one per this
INTERNAL_TOPIC_WAIT_S = 10.0  # __groups waits for INTERNAL_REPLICAS live brokers, at most this long


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("loading groups failed: %r", task.exception())

# Group offsets are state, not data: compacted (the latest offset of each key is kept),
# never deleted by age or size, and fsynced before a commit is answered, whatever the
# broker's topic defaults say.
GROUPS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "flush.messages": "1",
}


class Broker:
    """Lifecycle and the API dispatch table over the broker's services (module docstring)."""

    def __init__(self, config: ServerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        faults.arm_from_env(self.data_dir)  # fault tests only (storage/faults.py)
        self.defaults = TopicConfig.parse(config.topic_defaults)
        self.write_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="sluice-write")
        self.read_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="sluice-read")
        # the fsyncs that acknowledgements wait for: native threads, no GIL (storage/syncer.py)
        self.syncer = Syncer(config.io_threads, self.write_executor)
        # metadata writes, directory moves and deletions: never in the way of produce / fetch
        self.housekeeping = ThreadPoolExecutor(1, thread_name_prefix="sluice-housekeeping")
        # log compaction: long passes, kept out of the way of metadata writes
        self.cleaner = ThreadPoolExecutor(1, thread_name_prefix="sluice-cleaner")
        self._admin_lock = asyncio.Lock()  # topic changes and partition states apply one at a time
        self.metadata = store if store is not None else open_store(config)
        self.groups: GroupCoordinator | None = None
        self.host, self.port = config.host, config.port
        # ends the registration of a peer whose process is gone (broker/liveness.py)
        liveness = PeerLiveness(self.metadata, config.node_id) if config.cluster else None
        self.view = ClusterView(self.metadata, bool(config.cluster), liveness)
        self.controller = Controller(
            self.metadata, config.node_id, config.leader_rebalance_interval_ms, self.view.controller_changed.set
        )
        self._tasks: list[asyncio.Task] = []
        self._started_at = time.monotonic()
        self._expired: list = []  # segments out of their logs whose files are still to delete
        self.registry = TopicRegistry(
            config, self.defaults, self.write_executor, self.read_executor, self.syncer, self.housekeeping,
            on_disk_failure=self._disk_failed, on_config_changed=self.controller.config_changed,
        )
        self.topics: dict[str, Topic] = self.registry.topics  # (the same dict, never replaced)
        self.transactions = TransactionManager(  # half messages (broker/transactions/)
            self.topics, self.registry.led_partition, self.read_executor,
            check_timeout_ms=config.txn_check_timeout_ms, check_interval_ms=config.txn_check_interval_ms,
            max_checks=config.txn_max_checks, create_topic=self._create_topic, admin_lock=self._admin_lock,
            stored_topics=self.metadata.topics, groups_ready=lambda: self.groups is not None,
            append=self._append, new_producer_id=self._new_producer_id,
            live_brokers=lambda: self.view.live_brokers, node_id=config.node_id,
        )
        self.subscriptions = SubscriptionManager(  # broker/subscriptions/
            self.topics, self.registry.led_partition, self.read_executor,
            create_topic=self._create_topic, admin_lock=self._admin_lock,
            append=self._append, new_producer_id=self._new_producer_id,
            live_brokers=lambda: self.view.live_brokers, node_id=config.node_id,
        )
        self.delays = DelayedDelivery(self.transactions)  # broker/transactions/delays.py
        self.replication = ReplicationService(
            config, self.metadata, self.registry, self.view, self._admin_lock, self.controller,
            self._leadership_changed, self._forget_topic,
        )
        self.topic_service = TopicService(
            config, self.registry, self.view, self.metadata, self._admin_lock, self.replication,
            self.subscriptions, self._coordinator,
        )
        self.produce_service = ProduceService(
            self.registry, self.transactions, self.metadata, self.view.store_is_ours
        )
        self.fetch_service = FetchService(self.registry, config.max_frame_bytes, self._draining)
        self.group_service = GroupService(self.registry, self._coordinator)

    # Late-bound collaborators: the partitions' disk failures reach replication, which is
    # built after the registry that opens them; replication's deletions reach the topic
    # service, which is built after it (and asks it to ``become``).

    def _disk_failed(self, part: Partition, err: StorageError) -> None:
        self.replication.disk_failed(part, err)

    async def _forget_topic(self, name: str) -> None:
        await self.topic_service.forget_topic(name)

    async def _append(self, topic: str, partition: int, data: bytearray, acks_all: bool) -> int:
        # the broker's own writes (broker/internal_writes.py ``Append``): the produce service's
        return (await self.produce_service.append(topic, partition, data, acks_all)).base_offset

    async def _new_producer_id(self) -> int:
        # the broker's own writes' producer id (broker/internal_writes.py): the produce service's
        return await self.produce_service.new_producer_id()

    def _coordinator(self) -> GroupCoordinator | None:
        return self.groups

    def _draining(self) -> bool:
        return self.view.draining

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the metadata store, register, open (recover) the partitions held here and
        take their roles, create the internal topics when missing, and load the groups of
        the ``__groups`` partitions led here (importing group offset files of older
        brokers); then follow the cluster.

        The cluster's id is checked first (``ClusterIdMismatch``; a store without one gets
        it).  Nothing else is written to the cluster's metadata before the registration: it
        is what refuses a node id that a live broker holds (``NodeIdInUse``), and a refused
        start must change nothing (the withdrawal of a new data directory's replicas comes after
        it; until then the broker has opened no partition, so it serves none of them)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        self.registry.read_checkpoint()
        node = self.config.node_id
        claim = identity.claim(self.data_dir, node)  # ConfigError: another node's
        await self.metadata.start()
        try:
            self.view.cluster_id = await self.metadata.claim_cluster_id(claim.cluster_id)  # ClusterIdMismatch
            for other in await self.metadata.brokers():
                if other.node_id != node and (other.host, other.port) == (self.host, self.port):
                    raise ConfigError(
                        f"{self.host}:{self.port} is where live broker {other.node_id} is reached: clients and "
                        f"peers would reach it instead of node {node}; advertise this broker's own address"
                    )
            await self.metadata.register_broker(BrokerRegistration(node, self.host, self.port))  # NodeIdInUse
            if claim.new and self.config.cluster:  # embedded: the store is in the directory too
                await self.replication.withdraw_lost_replicas()
            self.view.live_brokers = {b.node_id: b for b in await self.metadata.brokers()}
            for record in (await self.metadata.topics()).values():
                self.replication.trash_unlisted(record)
                states = await self.metadata.partition_states(record.name)
                topic = await self.registry.open_topic(record, states)
                for i in topic.partitions:
                    self.replication.become(topic, i, states[i])
            if await self._ensure_internal_topics():
                await self._start_coordinator()
        except BaseException:
            await self.registry.close_all()
            await self.metadata.close()
            raise
        identity.record(self.data_dir, node, self.view.cluster_id)
        self.registry.empty_trash()  # deletions a crash interrupted
        loop = asyncio.get_running_loop()
        for job in (
            self._retention_loop(), self._checkpoint_loop(), *self.replication.loops(), self.view.follow_brokers(),
            self.controller.run(), self.view.follow_controller(), self._groups_later(), self.transactions.run(),
            self.delays.run(), self.produce_service.reserve_producer_ids(), self.view.check_store_identity(),
        ):
            self._tasks.append(loop.create_task(job, name=job.__qualname__))

    async def _ensure_internal_topics(self) -> bool:
        """Create ``__groups`` (``groups_partitions`` partitions, compacted) unless the
        cluster has it, through the normal creation path; True once it exists.  An
        existing one keeps its partition count: groups are placed by it.

        In a cluster it waits (False) until ``INTERNAL_REPLICAS`` brokers are alive, or
        ``INTERNAL_TOPIC_WAIT_S`` after this broker started: the first broker of a new
        cluster would otherwise create it with a single replica.  Created with fewer live
        brokers than its factor, it records the factor and the controller adds replicas as
        brokers arrive (cluster/strength.py)."""
        record = (await self.metadata.topics()).get(GROUPS_TOPIC)
        if record is None:
            alone = len(self.view.live_brokers) < INTERNAL_REPLICAS and self.config.cluster is not None
            if alone and time.monotonic() - self._started_at < INTERNAL_TOPIC_WAIT_S:
                return False
            new = m.NewTopic(name=GROUPS_TOPIC, partitions=self.config.groups_partitions, config=GROUPS_TOPIC_CONFIG)
            try:
                async with self._admin_lock:
                    await self.topic_service.create_topic(new, validate_only=False, internal=True)
            except TopicAlreadyExists:  # another broker was first
                pass
        elif record.partitions != self.config.groups_partitions:
            log.warning(
                "%s has %d partitions; --groups-partitions %d applies only when it is created",
                GROUPS_TOPIC, record.partitions, self.config.groups_partitions,
            )
        return True

    async def _groups_later(self) -> None:
        """Start the group coordinator once ``__groups`` exists (a cluster's first brokers
        wait for each other; see ``_ensure_internal_topics``).  Why it cannot yet is a
        warning at most every ``GROUPS_WARN_EVERY_S`` (the tries go on every second)."""
        warned_at = -GROUPS_WARN_EVERY_S
        while self.groups is None:
            await asyncio.sleep(1.0)
            try:
                if await self._ensure_internal_topics():
                    async with self._admin_lock:  # the topic is opened by then
                        await self._start_coordinator()
            except Exception as exc:  # noqa: BLE001 - retried: the store or a broker may be back
                quiet = time.monotonic() - warned_at < GROUPS_WARN_EVERY_S
                warned_at = warned_at if quiet else time.monotonic()
                (log.debug if quiet else log.warning)("cannot start the group coordinator yet: %s", exc)

    def _leadership_changed(self, part: Partition) -> None:
        """A partition held here began or stopped leading: the coordinator follows its
        ``__groups`` partitions; the subscriptions of a partition no longer led stop."""
        self.subscriptions.leadership_changed(part)
        if part.topic != GROUPS_TOPIC or self.groups is None:
            return
        if part.is_leader:
            task = asyncio.ensure_future(self.groups.load(part.index))
            task.add_done_callback(_log_failure)
        else:
            self.groups.unload(part.index)

    async def _start_coordinator(self) -> None:
        """Load the groups of the ``__groups`` partitions this broker leads, then import the
        group offset files of older brokers (broker/group_migration.py)."""
        count = (await self.metadata.topics())[GROUPS_TOPIC].partitions

        def replica(p: int) -> Partition | None:
            topic = self.registry.topics.get(GROUPS_TOPIC)
            return topic.partitions.get(p) if topic is not None else None

        self.groups = GroupCoordinator(replica, count, self.read_executor, self.config.node_id)
        led = [p for p in range(count) if (part := replica(p)) is not None and part.is_leader]
        await asyncio.gather(*(self.groups.load(p) for p in led))
        await migrate_legacy_groups(self.data_dir, self.groups, self.housekeeping)

    async def close(self) -> None:
        """Stop following the cluster, finish queued writes, fsync and close every partition."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.view.liveness is not None:
            await self.view.liveness.close()
        await self.replication.close()
        await self.subscriptions.close()
        await self.delays.close()
        await self.transactions.close()
        await self.registry.close_all()
        try:
            await self.registry.checkpoint_high_watermarks()
        except OSError as exc:
            log.error("cannot checkpoint high watermarks: %s", exc)
        await self.metadata.close()
        self.syncer.close()
        for executor in (self.write_executor, self.read_executor, self.housekeeping, self.cleaner):
            executor.shutdown(wait=True)

    def drain(self) -> None:
        """Shutdown has begun: every fetch long poll answers now with what it has (a client
        waiting for new records must not hold the shutdown for its ``max_wait_ms``), and so
        do fetches that come later; no partition state applied from now on makes this
        broker a leader, and it creates no topic (it would be gone before serving them)."""
        self.view.draining = True
        self.metadata.leaving()  # a session lost from now on is not replaced
        for p in self.registry.all_held():
            p.wake_fetches()

    async def hand_off_leadership(self) -> int:
        """Shutdown: hand each partition led here to a live in-sync follower that fetches
        (broker/replication/handoff.py); returns how many moved.  Call after ``drain``."""
        return await self.replication.hand_off()

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_ms / 1000)
            try:
                await self.enforce_retention()
            except Exception:  # keep enforcing: the cause (a full or read-only disk) may pass
                log.exception("retention pass failed")

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.hw_checkpoint_ms / 1000)
            try:
                await self.registry.checkpoint_high_watermarks()
            except OSError as exc:  # keep trying: the cause (a full disk) may pass
                log.error("cannot checkpoint high watermarks: %s", exc)

    async def enforce_retention(self) -> int:
        """Delete segments past retention and compact dirty compacted partitions; returns how
        many file sets were deleted.

        Segments leave the log at once; their files are unlinked off the event loop, and a
        deletion that fails is retried on the next pass.  Partitions with
        ``cleanup.policy=compact`` lose no segment to retention: the log cleaner runs on
        them instead (Partition.clean), one at a time in the cleaner thread, and this pass
        waits for them.
        """
        loop = asyncio.get_running_loop()
        now = int(time.time() * 1000)
        for topic in list(self.topics.values()):
            for p in topic.partitions.values():
                self._expired.extend(p.take_expired(now))
        for topic in list(self.topics.values()):
            for p in list(topic.partitions.values()):
                try:
                    freed = await p.clean(self.cleaner, now)
                except Exception:  # noqa: BLE001 - one partition's failure must not stop the others
                    log.exception("cleaning %s-%d failed; will retry", p.topic, p.index)
                    continue
                if freed:
                    log.info("cleaned %s-%d: %d bytes freed", p.topic, p.index, freed)
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
    # (the replicas held here, for tests and tools; late-bound topic creation for the
    # subscription and transaction managers, built before the topic service)

    @property
    def store_unreachable(self) -> tuple[float, str] | None:
        """Since when (monotonic) and why the metadata store does not answer; None: it does."""
        return self.view.store_unreachable

    @property
    def on_fatal(self):
        """Called (once) with why the broker must stop (server/app.py sets it)."""
        return self.view.on_fatal

    @on_fatal.setter
    def on_fatal(self, callback) -> None:
        self.view.on_fatal = callback

    def partition(self, topic: str, index: int) -> Partition:
        return self.registry.partition(topic, index)

    def led_partition(self, topic: str, index: int) -> Partition:
        return self.registry.led_partition(topic, index)

    async def _create_topic(self, new: m.NewTopic, validate_only: bool, internal: bool = False) -> None:
        await self.topic_service.create_topic(new, validate_only, internal)

    # ------------------------------------------------------------------ handlers

    async def api_versions(self, req: m.ApiVersionsRequest, _att, _peer: Peer):
        return m.ApiVersionsResponse(apis=m.supported_versions()), ()

    def handlers(self) -> dict:
        """API key -> handler: the dispatch table of the front doors."""
        return {
            m.Api.API_VERSIONS: self.api_versions,
            **self.topic_service.handlers(),
            **self.produce_service.handlers(),
            **self.fetch_service.handlers(),
            **self.group_service.handlers(),
            **self.replication.handlers(),
            **self.transactions.handlers(),
            **self.subscriptions.handlers(),
        }
