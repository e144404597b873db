"""Reading a partition: consumers' and replicas' reads, and the long polls waiting for more.

``Reading`` is a part of ``Partition`` (a mixin, broker/partition.py holds the state).
Consumers read below the high watermark, replicas below the log end.  A read at the end of
the log is answered from the partition's tail (storage/tail.py: its newest writes, kept in
memory), any other in a reader thread; one with nothing new is answered at once.  A fetch
long poll waits with ``add_waiter`` until the high watermark moves, a replica fetch with
``add_replica_waiter`` until the leader appends.

Event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.errors import OffsetNotAvailable, OffsetOutOfRange, storage_error_from_os
from sluice.storage.log import NotYetAvailable, OutOfRange, ReadResult


class Reading:
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
        """Whole batches from ``offset`` below ``upper_bound`` — the high watermark for a
        consumer, the log end for a replica — read off the event loop (see
        PartitionLog.read: ``OutOfRange``, ``NotYetAvailable``)."""
        plog = self.log
        leo, start = plog.log_end_offset, plog.log_start_offset
        if offset < start or offset > leo:
            raise OutOfRange(f"offset {offset} is outside [{start}, {leo}]")
        bound = min(upper_bound, leo)
        if offset > bound:
            raise NotYetAvailable(f"offset {offset} is above {bound}, the bound of this read")
        if offset == bound:  # nothing new: answer without a thread hop (long polls idle here)
            return ReadResult(b"", plog.high_watermark, start, leo)
        data = self._tail.read(offset, max_bytes, bound)
        if data is not None:  # just written: answered from memory (storage/tail.py)
            return ReadResult(data, plog.high_watermark, start, leo)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_executor, plog.read, offset, max_bytes, bound)

    async def fetch(self, offset: int, max_bytes: int, upper_bound: int) -> ReadResult:
        """``read``, with its refusals as the errors a fetch answers: ``OffsetOutOfRange``,
        ``OffsetNotAvailable`` (above the bound: retry later), a ``StorageError``."""
        try:
            return await self.read(offset, max_bytes, upper_bound)
        except OutOfRange:
            raise OffsetOutOfRange(
                f"offset {offset} of {self.topic}-{self.index} is outside "
                f"[{self.log_start_offset}, {self.log_end_offset}]"
            ) from None
        except NotYetAvailable:
            raise OffsetNotAvailable(
                f"offset {offset} of {self.topic}-{self.index} is above the high watermark "
                f"{self.high_watermark} (log end {self.log_end_offset}); retry"
            ) from None
        except OSError as exc:
            raise storage_error_from_os(exc, f"read {self.topic}-{self.index}") from exc

    async def offset_for_time(self, timestamp: int) -> int | None:
        """First offset below the high watermark whose batch reaches ``timestamp``."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._read_executor, self.log.offset_for_time, timestamp, self.log.high_watermark
        )

    def add_waiter(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the high watermark moves (fetch long poll)."""
        self._waiters.append(callback)

    def remove_waiter(self, callback: Callable[[], None]) -> None:
        try:
            self._waiters.remove(callback)
        except ValueError:
            pass

    def wake_fetches(self) -> None:
        """Call every fetch waiter now, as if the high watermark had moved."""
        self._notify()
        self._notify_replicas()

    def add_replica_waiter(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the leader appends (replica fetch long poll)."""
        self._replica_waiters.append(callback)

    def remove_replica_waiter(self, callback: Callable[[], None]) -> None:
        try:
            self._replica_waiters.remove(callback)
        except ValueError:
            pass

    def _notify_replicas(self) -> None:
        waiters, self._replica_waiters = self._replica_waiters, []
        for cb in waiters:
            cb()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for cb in waiters:
            cb()
