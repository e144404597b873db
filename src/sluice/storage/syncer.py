"""Syncer: fdatasync off the event loop, awaited from it.

An acknowledgement under ``flush.messages=1`` waits for an fdatasync, which must not block
the event loop.  Through a Python worker thread it costs two thread hops that each wait for
the GIL, held by the loop while it works — on a busy machine as long as the fdatasync
itself.  ``Syncer`` hands the file descriptor to native threads that run no Python
(``sluice._csyncer``) and learns of each result through an eventfd the loop polls; where
that extension is not built, it falls back to the given executor.

Event loop only.  ``fdatasync(fd)`` returns a future that completes when the data written
to ``fd`` before the call is durable, or fails with the ``OSError`` of the fdatasync.  The
descriptor is duplicated at submission, so closing it meanwhile is safe.  A cancelled
future does not stop the sync.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor

from sluice.storage import faults

try:
    from sluice import _csyncer
except ImportError:  # not built (no C compiler at install): Python threads do it
    _csyncer = None


class Syncer:
    def __init__(self, threads: int, fallback: Executor, native: bool = True) -> None:
        """``threads`` native threads, started on the first sync; ``native=False`` (or the
        extension not built): each sync is a call of os.fdatasync in ``fallback``."""
        self._fallback = fallback
        self._threads = threads
        self._use_native = native and _csyncer is not None
        self._native = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._next_token = 0
        self._closed = False

    @property
    def native(self) -> bool:
        """True when syncs run in native threads (after the first one)."""
        return self._native is not None

    def fdatasync(self, fd: int, path: str | os.PathLike = "") -> asyncio.Future:
        """fdatasync ``fd`` (the file at ``path``, which storage/faults.py's rules match)."""
        if self._closed:
            raise RuntimeError("the syncer is closed")
        loop = asyncio.get_running_loop()
        if faults.injector is not None:  # a test's rules decide first, in a worker thread
            return loop.run_in_executor(self._fallback, _checked_fdatasync, fd, path)
        if not self._use_native:
            return loop.run_in_executor(self._fallback, os.fdatasync, fd)
        if self._native is None:
            self._native = _csyncer.Syncer(self._threads)
            self._loop = loop
            loop.add_reader(self._native.fileno(), self._completed)
        fut = loop.create_future()
        self._next_token += 1
        self._native.submit(fd, self._next_token)  # OSError (EBADF, EMFILE) raised here
        self._waiting[self._next_token] = fut
        return fut

    def _completed(self) -> None:
        for token, err in self._native.done():
            fut = self._waiting.pop(token)
            if fut.cancelled():
                continue
            if err:
                fut.set_exception(OSError(err, os.strerror(err)))
            else:
                fut.set_result(None)

    def close(self) -> None:
        """Finish the syncs already submitted (their futures complete) and stop the threads;
        later syncs are refused (RuntimeError)."""
        self._closed = True
        native = self._native
        if native is None:
            return
        self._loop.remove_reader(native.fileno())
        native.close()
        self._completed()
        self._native = None


def _checked_fdatasync(fd: int, path: str | os.PathLike) -> None:
    faults.check("fsync", path)
    os.fdatasync(fd)
