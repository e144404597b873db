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
    <data>/logs/__txn_discarded-0/  half messages given up after their checks (audit copies;
                                   broker/transactions.py); transactions themselves live in
                                   their data partitions
    subscriptions: no files; their cursors are control batches in the data partitions
                                   (broker/subscriptions.py, protocol/subscriptions.py)
    <data>/groups.migrated/        group offset files of older brokers, kept after their
                                   import into __groups (broker/group_migration.py)

All durable broker state lives in partitions: internal topics (``__groups``) are created at
start when missing, like any topic but with ``internal`` set; clients may read them, only
brokers write them.  The ``__groups`` partitions a broker leads make it the coordinator of
their groups (``GroupCoordinator.load`` / ``unload`` follow leadership).

Metadata lives in a ``MetadataStore`` (cluster/store.py): the data directory by default, or
etcd with ``sluice serve --cluster etcd://...``.  Either way the broker runs the same
replication: a single broker is a cluster of one, where every partition has one replica
and its own log end is its high watermark.  Partitions are replicated by their followers
pulling from the leader (broker/fetcher.py); states, the ISR and the replica APIs are in
broker/replication.py; the controller (cluster/controller.py), elected through the store,
moves leadership when brokers come and go; the replicas of brokers that left are replaced
on request, and every broker applies changed replica lists (broker/reassignment.py).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.delays import DelayedDelivery
from sluice.broker.fetch import FetchService
from sluice.broker.group_migration import migrate_legacy_groups
from sluice.broker.groups import GroupService
from sluice.broker.handoff import hand_off
from sluice.broker.liveness import PeerLiveness
from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.produce import ProduceService
from sluice.broker.reassignment import Reassignment
from sluice.broker.registry import Topic, TopicRegistry
from sluice.broker.replication import ReplicaManager
from sluice.broker.stepdown import DiskStepDown
from sluice.broker.subscriptions import SubscriptionManager
from sluice.broker.topics import INTERNAL_REPLICAS, TopicAdmin
from sluice.broker.transactions import TransactionManager
from sluice.broker.wait import wait_event
from sluice.cluster import open_store
from sluice.cluster.controller import Controller
from sluice.cluster.store import BrokerRegistration, MetadataStore
from sluice.config import ServerConfig, TopicConfig
from sluice.errors import (
    ClusterIdMismatch,
    ConfigError,
    MetadataUnavailable,
    TopicAlreadyExists,
)
from sluice.protocol import messages as m
from sluice.protocol.coordinator import GROUPS_TOPIC
from sluice.storage import faults, identity
from sluice.storage.checkpoint import read_offsets, write_offsets
from sluice.storage.syncer import Syncer

log = logging.getLogger("sluice.broker")

HW_CHECKPOINT = "replication-offset-checkpoint"
CONTROLLER_POLL_S = 1.0
STORE_RETRY_S = 0.5  # asking whether the store is still this cluster's, while it does not answer
STORE_CHECK_S = 5.0  # ... and asking again while it does
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


class Broker(TopicAdmin, ReplicaManager, Reassignment):
    """Topics and partitions, lifecycle, lookups and the API dispatch table.

    The handlers live by concept in topics.py, replication.py, groups.py, produce.py and
    fetch.py.
    """

    def __init__(self, config: ServerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        faults.arm_from_env(self.data_dir)  # fault tests only (storage/faults.py)
        self.defaults = TopicConfig.parse(config.topic_defaults)
        self.registry = TopicRegistry()
        self.topics: dict[str, Topic] = self.registry.topics
        self.write_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="sluice-write")
        self.read_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="sluice-read")
        # the fsyncs that acknowledgements wait for: native threads, no GIL (storage/syncer.py)
        self.syncer = Syncer(config.io_threads, self.write_executor)
        # metadata writes, directory moves and deletions: never in the way of produce / fetch
        self.housekeeping = ThreadPoolExecutor(1, thread_name_prefix="sluice-housekeeping")
        # log compaction: long passes, kept out of the way of metadata writes
        self.cleaner = ThreadPoolExecutor(1, thread_name_prefix="sluice-cleaner")
        self._admin_lock = asyncio.Lock()  # topic create / delete run one at a time
        self._draining = False  # shutdown began: fetches answer at once, no new leaderships
        self.metadata = store if store is not None else open_store(config)
        self.groups: GroupCoordinator | None = None
        self.host, self.port = config.host, config.port
        self.live_brokers: dict[int, BrokerRegistration] = {}  # by node id, as the store has them
        # ends the registration of a peer whose process is gone (broker/liveness.py)
        self.liveness = PeerLiveness(self.metadata, config.node_id) if config.cluster else None
        self.controller_id = -1
        # the last time (monotonic) the metadata store answered, and why it does not now;
        # None: it does
        self.store_unreachable: tuple[float, str] | None = None
        self.fetchers: dict = {}  # leader node id -> ReplicaFetcher (broker/fetcher.py)
        self.disk_step_down = DiskStepDown(self)  # leaders whose disk fails hand over (broker/stepdown.py)
        self.cluster_id: str | None = None  # the store's, as the data directory records it
        # called (once) with why the broker must stop (the server stops, then raises it);
        # a broker alone stays up, fenced: it deletes nothing the store no longer lists
        self.on_fatal: Callable[[BaseException], None] = lambda exc: None
        self._fenced: ClusterIdMismatch | None = None
        self._isr_check = asyncio.Event()  # wakes the ISR upkeep at once
        self._topics_stale = asyncio.Event()  # wakes the topic records' resync at once
        self._controller_changed = asyncio.Event()
        self.controller = Controller(
            self.metadata, config.node_id, config.leader_rebalance_interval_ms, self._controller_changed.set
        )
        self._tasks: list[asyncio.Task] = []
        self._started_at = time.monotonic()
        self._expired: list = []  # segments out of their logs whose files are still to delete
        self.checkpointed_hw: dict[tuple[str, int], int] = {}  # as last written (or read)
        self.transactions = TransactionManager(self)  # half messages (broker/transactions.py)
        self.produce_service = ProduceService(self.registry, self.transactions, self.metadata, self.store_is_ours)
        self.fetch_service = FetchService(self.registry, config.max_frame_bytes, lambda: self._draining)
        self.group_service = GroupService(self.registry, lambda: self.groups)
        self.subscriptions = SubscriptionManager(self)  # broker/subscriptions.py
        self.delays = DelayedDelivery(self.transactions)  # broker/delays.py

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
        try:
            self.checkpointed_hw = read_offsets(self._hw_path)
        except ValueError as exc:  # derived data: every partition starts from its log end
            log.error("%s; high watermarks start from the logs", exc)
        node = self.config.node_id
        claim = identity.claim(self.data_dir, node)  # ConfigError: another node's
        await self.metadata.start()
        try:
            self.cluster_id = await self.metadata.claim_cluster_id(claim.cluster_id)  # ClusterIdMismatch
            for other in await self.metadata.brokers():
                if other.node_id != node and (other.host, other.port) == (self.host, self.port):
                    raise ConfigError(
                        f"{self.host}:{self.port} is where live broker {other.node_id} is reached: clients and "
                        f"peers would reach it instead of node {node}; advertise this broker's own address"
                    )
            await self.metadata.register_broker(BrokerRegistration(node, self.host, self.port))  # NodeIdInUse
            if claim.new and self.config.cluster:  # embedded: the store is in the directory too
                await self._withdraw_lost_replicas()
            self.live_brokers = {b.node_id: b for b in await self.metadata.brokers()}
            for record in (await self.metadata.topics()).values():
                self._trash_unlisted(record)
                states = await self.metadata.partition_states(record.name)
                topic = await self._open_topic(record, states)
                for i in topic.partitions:
                    self._become(topic, i, states[i])
            if await self._ensure_internal_topics():
                await self._start_coordinator()
        except BaseException:
            await self._close_partitions()
            await self.metadata.close()
            raise
        identity.record(self.data_dir, node, self.cluster_id)
        for trash in (self.data_dir / "logs").glob(".trash-*"):  # deletions a crash interrupted
            asyncio.get_running_loop().run_in_executor(self.housekeeping, shutil.rmtree, trash, True)
        loop = asyncio.get_running_loop()
        for job in (
            self._retention_loop(), self._checkpoint_loop(), self._follow_states(), self._follow_brokers(),
            self._isr_loop(), self._resync_topics(), self.controller.run(), self._follow_controller(),
            self._groups_later(), self.transactions.run(), self.delays.run(), self.produce_service.reserve_producer_ids(),
            self._check_store_identity(),
        ):
            self._tasks.append(loop.create_task(job, name=job.__qualname__))

    async def store_is_ours(self, wait: bool = True) -> bool:
        """Whether the metadata store still holds this broker's cluster; asked before data
        is deleted because the store no longer lists it, and before what a wiped store
        would hand out again (producer ids, internal topics; storage/identity.py).  Waits
        while the store does not answer (``wait=False``: raises ``MetadataUnavailable``).
        On a mismatch (its metadata were wiped or replaced) it stops the broker through
        ``on_fatal`` and returns False: nothing may be deleted or created."""
        while self._fenced is None:
            try:
                await self.metadata.claim_cluster_id(self.cluster_id)
                return True
            except MetadataUnavailable:
                if not wait:
                    raise
                await asyncio.sleep(STORE_RETRY_S)
            except ClusterIdMismatch as exc:
                self._fenced = exc
                log.critical("%s; the broker stops, and keeps every replica it holds", exc)
                self.on_fatal(exc)
        return False

    async def _check_store_identity(self) -> None:
        """Every ``STORE_CHECK_S``, ``store_is_ours`` (a cluster only): a broker whose etcd
        came back empty stops even if no deletion reaches it, instead of serving a store
        that no longer lists its replicas."""
        while self.config.cluster and await self.store_is_ours():
            await asyncio.sleep(STORE_CHECK_S)

    async def _follow_brokers(self) -> None:
        """Keep ``live_brokers`` as the store has them."""
        while True:
            try:
                async for regs in self.metadata.watch_brokers():
                    self.live_brokers = {b.node_id: b for b in regs}
                    self._controller_changed.set()
                    if self.liveness is not None:
                        self.liveness.update(self.live_brokers)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following brokers failed; starting over")
                await asyncio.sleep(0.5)

    async def _follow_controller(self) -> None:
        """Keep ``controller_id`` as the store has it: looked up when brokers change and
        every ``CONTROLLER_POLL_S`` (an election need not change the brokers).  A lookup
        that fails sets ``store_unreachable`` (metadata answers say so), with the time of
        the last answer, until one succeeds."""
        answered_at = time.monotonic()
        while True:
            await wait_event(self._controller_changed, CONTROLLER_POLL_S)
            self._controller_changed.clear()
            try:
                controller = await self.metadata.controller()
            except MetadataUnavailable as exc:
                if self.store_unreachable is None:
                    log.warning("the metadata store does not answer: %s", exc.message)
                self.store_unreachable = (answered_at, exc.message)
                continue
            answered_at = time.monotonic()
            if self.store_unreachable is not None:
                log.warning("the metadata store answers again")
                self.store_unreachable = None
                if self.config.cluster and not await self.store_is_ours():  # an etcd back empty?
                    return
            self.controller_id = -1 if controller is None else controller

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
            alone = len(self.live_brokers) < INTERNAL_REPLICAS and self.config.cluster is not None
            if alone and time.monotonic() - self._started_at < INTERNAL_TOPIC_WAIT_S:
                return False
            new = m.NewTopic(name=GROUPS_TOPIC, partitions=self.config.groups_partitions, config=GROUPS_TOPIC_CONFIG)
            try:
                async with self._admin_lock:
                    await self._create_topic(new, validate_only=False, internal=True)
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
            topic = self.topics.get(GROUPS_TOPIC)
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
        if self.liveness is not None:
            await self.liveness.close()
        for f in self.fetchers.values():
            f.stop()
        await asyncio.gather(*(f.wait_stopped() for f in self.fetchers.values()))
        self.fetchers.clear()
        await self.subscriptions.close()
        await self.delays.close()
        await self.transactions.close()
        await self._close_partitions()
        try:
            await self.checkpoint_high_watermarks()
        except OSError as exc:
            log.error("cannot checkpoint high watermarks: %s", exc)
        await self.metadata.close()
        self.syncer.close()
        for executor in (self.write_executor, self.read_executor, self.housekeeping, self.cleaner):
            executor.shutdown(wait=True)

    async def _close_partitions(self) -> None:
        parts = [p for topic in self.topics.values() for p in topic.partitions.values()]
        results = await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        for p, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing %s-%d failed: %r", p.topic, p.index, result)

    def drain(self) -> None:
        """Shutdown has begun: every fetch long poll answers now with what it has (a client
        waiting for new records must not hold the shutdown for its ``max_wait_ms``), and so
        do fetches that come later; no partition state applied from now on makes this
        broker a leader, and it creates no topic (it would be gone before serving them)."""
        self._draining = True
        self.metadata.leaving()  # a session lost from now on is not replaced
        for topic in self.topics.values():
            for p in topic.partitions.values():
                p.wake_fetches()

    async def hand_off_leadership(self) -> int:
        """Shutdown: hand each partition led here to a live in-sync follower that fetches
        (broker/handoff.py); returns how many moved.  Call after ``drain``."""
        return await hand_off(self, self._become)

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
        hws = {(p.topic, p.index): p.high_watermark for t in self.topics.values() for p in t.partitions.values()}
        if hws == self.checkpointed_hw:
            return False
        await asyncio.get_running_loop().run_in_executor(self.housekeeping, write_offsets, self._hw_path, hws)
        self.checkpointed_hw = hws
        return True

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

    def topic(self, name: str) -> Topic:
        return self.registry.topic(name)

    def check_partition(self, topic: str, index: int) -> Topic:
        return self.registry.check_partition(topic, index)

    def partition(self, topic: str, index: int) -> Partition:
        return self.registry.partition(topic, index)

    def led_partition(self, topic: str, index: int) -> Partition:
        return self.registry.led_partition(topic, index)

    # ------------------------------------------------------------------ handlers

    async def api_versions(self, req: m.ApiVersionsRequest, _att, _peer: Peer):
        return m.ApiVersionsResponse(apis=m.supported_versions()), ()

    def handlers(self) -> dict:
        """API key -> handler: the dispatch table of the server connection."""
        return {
            m.Api.API_VERSIONS: self.api_versions,
            m.Api.METADATA: self.metadata_,
            m.Api.CREATE_TOPICS: self.create_topics,
            m.Api.DELETE_TOPICS: self.delete_topics,
            m.Api.DESCRIBE_TOPICS: self.describe_topics,
            **self.produce_service.handlers(),
            **self.fetch_service.handlers(),
            **self.group_service.handlers(),
            m.Api.ALTER_TOPIC_CONFIGS: self.alter_topic_configs,
            m.Api.CREATE_PARTITIONS: self.create_partitions,
            m.Api.REPLICA_FETCH: self.replica_fetch,
            m.Api.OFFSETS_FOR_LEADER_EPOCH: self.offsets_for_leader_epoch,
            m.Api.ELECT_LEADERS: self.elect_leaders,
            **self.transactions.handlers(),
            **self.subscriptions.handlers(),
        }

