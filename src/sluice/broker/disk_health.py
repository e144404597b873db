"""The health of a partition's disk as its writer sees it: failed writes, failed fsyncs,
stalls, and the step-down they trigger.

Disk trouble fails fast (seed ``000``): a leader whose disk refuses a write or an fsync
(not a full disk: that waits for space), or whose write has not returned after
``DISK_STALL_S``, hands its leadership to an in-sync follower (``on_failure``: the broker's
broker/replication/stepdown.py).  One whose fsync fails after followers could copy the
group stops writing in that epoch instead of cutting its tail (``fence``): ``fenced_epoch``
is set, the leader's appends are refused in it, and should this broker lead again, in a later epoch,
its leader path first cuts back to what was fsynced (broker/leader_append.py).

A follower's disk trouble is reported by its replica fetcher to its leader
(broker/replication/follower.py), not here.

Event loop only: the writer's disk jobs run elsewhere, ``watch`` only awaits them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from sluice.broker.leadership import Leadership
from sluice.errors import DiskFull, LeadershipLost, StorageError, storage_error_from_os

log = logging.getLogger("sluice.broker")

# A write or fsync of the writer still running after this long means a hung or frozen disk,
# plus the time its bytes take at STALL_BYTES_PER_S (a roll fsyncs a whole segment's tail).
DISK_STALL_S = 0.5
STALL_BYTES_PER_S = 100 * 1024 * 1024
STALL_RECHECK_S = 0.02


class _Request(Protocol):
    future: asyncio.Future


class DiskHealth:
    """Disk failures and stalls of one partition's writer, and the fence after a failed
    fsync.

    ``leadership``: the partition's role (only a leader's trouble is reported) and its
    ``synced_end``; ``on_failure``: called with the error when the disk of the partition
    fails or stalls while it leads (a full disk excepted); None: nobody to tell (a
    partition outside a broker).  ``name``: ``topic-index``, for errors and logs.
    """

    def __init__(
        self, leadership: Leadership, name: str, on_failure: Callable[[StorageError], None] | None = None,
    ) -> None:
        self._leadership = leadership
        self._name = name
        self.on_failure = on_failure
        self.stalled = False  # a write or fsync of the writer hangs (``watch``)
        # the leader epoch whose writes stopped after a published group's fsync failed (``fence``)
        self.fenced_epoch: int | None = None

    @property
    def fenced(self) -> bool:
        """Leads, but writes no more in this epoch: a published group's fsync failed."""
        lead = self._leadership
        return lead.is_leader and self.fenced_epoch == lead.leader_epoch

    def refuses_leader_writes(self) -> bool:
        """No leader write in the current epoch (``fence``), whatever the role."""
        return self.fenced_epoch == self._leadership.leader_epoch

    @property
    def unsynced_from(self) -> int | None:
        """Where a tail that this broker published as leader but could not fsync starts
        (``fence``), until it is cut; None when there is none.  Kept when the partition
        becomes a follower: its fetcher cuts there before fetching (broker/replication/follower.py)."""
        if self.fenced_epoch is None:
            return None
        lead = self._leadership
        return min(lead.synced_end, lead.log.log_end_offset)

    def truncated(self, offset: int) -> None:
        """The log was cut at ``offset``: a tail whose fsync failed is gone if the cut
        reached it."""
        if self.fenced_epoch is not None and offset <= self._leadership.synced_end:
            self.fenced_epoch = None

    def refused(self, requests: Iterable[_Request], exc: OSError, leader: bool) -> None:
        """The disk refused a group before it was published (nothing of it stays in the
        log): its requests fail with the storage error, and a leader group's failure (not
        a full disk) hands the leadership away (``trouble``)."""
        err = storage_error_from_os(exc, f"append to {self._name}")
        log.error("%s", err)
        for req in requests:
            if not req.future.done():
                req.future.set_exception(err)
        if leader:
            self.trouble(err)

    def fence(self, epoch: int, requests: Iterable[_Request], first: int, exc: OSError) -> None:
        """The fsync of a leader group published to followers before it (offsets ``first``
        on) failed: its bytes may be lost here while followers hold them.

        Cutting them now would let this leader write other batches at the same offsets in
        the same epoch, and followers that copied them would keep a divergent suffix.  So
        the partition is fenced instead: no leader write in ``epoch`` any more (appends
        answer ``NotLeader``), the group's requests fail as maybe stored
        (``LeadershipLost``: a follower that becomes leader may have the batches), and the
        leadership goes to an in-sync follower in a new epoch (``trouble``).  Should this
        broker lead again, in a later epoch, its leader path first cuts back to what was
        fsynced, so the cut starts that epoch.
        """
        err = storage_error_from_os(exc, f"fsync of {self._name}")
        log.error("%s; offsets from %d may be lost here: no more writes as leader in epoch %d", err, first, epoch)
        self.fenced_epoch = epoch
        lost = LeadershipLost(
            f"{self._name}: {err.message}, after followers could copy offsets from {first}: "
            f"this leader gives up the partition"
        )
        for req in requests:
            if not req.future.done():
                req.future.set_exception(lost)
        self.trouble(err)

    def flush_failed(self, exc: BaseException) -> None:
        """A background fsync failed: acknowledged writes may be lost on this disk, so a
        leader leads no more (``trouble``)."""
        err = storage_error_from_os(exc, f"flush of {self._name}")
        log.error("%s", err)
        self.trouble(err)

    def trouble(self, err: StorageError) -> None:
        """A leader's disk failed or stalls: tell the broker, which hands the leadership to
        an in-sync follower (broker/replication/stepdown.py).  A full disk is not a failed one: it is
        reported to producers and waits for space (every replica usually fills alike).  A
        follower's trouble is reported by its replica fetcher to its leader."""
        if self._leadership.is_leader and self.on_failure is not None and not isinstance(err, DiskFull):
            self.on_failure(err)

    async def watch(self, job: asyncio.Future, size: int):
        """Await a disk job of the writer (a write, an fsync) of ``size`` bytes.  One still
        running after ``DISK_STALL_S`` (plus ``size`` at ``STALL_BYTES_PER_S``: a hung or
        frozen disk) sets ``stalled`` until it returns and is reported as disk trouble
        once; it is still awaited: the event loop and the partitions on other disks go on
        meanwhile."""
        loop = asyncio.get_running_loop()
        timers: list[asyncio.TimerHandle] = []
        timers.append(loop.call_later(DISK_STALL_S + size / STALL_BYTES_PER_S, self._stall_suspected, job, timers))
        try:
            return await job
        finally:
            for timer in timers:
                timer.cancel()
            self.stalled = False

    def _stall_suspected(self, job: asyncio.Future, timers: list) -> None:
        # Checked again a moment later: after the process was paused (SIGSTOP), timers may
        # run before the completions that arrived meanwhile (libuv runs timers first).
        timers.append(asyncio.get_running_loop().call_later(STALL_RECHECK_S, self._stalled, job))

    def _stalled(self, job: asyncio.Future) -> None:
        if job.done():
            return
        self.stalled = True
        err = StorageError(f"the disk of {self._name} stalls: a write or fsync has not returned")
        log.error("%s", err)
        self.trouble(err)
