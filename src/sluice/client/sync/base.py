"""The bridge every blocking facade stands on: an asyncio client made and run in a private
loop thread (client/loop_thread.py), called from any thread.

Holds no client of its own: each facade (producer.py, consumer.py, admin.py,
transaction.py) names its client's class.  The subscriber's facade (subscriber.py) does not
stand on it: it starts its client at once, in a loop thread of its own.
"""

from __future__ import annotations

import threading

from sluice import errors
from sluice.client.loop_thread import LoopThread


class SyncBase:
    """A blocking facade over one asyncio client of class ``_client_cls``: the bridge from
    the caller's threads to the client's private loop thread.

    The client is made in its loop thread on first use (``_ensure``), its settings checked
    at once; ``_call(coro_fn, *args)`` runs ``coro_fn(client, *args)`` there and returns its
    result in the calling thread.  A facade names its client's class and its thread in
    ``_client_cls`` and ``_thread_name``; ``_bind`` / ``_unbind`` tell it when its client
    starts running and when it is about to go.  Thread-safe; ``close()`` is final.
    """

    _client_cls: type
    _thread_name = "sluice-client"

    def __init__(self, bootstrap, **config) -> None:
        # The client itself is made on first use (in its loop thread), but its settings are
        # checked now: a bad one (ConfigError, TypeError) fails here, not at the first call.
        self._client_cls(bootstrap, **config)
        self._bootstrap = bootstrap
        self._config = config
        self._lt: LoopThread | None = None
        self._client = None
        self._closed = False
        self._lock = threading.Lock()  # guards _lt, _client, _closed

    def __getstate__(self):
        return {"bootstrap": self._bootstrap, "config": self._config}

    def __setstate__(self, state) -> None:
        self.__init__(state["bootstrap"], **state["config"])

    def _ensure(self) -> tuple:
        """``(client, loop thread)``, created on first use; ``ClientClosed`` once closed."""
        lt, client = self._lt, self._client  # _lt is set last, under the lock
        if lt is not None and not self._closed:
            return client, lt
        with self._lock:
            if self._closed:
                raise errors.ClientClosed(f"{type(self).__name__} is closed")
            if self._client is None:
                lt = LoopThread(self._thread_name)
                try:
                    self._client = lt.run(self._create())
                except BaseException:
                    lt.stop()
                    raise
                self._lt = lt
                self._bind(self._client)
            return self._client, self._lt

    def _bind(self, client) -> None:
        """``client`` now runs, in the loop thread ``_lt`` (called under ``_lock``)."""

    def _unbind(self) -> None:
        """The facade closes: its client is about to go (called under ``_lock``)."""

    async def _create(self):
        client = self._client_cls(self._bootstrap, **self._config)
        await client.start()
        return client

    def _call(self, coro_fn, *args, **kw):
        client, lt = self._ensure()
        return lt.run(coro_fn(client, *args, **kw))

    def close(self) -> None:
        """Close the client (flushing a producer) and stop the loop thread.  Idempotent.

        Calls blocked in other threads fail with ``ClientClosed``; so do later calls.
        """
        with self._lock:
            self._unbind()
            self._closed = True
            client, lt = self._client, self._lt
            self._client = self._lt = None
        if client is not None:
            try:
                lt.run(client.close())
            finally:
                lt.stop()

    def __enter__(self):
        self._ensure()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

