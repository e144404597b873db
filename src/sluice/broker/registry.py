"""The topics this broker knows and the partitions it holds: ``Topic`` and
``TopicRegistry``.

Every broker knows every topic of the cluster (``Topic``: its record and the state of each
partition, from the metadata store) and holds the partitions assigned to it
(``Topic.partitions``, by index).  The registry is where every service looks them up
(``topic``, ``partition``, ``led_partition``), and it opens, reconfigures and trashes the
partitions' directories; which partitions are held, and what role each has, is decided by
the topic service (broker/topics.py) and replication (broker/replication/).  The high
watermarks checkpoint (``replication-offset-checkpoint``) is read and written here:
partitions reopen at min(checkpoint, log end).  Event loop only; file work runs in the
executors it is given.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from sluice.broker.partition import Partition
from sluice.cluster.assignment import replica_load
from sluice.cluster.store import PartitionState, TopicRecord, unknown_topic
from sluice.config import ServerConfig, TopicConfig
from sluice.errors import InvalidPartitions, NotLeader, StorageError, unknown_partition
from sluice.storage.checkpoint import read_offsets, write_offsets
from sluice.storage.log import PartitionLog
from sluice.storage.syncer import Syncer

log = logging.getLogger("sluice.broker")

HW_CHECKPOINT = "replication-offset-checkpoint"


@dataclass
class Topic:
    """A topic of the cluster: its record, each partition's state, and the partitions this
    broker holds (a replica of), by index."""

    name: str
    config: TopicConfig
    record: TopicRecord
    states: list[PartitionState | None]
    partitions: dict[int, Partition] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        return self.record.internal

    @property
    def count(self) -> int:
        return self.record.partitions


class TopicRegistry:
    """The topics known here, by name (``topics``), lookups of their partitions, and the
    partitions' directories.

    Collaborators: ``config`` (node id, data directory, partition limits, tail cache);
    ``defaults``, the broker's topic defaults; ``write_executor`` / ``read_executor`` /
    ``syncer``, handed to each partition; ``housekeeping``, the thread for directory moves
    and deletions and the checkpoint; ``on_disk_failure(partition, error)``, handed to each
    partition (replication's step-down: broker/replication/stepdown.py);
    ``on_config_changed(record)``, told of every config applied to a live topic (the
    controller: an unclean election may be allowed now)."""

    def __init__(
        self, config: ServerConfig, defaults: TopicConfig, write_executor: Executor, read_executor: Executor,
        syncer: Syncer, housekeeping: Executor, on_disk_failure: Callable[[Partition, StorageError], None],
        on_config_changed: Callable[[TopicRecord], None],
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.data_dir = Path(config.data_dir)
        self.defaults = defaults
        self.write_executor = write_executor
        self.read_executor = read_executor
        self.syncer = syncer
        self.housekeeping = housekeeping
        self._on_disk_failure = on_disk_failure
        self._on_config_changed = on_config_changed
        self.topics: dict[str, Topic] = {}
        self.checkpointed_hw: dict[tuple[str, int], int] = {}  # as last written (or read)

    def topic(self, name: str) -> Topic:
        """The topic (``UnknownTopic``)."""
        t = self.topics.get(name)
        if t is None:
            raise unknown_topic(name)
        return t

    def check_partition(self, topic: str, index: int) -> Topic:
        """The topic, if it has partition ``index`` (``UnknownTopic``, ``UnknownPartition``)."""
        t = self.topic(topic)
        if not 0 <= index < t.count:
            raise unknown_partition(topic, index, t.count)
        return t

    def partition(self, topic: str, index: int) -> Partition:
        """The replica of ``topic``-``index`` held here; ``NotLeader`` if none is."""
        p = self.check_partition(topic, index).partitions.get(index)
        if p is None:
            raise NotLeader(f"this broker holds no replica of {topic}-{index}")
        return p

    def led_partition(self, topic: str, index: int) -> Partition:
        """The partition if this broker leads it; ``NotLeader`` otherwise (consumers and
        producers talk to leaders only)."""
        p = self.partition(topic, index)
        if not p.is_leader:
            raise NotLeader(f"this broker does not lead {topic}-{index}")
        return p

    def all_held(self) -> list[Partition]:
        """Every partition held here."""
        return [p for t in self.topics.values() for p in t.partitions.values()]

    # ------------------------------------------------------------------ directories

    def log_dir(self, topic: str, index: int) -> Path:
        return self.data_dir / "logs" / f"{topic}-{index}"

    def held(self, record: TopicRecord, indexes: Iterable[int]) -> list[int]:
        """Which of ``indexes`` this broker holds a replica of."""
        return [i for i in indexes if self.node_id in record.assignment[i]]

    async def open_topic(self, record: TopicRecord, states: list[PartitionState] | None = None) -> Topic:
        """Know ``record`` and open the partitions this broker holds (as followers: their
        states make them leaders)."""
        config = TopicConfig.parse(record.config, self.defaults, stored=True)
        held = self.held(record, range(record.partitions))
        partitions = await self.open_partitions(record.name, held, config)
        topic = Topic(
            record.name, config, record,
            list(states) if states is not None else [None] * record.partitions,
            {p.index: p for p in partitions},
        )
        self.topics[record.name] = topic
        return topic

    async def open_partitions(self, name: str, indexes: Iterable[int], config: TopicConfig) -> list[Partition]:
        """Open (create or recover) partitions ``indexes`` of topic ``name``; all or none.
        They start as followers of no one: replication applies their state
        (broker/replication/states.py ``become``)."""
        loop = asyncio.get_running_loop()
        partitions = []
        try:
            for i in indexes:
                plog = await loop.run_in_executor(
                    self.write_executor, PartitionLog.open, self.log_dir(name, i),
                    config.log_config, self.checkpointed_hw.get((name, i)),
                )
                for cut in plog.cuts:
                    log.warning(
                        "partition %s-%d recovered: cut %d bytes at position %d of %s (%s)",
                        name, i, cut.dropped_bytes, cut.position, cut.segment.name, cut.reason,
                    )
                partitions.append(Partition(
                    name, i, plog, config, self.write_executor, self.read_executor,
                    replica_id=self.node_id, leader=False,
                    tail_cache_bytes=self.config.tail_cache_bytes, syncer=self.syncer,
                    on_disk_failure=self._on_disk_failure,
                ))
        except BaseException:
            await asyncio.gather(*(p.close() for p in partitions), return_exceptions=True)
            raise
        return partitions

    async def grow(self, topic: Topic, record: TopicRecord) -> None:
        """Another broker added partitions to ``topic``: open those held here."""
        current = topic.count
        held = self.held(record, range(current, record.partitions))
        new = await self.open_partitions(record.name, held, topic.config)
        topic.record = record
        topic.states.extend([None] * (record.partitions - current))
        for p in new:
            topic.partitions[p.index] = p

    def reconfigure(self, topic: Topic, record: TopicRecord) -> None:
        """Apply ``record``'s config (validated when it was stored) to a live topic."""
        topic.config = TopicConfig.parse(record.config, self.defaults, stored=True)
        topic.record = record
        for p in topic.partitions.values():
            p.reconfigure(topic.config)
        self._on_config_changed(record)

    def replica_load(self) -> dict[int, int]:
        """How many partition replicas each broker holds (to spread new ones evenly)."""
        return replica_load(t.record.assignment for t in self.topics.values())

    def check_capacity(self, more: int) -> None:
        held = sum(len(t.partitions) for t in self.topics.values())
        if held + more > self.config.max_partitions:
            raise InvalidPartitions(
                f"the broker holds {held} partitions; {more} more would pass its "
                f"limit of {self.config.max_partitions} (sluice serve --max-partitions)"
            )

    def set_aside_leftovers(self, name: str, indexes: Iterable[int]) -> None:
        """Move partition directories no topic owns (an interrupted create or partition
        increase) out of the way.  Blocking: run it in ``housekeeping``.

        Never deleted: they may hold the only copy of data whose metadata was lost.
        """
        for i in indexes:
            d = self.log_dir(name, i)
            if d.exists():
                aside = d.with_name(f".stale-{uuid.uuid4().hex}")
                os.replace(d, aside)
                log.warning("moved leftover directory %s aside to %s", d, aside)

    def trash(self, name: str, index: int) -> None:
        """Move the directory of partition ``index`` of ``name`` (closed) to the trash and
        delete it in the background; a crash meanwhile leaves it to the next start.  A
        failed move is logged: the replica is gone from this broker either way."""
        src = self.log_dir(name, index)
        trash = src.with_name(f".trash-{uuid.uuid4().hex}")
        try:
            os.replace(src, trash)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("cannot move %s to the trash: %s", src, exc)
            return
        asyncio.get_running_loop().run_in_executor(self.housekeeping, shutil.rmtree, trash, True)

    def empty_trash(self) -> None:
        """Delete what deletions a crash interrupted left in the trash (in the background)."""
        loop = asyncio.get_running_loop()
        for trash in (self.data_dir / "logs").glob(".trash-*"):
            loop.run_in_executor(self.housekeeping, shutil.rmtree, trash, True)

    async def close_all(self) -> None:
        """Close every partition held here (failures are logged)."""
        parts = self.all_held()
        results = await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        for p, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing %s-%d failed: %r", p.topic, p.index, result)

    # ------------------------------------------------------------------ high watermarks

    @property
    def _hw_path(self) -> Path:
        return self.data_dir / "logs" / HW_CHECKPOINT

    def read_checkpoint(self) -> None:
        """Read the high watermarks checkpoint, before any partition is opened."""
        try:
            self.checkpointed_hw = read_offsets(self._hw_path)
        except ValueError as exc:  # derived data: every partition starts from its log end
            log.error("%s; high watermarks start from the logs", exc)

    async def checkpoint_high_watermarks(self) -> bool:
        """Write every partition's high watermark (tmp + fsync + rename) if one changed
        since the last write; True if written.  Partitions reopen at min(checkpoint, log
        end)."""
        hws = {(p.topic, p.index): p.high_watermark for p in self.all_held()}
        if hws == self.checkpointed_hw:
            return False
        await asyncio.get_running_loop().run_in_executor(self.housekeeping, write_offsets, self._hw_path, hws)
        self.checkpointed_hw = hws
        return True
