"""Blocking facades over the asyncio clients, for the CLI, scripts and Spark executors.

Each facade owns a private event loop running in a daemon thread and forwards calls with
``asyncio.run_coroutine_threadsafe``; the asyncio client is created inside that loop.  The
facades are safe to call from any thread (calls are serialised onto the loop).  They pickle
as their configuration only: an unpickled facade opens its own connections on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator, Sequence

from sluice import errors
from sluice.client.admin import Admin
from sluice.client.consumer import Consumer
from sluice.client.producer import Producer

__all__ = ["SyncProducer", "SyncConsumer", "SyncAdmin"]


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout: float | None = None):
        if threading.current_thread() is self.thread:
            coro.close()
            raise errors.ClientError("blocking call from the client's own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class _SyncBase:
    _client_cls: type
    _thread_name = "sluice-client"

    def __init__(self, bootstrap, **config) -> None:
        self._bootstrap = bootstrap
        self._config = config
        self._lt: _LoopThread | None = None
        self._client = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"bootstrap": self._bootstrap, "config": self._config}

    def __setstate__(self, state) -> None:
        self.__init__(state["bootstrap"], **state["config"])

    def _ensure(self):
        with self._lock:
            if self._client is None:
                lt = _LoopThread(self._thread_name)
                try:
                    self._client = lt.run(self._create())
                except BaseException:
                    lt.stop()
                    raise
                self._lt = lt
            return self._client

    async def _create(self):
        client = self._client_cls(self._bootstrap, **self._config)
        await client.start()
        return client

    def _call(self, coro_fn, *args, **kw):
        client = self._ensure()
        return self._lt.run(coro_fn(client, *args, **kw))

    def close(self) -> None:
        """Close the client (flushing a producer) and stop the loop thread.  Idempotent."""
        with self._lock:
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


class SyncProducer(_SyncBase):
    """Blocking ``Producer``: ``send`` blocks until buffered and returns a
    ``concurrent.futures.Future`` of the ``RecordMetadata``."""

    _client_cls = Producer
    _thread_name = "sluice-producer"

    def send(self, topic: str, value: bytes | None, **kw) -> concurrent.futures.Future:
        return self._call(_chained_send, topic, value, **kw)

    def send_many(self, topic: str, values: Sequence[bytes], **kw) -> concurrent.futures.Future:
        return self._call(_chained_send_many, topic, values, **kw)

    def flush(self) -> None:
        self._call(Producer.flush)


async def _chained(afut: asyncio.Future) -> concurrent.futures.Future:
    cf: concurrent.futures.Future = concurrent.futures.Future()
    cf.set_running_or_notify_cancel()

    def copy(f: asyncio.Future) -> None:
        if f.cancelled():
            cf.set_exception(errors.ClientClosed("send cancelled"))
        elif f.exception() is not None:
            cf.set_exception(f.exception())
        else:
            cf.set_result(f.result())

    afut.add_done_callback(copy)
    return cf


async def _chained_send(p: Producer, topic, value, **kw):
    return await _chained(await p.send(topic, value, **kw))


async def _chained_send_many(p: Producer, topic, values, **kw):
    return await _chained(await p.send_many(topic, values, **kw))


class SyncConsumer(_SyncBase):
    """Blocking ``Consumer``.  ``assign`` / ``subscribe`` / ``seek`` may be called before
    first use; iteration yields records, blocking up to ``poll_timeout_ms`` per poll."""

    _client_cls = Consumer
    _thread_name = "sluice-consumer"

    def __init__(self, bootstrap, **config) -> None:
        super().__init__(bootstrap, **config)
        self._iter_buf: list = []

    def assign(self, partitions) -> None:
        self._call(_run_sync, Consumer.assign, list(partitions))

    def subscribe(self, topics) -> None:
        self._call(_run_sync, Consumer.subscribe, list(topics))

    def assignment(self) -> list:
        return self._call(_run_sync, Consumer.assignment)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._call(_run_sync, Consumer.seek, topic, partition, offset)

    def position(self, tp):
        return self._call(_run_sync, Consumer.position, tuple(tp))

    def seek_to_beginning(self, *tps) -> None:
        self._call(Consumer.seek_to_beginning, *tps)

    def seek_to_end(self, *tps) -> None:
        self._call(Consumer.seek_to_end, *tps)

    def seek_to_time(self, timestamp_ms: int, *tps) -> None:
        self._call(Consumer.seek_to_time, timestamp_ms, *tps)

    def getmany(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        return self._call(Consumer.getmany, timeout_ms, max_records)

    def commit(self, offsets=None) -> None:
        self._call(Consumer.commit, offsets)

    def committed(self, tp):
        return self._call(Consumer.committed, tuple(tp))

    def __iter__(self) -> Iterator:
        while True:
            if self._client is not None and self._client._closed:
                return
            yield from self.getmany(timeout_ms=500)


async def _run_sync(client, fn, *args):
    return fn(client, *args)


class SyncAdmin(_SyncBase):
    """Blocking ``Admin``."""

    _client_cls = Admin
    _thread_name = "sluice-admin"

    def create_topic(self, name: str, partitions: int = 1, config=None) -> None:
        self._call(Admin.create_topic, name, partitions, config)

    def delete_topic(self, name: str) -> None:
        self._call(Admin.delete_topic, name)

    def list_topics(self):
        return self._call(Admin.list_topics)

    def describe_topic(self, name: str):
        return self._call(Admin.describe_topic, name)

    def list_offsets(self, topic: str, partitions=None, timestamp: int = -1) -> dict[int, int]:
        return self._call(Admin.list_offsets, topic, partitions, timestamp)
