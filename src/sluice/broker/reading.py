"""Reading a partition: consumers' and replicas' reads, and the long polls waiting for more.

Consumers read below the high watermark, replicas below the log end.  A read at the end of
the log is answered from the partition's tail (storage/tail.py: its newest writes, kept in
memory), any other in a reader thread; one with nothing new is answered at once.  A fetch
long poll waits with ``add_waiter`` until the high watermark moves, a replica fetch with
``add_replica_waiter`` until the leader appends.

Event loop only (the disk reads run in the given reader executor).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor

from sluice.errors import OffsetNotAvailable, OffsetOutOfRange, storage_error_from_os
from sluice.storage.log import NotYetAvailable, OutOfRange, PartitionLog, ReadResult
from sluice.storage.tail import Tail


class Reads:
    """The reads of one partition's log and the long polls waiting on it.

    ``log``: the partition's log; ``tail``: its newest leader writes, which the writer
    fills (broker/writer.py); ``read_executor``: the threads disk reads run in; ``name``:
    ``topic-index``, for errors.  ``notify`` (the high watermark moved) and
    ``notify_replicas`` (the leader appended, or its role changed) wake the waiters.
    """

    def __init__(self, log: PartitionLog, tail: Tail, read_executor: Executor, name: str) -> None:
        self.log = log
        self.tail = tail
        self._read_executor = read_executor
        self._name = name
        self._waiters: list[Callable[[], None]] = []  # fetch long polls: the high watermark
        self._replica_waiters: list[Callable[[], None]] = []  # replica fetches: appends

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
        data = self.tail.read(offset, max_bytes, bound)
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
                f"offset {offset} of {self._name} is outside "
                f"[{self.log.log_start_offset}, {self.log.log_end_offset}]"
            ) from None
        except NotYetAvailable:
            raise OffsetNotAvailable(
                f"offset {offset} of {self._name} is above the high watermark "
                f"{self.log.high_watermark} (log end {self.log.log_end_offset}); retry"
            ) from None
        except OSError as exc:
            raise storage_error_from_os(exc, f"read {self._name}") from exc

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

    def add_replica_waiter(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time the leader appends (replica fetch long poll)."""
        self._replica_waiters.append(callback)

    def remove_replica_waiter(self, callback: Callable[[], None]) -> None:
        try:
            self._replica_waiters.remove(callback)
        except ValueError:
            pass

    def wake_all(self) -> None:
        """Call every waiter now, fetches' and replicas', as if the high watermark had
        moved and the leader appended."""
        self.notify()
        self.notify_replicas()

    def notify_replicas(self) -> None:
        waiters, self._replica_waiters = self._replica_waiters, []
        for cb in waiters:
            cb()

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for cb in waiters:
            cb()
