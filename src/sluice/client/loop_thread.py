"""A private event loop running forever in a daemon thread: where a blocking facade
(client/sync/) runs its asyncio client, and how its callers' threads call into it.

Concurrency: ``run`` and ``call_soon`` from any thread but the loop's own; ``stop`` once,
from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from sluice import errors


def _new_loop() -> asyncio.AbstractEventLoop:
    """A loop for a facade's thread: uvloop's where it is installed (the loop is private)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running forever in a daemon thread.

    ``run`` blocks the calling thread on a coroutine run in the loop; ``stop`` cancels
    whatever still runs there, so blocked callers get ``ClientClosed`` instead of hanging.
    """

    def __init__(self, name: str) -> None:
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._lock = threading.Lock()
        self._stopped = False
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout: float | None = None):
        if threading.current_thread() is self.thread:
            coro.close()
            raise errors.ClientError("blocking call from the client's own loop thread")
        with self._lock:
            if self._stopped:
                coro.close()
                raise errors.ClientClosed("client is closed")
            cf = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return cf.result(timeout)
        except concurrent.futures.CancelledError:
            if self._stopped:
                raise errors.ClientClosed("client closed during the call") from None
            raise

    def call_soon(self, fn, *args) -> None:
        """Schedule ``fn(*args)`` on the loop without waiting; FIFO with ``run``."""
        with self._lock:
            if self._stopped:
                raise errors.ClientClosed("client is closed")
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Cancel what still runs on the loop (its callers get ``ClientClosed``), stop it."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(10)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
