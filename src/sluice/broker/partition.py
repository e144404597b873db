"""Partition: one replica of a topic partition on this broker, composed of the objects
that each hold one concern of it.

- ``Reads`` (broker/reading.py): consumers' and replicas' reads, the fetch long polls.
- ``Leadership`` (broker/leadership.py): role, leader epoch, followers, ISR, high
  watermark, and the ``acks=all`` writes waiting for it (the purgatory).
- ``DiskHealth`` (broker/disk_health.py): failed writes and fsyncs, stalls, the fence
  after a failed fsync, and the step-down they trigger (``on_disk_failure``).
- ``Writer`` (broker/writer.py): the group-commit queue and task, the disk write both
  append paths share, truncations, the flush policy.
- ``LeaderAppends`` (broker/leader_append.py): producers' appends: admission,
  idempotence, offsets, answers.
- ``FollowerAppends`` (broker/follower_append.py): a follower's copies of its leader's
  batches, written as they are.
- ``Compaction`` (broker/compacting.py): the log cleaner's passes over a compacted log.

``Partition`` builds them and is the one interface the rest of the broker uses: each of
its methods forwards to the object holding the concern.  The parts are attributes of it
(``reads``, ``leadership``, ``disk``, ``writer``, ``leader_appends``,
``follower_appends``, ``compaction``) for their own tests and for whoever needs one
concern whole; the broker's services call ``Partition``'s methods.  Besides, it carries what the
replication service records about the partition's state in the metadata store
(``state_version``, ``seen_version``, ``stale_epoch``, ``withdrawing``,
``fenced_version``, ``leader_log_start``; broker/replication/) and applies retention
(``take_expired``).  Retention by time and size does not apply to compacted partitions.

Concurrency: event loop only; the file calls run in the writer's and readers' threads
(see each part).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from sluice.broker.compacting import Compaction
from sluice.broker.disk_health import DiskHealth
from sluice.broker.follower_append import FollowerAppends
from sluice.broker.leader_append import LeaderAppends
from sluice.broker.leadership import Follower, Leadership
from sluice.broker.reading import Reads
from sluice.broker.writer import Append, Writer
from sluice.config import TopicConfig
from sluice.errors import BrokerShuttingDown, StorageError, UnknownTopic
from sluice.protocol.records import BatchSpan
from sluice.storage.log import PartitionLog, ReadResult
from sluice.storage.segment import Segment
from sluice.storage.syncer import Syncer
from sluice.storage.tail import Tail


class Partition:
    """One partition's replica here: ``log`` and its parts (see the module).

    ``write_executor``: the threads rolls, truncations and background fsyncs run in;
    ``read_executor``: the threads disk reads run in; ``syncer``: the native threads of
    the writes and their fsyncs (without one given, the partition has its own, closed with
    it); ``tail_cache_bytes``: the newest leader writes kept in memory for tailing readers;
    ``on_disk_failure``: called (event loop) with the partition and the error when its
    disk fails or stalls while it leads (broker/replication/stepdown.py).  Built on the event loop: the
    writer task starts at once.
    """

    def __init__(
        self,
        topic: str,
        index: int,
        plog: PartitionLog,
        config: TopicConfig,
        write_executor: Executor,
        read_executor: Executor,
        *,
        replica_id: int = 0,
        leader_epoch: int = 0,
        leader: bool = True,
        tail_cache_bytes: int = 1024 * 1024,
        syncer: Syncer | None = None,
        on_disk_failure: Callable[[Partition, StorageError], None] | None = None,
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = plog
        self._config = config
        name = f"{topic}-{index}"
        tail = Tail(tail_cache_bytes)  # the newest leader writes, for tailing readers
        self.reads = Reads(plog, tail, read_executor, name)
        self.leadership = Leadership(plog, config, self.reads, replica_id, leader_epoch, leader, name)
        self.disk = DiskHealth(
            self.leadership, name, None if on_disk_failure is None else lambda err: on_disk_failure(self, err),
        )
        self.writer = Writer(
            plog, config, self.leadership, self.disk, self.reads, tail, write_executor,
            Syncer(1, write_executor) if syncer is None else syncer, syncer is None, self._write_run, name,
        )
        self.leader_appends = LeaderAppends(
            plog, config, self.leadership, self.disk, self.writer, self.reads, tail, name,
        )
        self.follower_appends = FollowerAppends(plog, config, self.leadership, self.disk, self.writer, tail, name)
        self.compaction = Compaction(plog, config, self.writer, name)
        # What the replication service (broker/replication/) records here:
        self.state_version: int | None = None  # of the store's state last applied (None: stale)
        self.seen_version = -1  # the newest version of the store's state applied here
        self.stale_epoch = -1  # never lead in this epoch or an older one (a restart, a cut log)
        self.withdrawing = False  # restarted with records lost: to leave the ISR until caught up
        self.fenced_version = -1  # the state version whose swap (new epoch, or leaving) was started
        self.leader_log_start = -1  # on a follower: its leader's log start, as last fetched

    def _write_run(self, group: list[Append]) -> Awaitable[None]:
        """The writer's turn for a run of queued appends: a follower's copies or a leader's."""
        if group[0].replica:
            return self.follower_appends.write(group)
        return self.leader_appends.write(group)

    # ------------------------------------------------------------------ config

    @property
    def config(self) -> TopicConfig:
        return self._config

    def reconfigure(self, config: TopicConfig) -> None:
        """Apply a changed topic config to this live partition (event loop).

        Write groups after this one follow its flush policy and timestamp type; produce
        checks ``max.message.bytes`` from it; the log takes its segment, retention and index
        settings.  A flush the new policy makes due starts at once (switching to
        ``flush.messages=1`` fsyncs what earlier acknowledgements left unflushed).
        """
        self._config = config
        self.leadership.config = config
        self.leader_appends.config = config
        self.follower_appends.config = config
        self.compaction.config = config
        self.log.reconfigure(config.log_config)
        self.writer.reconfigure(config)

    # ------------------------------------------------------------------ role (Leadership)

    @property
    def replica_id(self) -> int:
        return self.leadership.replica_id

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    @property
    def leader_epoch(self) -> int:
        return self.leadership.leader_epoch

    @property
    def isr(self) -> tuple[int, ...]:
        return self.leadership.isr

    @isr.setter
    def isr(self, isr: tuple[int, ...]) -> None:
        """The ISR of the store's state, known on a follower (no high watermark move)."""
        self.leadership.isr = isr

    @property
    def joining(self) -> tuple[int, ...]:
        return self.leadership.joining

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        return self.leadership.maximal_isr

    @property
    def followers(self) -> dict[int, Follower]:
        return self.leadership.followers

    @property
    def failed_followers(self) -> set[int]:
        return self.leadership.failed_followers

    def make_leader(self, leader_epoch: int, replicas: list[int] | None = None, isr: list[int] | None = None) -> None:
        """``Leadership.make_leader``."""
        self.leadership.make_leader(leader_epoch, replicas, isr)

    def make_follower(self, leader_epoch: int) -> None:
        """``Leadership.make_follower``; besides, the leader writes it stops are answered
        now (``Writer.depose``).  Producers retry on the new leader at once."""
        self.leadership.make_follower(leader_epoch)
        self.writer.depose(leader_epoch)

    def set_replicas(self, replicas: list[int], isr: list[int], settled: bool = True) -> None:
        self.leadership.set_replicas(replicas, isr, settled)

    def set_isr(self, isr: list[int], settled: bool = True) -> None:
        self.leadership.set_isr(isr, settled)

    def expanding(self, joining: list[int]) -> None:
        self.leadership.expanding(joining)

    def follower_fetched(self, replica_id: int, offset: int) -> None:
        self.leadership.follower_fetched(replica_id, offset)

    def lagging(self, max_lag_s: float) -> list[int]:
        return self.leadership.lagging(max_lag_s)

    def caught_up(self, max_lag_s: float) -> list[int]:
        return self.leadership.caught_up(max_lag_s)

    def advance_high_watermark(self, offset: int) -> None:
        self.leadership.advance_high_watermark(offset)

    # ------------------------------------------------------------------ disk (DiskHealth)

    @property
    def stalled(self) -> bool:
        """A write or fsync of the writer hangs (``DiskHealth.watch``)."""
        return self.disk.stalled

    @property
    def fenced(self) -> bool:
        """Leads, but writes no more in this epoch: a published group's fsync failed."""
        return self.disk.fenced

    @property
    def unsynced_from(self) -> int | None:
        """``DiskHealth.unsynced_from``: where a tail published but not fsynced starts."""
        return self.disk.unsynced_from

    # ------------------------------------------------------------------ writing

    @property
    def closing(self) -> bool:
        """Closed or being closed (a shutdown, its topic deleted): it takes no appends."""
        return self.writer.closing

    def append(
        self, data: bytearray | memoryview, spans: list[BatchSpan], acks_all: bool = False,
        deadline: float | None = None,
    ) -> asyncio.Future:
        """A producer's batches: ``LeaderAppends.append``."""
        return self.leader_appends.append(data, spans, acks_all, deadline)

    def append_as_follower(self, data: bytearray | memoryview, fetched_in: int | None = None) -> asyncio.Future:
        """A copy of the leader's batches: ``FollowerAppends.append``."""
        return self.follower_appends.append(data, fetched_in)

    def truncate_to(self, offset: int) -> asyncio.Future:
        """``Writer.truncate_to``: cut the log at ``offset`` in the writer's turn."""
        return self.writer.truncate_to(offset)

    def reset_to(self, offset: int) -> asyncio.Future:
        """``Writer.reset_to``: start the log empty at ``offset`` in the writer's turn."""
        return self.writer.reset_to(offset)

    # ------------------------------------------------------------------ reading (Reads)

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower's OffsetsForLeaderEpoch (storage/epochs.py)."""
        return self.log.epochs.end_offset_for_epoch(epoch, self.log.log_end_offset)

    async def read(self, offset: int, max_bytes: int, upper_bound: int) -> ReadResult:
        """``Reads.read``."""
        return await self.reads.read(offset, max_bytes, upper_bound)

    async def fetch(self, offset: int, max_bytes: int, upper_bound: int) -> ReadResult:
        """``Reads.fetch``."""
        return await self.reads.fetch(offset, max_bytes, upper_bound)

    async def offset_for_time(self, timestamp: int) -> int | None:
        return await self.reads.offset_for_time(timestamp)

    def add_waiter(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the high watermark moves (fetch long poll)."""
        self.reads.add_waiter(callback)

    def remove_waiter(self, callback: Callable[[], None]) -> None:
        self.reads.remove_waiter(callback)

    def add_replica_waiter(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the leader appends (replica fetch long poll)."""
        self.reads.add_replica_waiter(callback)

    def remove_replica_waiter(self, callback: Callable[[], None]) -> None:
        self.reads.remove_replica_waiter(callback)

    def wake_fetches(self) -> None:
        """Call every fetch waiter now, as if the high watermark had moved."""
        self.reads.wake_all()

    # ------------------------------------------------------------------ retention and compaction

    async def clean(self, executor: Executor, now_ms: int) -> int:
        """``Compaction.clean``: a log-cleaner pass if due; the bytes it freed."""
        return await self.compaction.clean(executor, now_ms)

    def take_expired(self, now_ms: int) -> list[Segment]:
        """Segments retention removes from the log (none while a truncation or a cleaning
        runs, none with ``cleanup.policy=compact``).  A follower also lets go of what its
        leader no longer has, so replicas' log starts do not drift apart.  Idempotent
        producers idle past ``producer.id.expiration.ms`` are forgotten here too."""
        truncating = self.writer.truncating
        if not truncating:
            self.log.producers.expire(now_ms, self.config.producer_id_expiration_ms)
        if truncating or self.compaction.cleaning is not None or self.config.cleanup_policy == "compact":
            return []
        halves = self.log.producers.open_halves
        keep = min(halves, default=-1)  # open half messages (delayed ones too) stay
        return self.log.expired_segments(now_ms, -1 if self.is_leader else self.leader_log_start, keep)

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Finish queued writes, fsync, save indexes, close files."""
        writer = self.writer
        await writer.stop()
        await self.compaction.stop()
        await writer.flush_done()
        self.leadership.acks.fail_all(BrokerShuttingDown("partition closed before its replicas caught up"))
        writer.close_syncer()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(writer.write_executor, self.log.close)
        self.reads.wake_all()

    async def abort(self) -> None:
        """Stop for a topic deletion: queued appends fail, the one being written completes."""
        await self.writer.abort(UnknownTopic(f"topic {self.topic!r} was deleted"))
        await self.compaction.stop()
        self.leadership.acks.fail_all(UnknownTopic(f"topic {self.topic!r} was deleted"))
        self.writer.close_syncer()
        self.reads.wake_all()
