"""Leadership of a partition: its role, its followers as the leader sees them, the ISR it
applies, the high watermark they give, and the ``acks=all`` writes waiting for it.

On the leader the high watermark is the minimum log end over the in-sync replicas, its own
counted once written (and fsynced with ``flush.messages=1``: ``synced_end``, which the
writer moves), each follower's as its replica fetches report it.  The partition only
reports who lags (``lagging``) and who caught up (``caught_up``); who is in the ISR is
decided by compare-and-swap in the metadata store (broker/replication/) and applied here
(``set_isr``).  A move of the high watermark completes the ``acks=all`` waits it passes
(``acks``, broker/purgatory.py) and wakes the fetches waiting for it (broker/reading.py).

Event loop only.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

from sluice.broker.purgatory import Purgatory
from sluice.broker.reading import Reads
from sluice.config import TopicConfig
from sluice.errors import LeadershipLost, NotEnoughReplicasAfterAppend
from sluice.storage.log import PartitionLog


@dataclass
class Follower:
    """What a leader knows of one follower of the partition (replica fetches tell)."""

    log_end: int = -1  # -1: unknown (no fetch in this leader epoch yet)
    # monotonic time it last had everything the leader had (a new leader gives each
    # follower a full replica.lag.time.max.ms from its election)
    caught_up_at: float = field(default_factory=time.monotonic)
    leader_end_at_fetch: int = -1  # the leader's log end at the follower's last fetch
    fetched_at: float = 0.0
    left_isr_at: float = 0.0  # when this leader last saw it leave the ISR



class Leadership:
    """Role, followers, ISR and high watermark of one partition.

    ``log``: the partition's log (its high watermark and leader-epoch cache are moved
    here); ``config``: the topic's config (``min.insync.replicas``; replaced on a
    reconfiguration); ``reads``: whose waiters a high watermark move or a role change
    wakes; ``replica_id``: this broker; ``leader_epoch``: the epoch it starts in (never
    below one already in the log: a restart keeps the last one stamped); ``leader``: whether
    it starts as the leader; ``name``: ``topic-index``, for errors.
    """

    def __init__(
        self, log: PartitionLog, config: TopicConfig, reads: Reads, replica_id: int, leader_epoch: int,
        leader: bool, name: str,
    ) -> None:
        self.log = log
        self.config = config
        self._reads = reads
        self._name = name
        self.replica_id = replica_id
        self.leader_epoch = max(leader_epoch, log.epochs.latest_epoch, 0)
        self.is_leader = leader
        self.isr: tuple[int, ...] = (replica_id,)
        self.joining: tuple[int, ...] = ()  # on the leader: an ISR expansion being written
        self.followers: dict[int, Follower] = {}  # on the leader: the other replicas
        self.failed_followers: set[int] = set()  # on the leader: replicas that cannot write
        self.acks = Purgatory()  # acks=all writes waiting for the high watermark
        # the log end as far as the writer has finished with it (written, and fsynced with
        # flush.messages=1); below the log end only while a leader's fsync runs.  Moved by
        # the writer (broker/writer.py).
        self.synced_end = log.log_end_offset
        self._marks: deque[tuple[int, int]] = deque()  # (log end, bytes appended) on the leader
        self._appended_bytes = 0
        if leader:
            self.log_end_moved()

    # ------------------------------------------------------------------ high watermark

    def leader_appended(self, log_end: int, size: int) -> None:
        """The writer appended ``size`` bytes up to ``log_end`` while this broker leads:
        count them for ``max_isr_lag_bytes`` and move the high watermark."""
        self._appended_bytes += size
        self._marks.append((log_end, self._appended_bytes))
        self.log_end_moved()

    def log_end_moved(self) -> None:
        """The ISR step: the high watermark is the minimum log end over the ISR (a
        follower not heard from in this epoch holds it where it is).  The leader's own
        counts once written, and fsynced where the flush policy says "always"."""
        end = min(self.log.log_end_offset, self.synced_end)
        for r in self.maximal_isr:
            f = self.followers.get(r)
            if f is not None:
                end = min(end, f.log_end)
        self.advance_high_watermark(end)
        self._forget_marks()

    # ------------------------------------------------------------------ followers (leader side)

    def set_replicas(self, replicas: list[int], isr: list[int], settled: bool = True) -> None:
        """The partition's replicas and ISR as the metadata store has them (leader side:
        followers not known yet start unheard of).  ``settled=False``: no state of the
        store is applied (only the topic record changed), so an expansion pending stays."""
        self.followers = {
            r: self.followers.get(r, Follower()) for r in replicas if r != self.replica_id
        }
        self.set_isr(isr, settled)

    def set_isr(self, isr: list[int], settled: bool = True) -> None:
        """Apply the ISR the metadata store holds now (an expansion pending is settled by
        it: ``expanding``; not with ``settled=False``); the high watermark may move."""
        now = time.monotonic()
        for r in self.isr:
            if r not in isr and (f := self.followers.get(r)) is not None:
                f.left_isr_at = now
        self.isr = tuple(isr)
        if settled:
            self.joining = ()
        if self.is_leader:
            self.log_end_moved()

    def expanding(self, joining: list[int]) -> None:
        """The leader is writing an ISR with ``joining`` added to the store (Kafka's
        "maximal ISR"): until a state of the store is applied (``set_isr``), the high
        watermark and ``min.insync.replicas`` count the joiners as in sync.  The write may
        take effect although its answer is lost (a timeout), and the controller may then
        elect a joiner: it must hold every acknowledged record, so nothing is acknowledged
        that a joiner lacks."""
        self.joining = tuple(r for r in joining if r not in self.isr)

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR applied, with the replicas of a pending expansion (``expanding``)."""
        return self.isr + self.joining if self.joining else self.isr

    def follower_fetched(self, replica_id: int, offset: int) -> None:
        """A follower's replica fetch at ``offset``: it has everything below it."""
        f = self.followers.get(replica_id)
        if f is None:
            return
        now, leader_end = time.monotonic(), self.log.log_end_offset
        if offset >= leader_end:
            f.caught_up_at = now
        elif offset >= f.leader_end_at_fetch >= 0:  # has what we had at its last fetch
            f.caught_up_at = max(f.caught_up_at, f.fetched_at)
        f.log_end, f.leader_end_at_fetch, f.fetched_at = offset, leader_end, now
        if replica_id in self.isr or replica_id in self.joining:
            self.log_end_moved()

    def lagging(self, max_lag_s: float) -> list[int]:
        """In-sync followers that have not caught up with the log end for ``max_lag_s``."""
        now = time.monotonic()
        return [
            r for r in self.isr
            if (f := self.followers.get(r)) is not None and now - f.caught_up_at > max_lag_s
        ]

    def caught_up(self, max_lag_s: float) -> list[int]:
        """Followers out of the ISR that may rejoin: fetching (heard from within
        ``max_lag_s``, and since they left the ISR: a broker that died in it, whose
        session ended, must not come back on its last fetches), at or past the high
        watermark and the start of the current leader epoch."""
        hw, now = self.log.high_watermark, time.monotonic()
        start = self._epoch_start()
        return [
            r for r, f in self.followers.items()
            if r not in self.isr and f.log_end >= hw and f.log_end >= start
            and now - f.fetched_at <= max_lag_s and f.fetched_at > f.left_isr_at
        ]

    def _epoch_start(self) -> int:
        for epoch, start in reversed(self.log.epochs.entries()):
            if epoch == self.leader_epoch:
                return start
        return self.log.log_end_offset

    def max_isr_lag_bytes(self) -> int:
        """How many bytes of the leader's log the furthest-behind in-sync follower lacks
        (0 when unknown: this leader has not appended since the follower's offset)."""
        worst = min(
            (f.log_end for r in self.isr if (f := self.followers.get(r)) is not None and f.log_end >= 0),
            default=None,
        )
        if worst is None or not self._marks:
            return 0
        i = bisect_left(self._marks, (worst, -1))
        at = self._marks[i - 1][1] if i else self._marks[0][1]
        return self._appended_bytes - at

    def _forget_marks(self) -> None:
        """Drop byte marks no in-sync follower still needs (below all their log ends)."""
        marks = self._marks
        low = min(
            (f.log_end for r in self.isr if (f := self.followers.get(r)) is not None),
            default=self.log.log_end_offset,
        )
        while len(marks) > 1 and marks[1][0] <= low:
            marks.popleft()

    def advance_high_watermark(self, offset: int) -> None:
        """Move the high watermark up to ``offset`` (never past the log end, never down):
        complete the ``acks=all`` waits it passes and wake fetches waiting for data."""
        if self.log.advance_high_watermark(offset):
            self.acks.complete(self.log.high_watermark, self.isr_short())
            self._reads.notify()

    def isr_short(self) -> NotEnoughReplicasAfterAppend | None:
        """The error an ``acks=all`` write passed by the high watermark now gets instead of
        its acknowledgement: the ISR that moved the high watermark has fewer members than
        ``min.insync.replicas`` (it shrank after the write was admitted); None when it is
        big enough."""
        have, need = len(self.maximal_isr), self.config.min_insync_replicas
        if have >= need:
            return None
        return NotEnoughReplicasAfterAppend(
            f"{self._name}: the ISR shrank to {have} replica(s) (min.insync.replicas is "
            f"{need}) before the write was replicated: it was appended, maybe stored"
        )

    def make_leader(self, leader_epoch: int, replicas: list[int] | None = None, isr: list[int] | None = None) -> None:
        """Lead from now on, stamping ``leader_epoch`` (at least the current one) on new
        batches and in the leader-epoch cache at the log end, with ``replicas`` and ``isr``
        (default: this broker alone).  Followers start unheard of: the high watermark
        waits for their first fetch."""
        if leader_epoch < self.leader_epoch:
            raise ValueError(f"leader epoch {leader_epoch} is below {self.leader_epoch}")
        self.leader_epoch, self.is_leader = leader_epoch, True
        # Stamp the epoch at the log end before any write (Kafka's makeLeader): a follower
        # whose last epoch this log never had (an unclean election, a leader that lagged
        # the old one) learns it ends here, and cuts what it has beyond.
        self.log.epochs.assign(leader_epoch, self.log.log_end_offset)
        self.joining = ()
        self.followers = {}
        self.failed_followers = set()
        self._marks.clear()
        self._marks.append((self.log.log_end_offset, self._appended_bytes))
        self.set_replicas(replicas or [self.replica_id], isr or [self.replica_id])

    def make_follower(self, leader_epoch: int) -> None:
        """Follow the leader of ``leader_epoch``: leader appends are refused from now on,
        and ``acks=all`` writes still waiting fail with ``LeadershipLost`` (a ``NotLeader``
        that may have been stored: their batches may be on the new leader or be truncated
        away; the producer retries on the new leader).  A leader write still in the
        writer's thread fails the same way when it returns."""
        if leader_epoch < self.leader_epoch:
            raise ValueError(f"leader epoch {leader_epoch} is below {self.leader_epoch}")
        self.leader_epoch, self.is_leader = leader_epoch, False
        # a stamp of the epoch this broker led with no batch written in it goes: it is
        # not in the log, and a follower's epochs are its log's
        self.log.epochs.truncate_from_end(self.log.log_end_offset)
        self.joining = ()
        self.followers = {}
        self.failed_followers = set()
        self.acks.fail_all(LeadershipLost(
            f"{self._name} got a new leader (epoch {leader_epoch}) before the write was replicated"
        ))
        self._reads.wake_all()
