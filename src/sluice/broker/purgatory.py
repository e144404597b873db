"""Purgatory: the ``acks=all`` writes of one partition waiting for its high watermark.

Appending and acknowledging are apart (DESIGN §7, seed ``000``).  The partition's writer
only appends; a write that asked for ``acks=all`` then waits here, keyed by the offset the
high watermark must reach (the end of its batches), until the ISR logic moves the high
watermark past it.  Each wait is its own future: it completes when the high watermark
passes it, or fails at its own deadline (the produce request's ``timeout_ms``: its slot is
freed then, not when the high watermark finally passes it), and never waits behind another.

What an acknowledgement promises is checked when it is given, not only when the write was
admitted: a high watermark that moved because the ISR shrank below ``min.insync.replicas``
answers the waits it passes ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (maybe stored), never
success (Kafka's rule).

Bounded, never piled up: a partition admits at most ``replica.wait.max.requests`` such
writes holding at most ``replica.wait.max.bytes`` of produce data, counted from admission
(before the append, so a refusal means nothing was written) until the write's future is
done.  Past either bound the write is refused at once (``BROKER_BUSY``); one write alone
is always admitted whatever its size.

Waits arrive in offset order (the writer appends groups in order), so they sit in a deque
and the high watermark releases them from the left.

Concurrency: event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque

from sluice.errors import BrokerError, RequestTimedOut


class Purgatory:
    def __init__(self) -> None:
        self.requests = 0  # admitted and not done
        self.bytes = 0
        self._waits: deque[tuple[int, asyncio.Future, object]] = deque()

    def admit(self, fut: asyncio.Future, size: int, max_requests: int, max_bytes: int) -> bool:
        """Count ``fut`` (``size`` bytes) until it is done; False when that would pass a bound."""
        if self.requests and (self.requests >= max_requests or self.bytes + size > max_bytes):
            return False
        self.requests += 1
        self.bytes += size
        fut.add_done_callback(lambda _: self._release(size))
        return True

    def _release(self, size: int) -> None:
        self.requests -= 1
        self.bytes -= size

    def wait(
        self, fut: asyncio.Future, end_offset: int, result, high_watermark: int,
        short: BrokerError | None = None, deadline: float | None = None,
    ) -> None:
        """Complete ``fut`` with ``result`` once the high watermark reaches ``end_offset``
        (at once if it has: with ``short`` instead when that is not None, the ISR being too
        small now).  At ``deadline`` (loop time), if still waiting, it fails with
        ``RequestTimedOut``: its slot is free again for other writes."""
        if fut.done():
            return
        if high_watermark >= end_offset:
            _answer(fut, result, short)
            return
        if deadline is not None:
            loop = asyncio.get_running_loop()
            if deadline <= loop.time():
                _expire(fut)
                return
            timer = loop.call_at(deadline, _expire, fut)
            fut.add_done_callback(lambda _: timer.cancel())
        self._waits.append((end_offset, fut, result))
        # waits given up (deadline, disconnect) stay until the HW passes them; if the HW
        # is stuck, drop them now and then so they cannot accumulate
        if len(self._waits) > 2 * self.requests + 64:
            self._waits = deque(w for w in self._waits if not w[1].done())

    def complete(self, high_watermark: int, short: BrokerError | None = None) -> None:
        """The high watermark moved: answer every wait at or below it, with its result,
        or with ``short`` when that is not None (the ISR that moved the high watermark has
        fewer members than ``min.insync.replicas``: acknowledging would promise copies
        that may not exist)."""
        waits = self._waits
        while waits and waits[0][0] <= high_watermark:
            _, fut, result = waits.popleft()
            _answer(fut, result, short)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every wait (the partition stops leading or closes)."""
        waits, self._waits = self._waits, deque()
        for _, fut, _ in waits:
            if not fut.done():
                fut.set_exception(exc)

    def __len__(self) -> int:
        return sum(1 for w in self._waits if not w[1].done())


def _answer(fut: asyncio.Future, result, short: BrokerError | None) -> None:
    if fut.done():
        return
    if short is None:
        fut.set_result(result)
    else:
        fut.set_exception(short)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(RequestTimedOut("the write was not replicated to the in-sync replicas in time"))
