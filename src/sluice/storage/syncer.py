"""Syncer: fdatasync and small appends off the event loop, awaited from it.

An acknowledgement under ``flush.messages=1`` waits for an fdatasync, which must not block
the event loop.  Through a Python worker thread it costs two thread hops that each wait for
the GIL, held by the loop while it works — on a busy machine as long as the fdatasync
itself.  ``Syncer`` hands the file descriptor to native threads that run no Python
(``sluice._csyncer``) and learns of each result through an eventfd the loop polls; where
that extension is not built or is turned off (``sluice.native``: ``SLUICE_PURE_PYTHON=1``),
it falls back to the given executor.

The partition writer's appends go the same way (``append``): a write to the page cache costs
microseconds, but on the event loop a disk that hangs (a frozen file system) would stop the
loop, with every fetch and heartbeat of the broker; through a Python thread each append
would wait for the GIL twice.  A native thread writes the buffers (and fdatasyncs them when
the flush policy says "always") and reports through the same eventfd.

Event loop only.  ``fdatasync(fd)`` returns a future that completes when the data written
to ``fd`` before the call is durable, or fails with the ``OSError`` of the fdatasync.  The
descriptor is duplicated at submission, so closing it meanwhile is safe.  A cancelled
future does not stop the sync.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor

from sluice.native import load as load_extension
from sluice.storage import faults
from sluice.storage.segment import Segment

# None when not built (no C compiler at install) or with SLUICE_PURE_PYTHON: Python threads do it
_csyncer = load_extension("_csyncer")


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
            return self._on_a_copy(loop, _checked_fdatasync, fd, path)
        if not self._use_native:
            return self._on_a_copy(loop, _fdatasync, fd, path)
        fut, token = self._submitted(loop)
        self._native.submit(fd, token)  # OSError (EBADF, EMFILE) raised here
        self._waiting[token] = fut
        return fut

    def append(self, segment: Segment, buffers: list, total: int, sync: bool) -> asyncio.Future:
        """Append ``buffers`` (``total`` bytes) to ``segment`` at its ``size``, then with
        ``sync`` fdatasync it.  All or nothing, as ``Segment.write``: on a failed write or
        fdatasync the file is cut back to ``size`` and the future fails with the
        ``OSError``.  The buffers must not change until the future is done; the segment's
        ``size`` moves only after it (``Segment.appended``)."""
        if self._closed:
            raise RuntimeError("the syncer is closed")
        loop = asyncio.get_running_loop()
        if faults.injector is not None or not self._use_native:
            return loop.run_in_executor(self._fallback, _append_blocking, segment, buffers, total, sync)
        fut, token = self._submitted(loop)
        self._native.submit_write(segment.fileno, token, buffers, segment.size, sync)
        self._waiting[token] = fut
        return fut

    def _on_a_copy(self, loop: asyncio.AbstractEventLoop, sync, fd: int, path) -> asyncio.Future:
        """``sync(copy of fd, path)`` in the fallback executor.  The copy is made now, as
        the native threads' submission makes one: the caller may close ``fd`` meanwhile,
        and its number, reused, must not be what the thread syncs."""
        copy = os.dup(fd)  # OSError (EBADF) raised here
        try:
            return loop.run_in_executor(self._fallback, _closing, sync, copy, path)
        except BaseException:
            os.close(copy)
            raise

    def _submitted(self, loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future, int]:
        """A future and a token for the next native job (starting the threads first)."""
        if self._native is None:
            self._native = _csyncer.Syncer(self._threads)
            self._loop = loop
            loop.add_reader(self._native.fileno(), self._completed)
        self._next_token += 1
        return loop.create_future(), self._next_token

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


def _append_blocking(segment: Segment, buffers: list, total: int, sync: bool) -> None:
    """``Syncer.append`` in a Python worker thread."""
    segment.write(buffers, total)
    if sync:
        try:
            segment.flush()
        except OSError:
            os.ftruncate(segment.fileno, segment.size)
            raise


def _closing(sync, fd: int, path: str | os.PathLike) -> None:
    """``sync(fd, path)``, then close ``fd`` (a copy made for this sync)."""
    try:
        sync(fd, path)
    finally:
        os.close(fd)


def _fdatasync(fd: int, path: str | os.PathLike) -> None:
    os.fdatasync(fd)


def _checked_fdatasync(fd: int, path: str | os.PathLike) -> None:
    faults.check("fsync", path)
    os.fdatasync(fd)
