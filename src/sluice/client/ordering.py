"""Completion callbacks in send order across partitions (DESIGN §4, the "ack buffer")."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)


class InOrderCallbacks:
    """Call ``callback(future)`` for futures in the order they were added, each as soon as it
    and every earlier one have completed (DESIGN §4, the "ack buffer").

    Futures from different partitions complete out of order; this holds the later ones back.
    ``add`` is O(1); completion work is amortised O(1) per future.  ``wait()`` returns when
    every added future has been called back.  A callback that raises is logged and the
    queue moves on: one bad callback never stalls the ones after it.  Loop-bound, not
    thread-safe.
    """

    def __init__(self, callback: Callable[[asyncio.Future], object]) -> None:
        self._callback = callback
        self._queue: deque[asyncio.Future] = deque()
        self._idle: asyncio.Future | None = None

    def add(self, fut: asyncio.Future) -> None:
        self._queue.append(fut)
        if len(self._queue) == 1:
            fut.add_done_callback(self._on_done)

    def __len__(self) -> int:
        return len(self._queue)

    def _on_done(self, _fut: asyncio.Future) -> None:
        q = self._queue
        # Drain every completed future at the head; then watch the first pending one.
        while q and q[0].done():
            fut = q.popleft()
            try:
                self._callback(fut)
            except Exception:
                log.exception("InOrderCallbacks callback raised; continuing with the next future")
        if q:
            q[0].add_done_callback(self._on_done)
        elif self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def wait(self) -> None:
        if not self._queue:
            return
        if self._idle is None or self._idle.done():
            self._idle = asyncio.get_running_loop().create_future()
        await self._idle
