"""The future of one record sent with ``SyncProducer.send`` (client/sync/producer.py), and what the
futures of one producer share.

A ``RecordFuture`` is a ``concurrent.futures.Future`` at a fraction of its cost: the futures
of one producer share one ``threading.Condition`` (their ``FutureGroup``), and a batch's
acknowledgement resolves its records' futures under one lock (``set_results``).  The
compiled ``Outbox`` (``_coutbox.c``) makes them without running ``__init__``: it sets the
two attributes ``__init__`` sets, ``group`` (the ``FutureGroup``) and ``_condition``
(``concurrent.futures.Future``'s own name for its condition, the group's).

Concurrency: resolved on the producer's loop thread, waited on from any thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures import _base as _futures

_DONE = (_futures.CANCELLED, _futures.CANCELLED_AND_NOTIFIED, _futures.FINISHED)


class FutureGroup:
    r"""What the ``RecordFuture``\ s of one producer share: a ``threading.Condition``, and
    how many threads wait on it (so that an outcome nobody waits for notifies nobody)."""

    __slots__ = ("lock", "condition", "sleepers")

    def __init__(self) -> None:
        self.lock = threading.RLock()  # the condition's: taken directly, without its Python __enter__
        self.condition = threading.Condition(self.lock)
        self.sleepers = 0  # changed with the lock held


class RecordFuture(concurrent.futures.Future):
    """The ``concurrent.futures.Future`` of one record sent with ``SyncProducer.send``.

    A plain future builds its own ``threading.Condition``, which costs more than buffering
    the record; the futures of one producer share one (their ``FutureGroup``).  A waiter
    may then be woken by another future's outcome, so ``result`` and ``exception`` wait
    until this one is done (or ``timeout`` passed).  Everything else,
    ``concurrent.futures.wait`` and ``as_completed`` included, works as on any future.
    """

    _result = None  # until set on the future: class defaults, like the two lists below
    _exception = None
    _state = _futures.PENDING  # the compiled Outbox makes them without __init__

    def __init__(self, group: FutureGroup) -> None:
        # not super().__init__(), which builds a Condition and two lists of its own
        self.group = group  # the FutureGroup it shares with the producer's other futures
        self._condition = group.condition
        self._state = _futures.PENDING

    @property
    def _waiters(self) -> list:
        """``concurrent.futures.wait``'s waiters: a list made on first use."""
        return self.__dict__.setdefault("_waiter_list", [])

    @property
    def _done_callbacks(self) -> list:
        return self.__dict__.setdefault("_callback_list", [])

    def done(self) -> bool:
        return self._state in _DONE  # one read: no lock needed

    def _wait(self, timeout: float | None) -> None:
        if self._state not in _DONE:
            group = self.group
            with group.condition:
                group.sleepers += 1
                try:
                    group.condition.wait_for(lambda: self._state in _DONE, timeout)
                finally:
                    group.sleepers -= 1

    def result(self, timeout: float | None = None):
        self._wait(timeout)
        return super().result(0)  # raises TimeoutError if still pending

    def exception(self, timeout: float | None = None):
        self._wait(timeout)
        return super().exception(0)

    def set_result(self, result) -> None:
        """As ``Future.set_result``, without waking the group when nobody waits."""
        group = self.group
        with group.lock:
            if self._state in _DONE:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            called = self._finish(result)
            if group.sleepers:
                group.condition.notify_all()
        if called:
            self._invoke_callbacks()

    def _finish(self, result) -> bool:
        """With the group's lock held: the result set, ``concurrent.futures.wait`` told;
        whether callbacks are to be invoked (once the lock is released)."""
        self._result = result
        self._state = _futures.FINISHED
        made = self.__dict__
        for waiter in made.get("_waiter_list", ()):
            waiter.add_result(self)
        return "_callback_list" in made

    @staticmethod
    def set_results(futures: list[RecordFuture], results: list) -> None:
        """``set_result`` of each future not done yet, under one lock and with one
        notification per group: a batch's acknowledgement.  ``RecordBuffer.resolve_records``
        (accumulator.py, compiled in _cproducer.c) calls it once per batch for the sinks of a
        type that has a static ``set_results(sinks, results)``; ``futures`` is not empty,
        ``results`` as long."""
        group = futures[0].group
        called = []  # futures with callbacks to invoke, once the lock is released
        others = []  # futures of another group
        with group.lock:
            for fut, result in zip(futures, results, strict=True):
                if fut.group is not group:
                    others.append((fut, result))
                elif fut._state not in _DONE and fut._finish(result):
                    called.append(fut)
            if group.sleepers:
                group.condition.notify_all()
        for fut in called:
            fut._invoke_callbacks()
        for fut, result in others:
            if not fut.done():
                fut.set_result(result)
