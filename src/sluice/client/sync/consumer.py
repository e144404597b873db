"""``SyncConsumer``: the blocking ``Consumer`` (client/consumer.py), iterable."""

from __future__ import annotations

from collections.abc import Iterator

from sluice import errors
from sluice.client.consumer import Consumer
from sluice.client.sync.base import SyncBase

__all__ = ["SyncConsumer"]


def _materialized(items):
    """An argument a consumer method iterates, listed in the calling thread (a generator
    is not shared with the loop thread); a str, bytes or tuple as is, so that ``Consumer``
    refuses a bare name or pair (``TypeError``) instead of taking its letters."""
    return items if isinstance(items, str | bytes | tuple) else list(items)



class SyncConsumer(SyncBase):
    """Blocking ``Consumer``.  ``assign`` / ``subscribe`` / ``seek`` may be called before
    first use; iteration yields records, blocking up to ``poll_timeout_ms`` per poll.

    Iteration advances the position past each record as it is yielded, never further:
    after a ``break``, ``position`` and ``commit`` stand right after the last record the
    loop body saw, and ``getmany`` returns the records iteration had fetched but not
    yielded.  A seek (or new assignment) made through this facade during iteration drops
    the records fetched before it.  Iteration ends when the consumer is closed.
    """

    _client_cls = Consumer
    _thread_name = "sluice-consumer"

    def __init__(self, bootstrap, **config) -> None:
        super().__init__(bootstrap, **config)
        self._generation = 0  # bumped by calls that move positions; iteration re-fetches

    def assign(self, partitions) -> None:
        self._generation += 1
        self._call(_run_sync, Consumer.assign, _materialized(partitions))

    def subscribe(self, topics) -> None:
        self._generation += 1
        self._call(_run_sync, Consumer.subscribe, _materialized(topics))

    def assignment(self) -> list:
        return self._call(_run_sync, Consumer.assignment)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._generation += 1
        self._call(_run_sync, Consumer.seek, topic, partition, offset)

    def position(self, tp):
        return self._call(_run_sync, Consumer.position, tuple(tp))

    def seek_to_beginning(self, *tps) -> None:
        self._generation += 1
        self._call(Consumer.seek_to_beginning, *tps)

    def seek_to_end(self, *tps) -> None:
        self._generation += 1
        self._call(Consumer.seek_to_end, *tps)

    def seek_to_time(self, timestamp_ms: int, *tps) -> None:
        self._generation += 1
        self._call(Consumer.seek_to_time, timestamp_ms, *tps)

    def start(self) -> None:
        """Connect to the bootstrap brokers now (the first call that needs them does
        otherwise), as ``await Consumer.start()``."""
        self._call(Consumer.start)

    def getmany(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        self._generation += 1
        return self._call(Consumer.getmany, timeout_ms, max_records)

    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        """The records ready, waiting up to ``timeout_ms`` for some: ``getmany``."""
        return self.getmany(timeout_ms, max_records)

    def commit(self, offsets=None) -> None:
        self._call(Consumer.commit, offsets)

    def committed(self, tp):
        return self._call(Consumer.committed, tuple(tp))

    def __iter__(self) -> Iterator:
        while True:
            try:
                client, lt = self._ensure()
                chunk = lt.run(client._next_chunk(500))
            except errors.ClientClosed:
                return
            generation = self._generation
            for rec in chunk:
                if self._generation != generation:
                    break  # sought meanwhile: these records are stale
                try:
                    # FIFO with later calls from this thread: position() or commit() in
                    # the loop body already see this record as consumed.
                    lt.call_soon(client._handed_out, rec)
                except errors.ClientClosed:
                    return
                yield rec



async def _run_sync(client, fn, *args):
    return fn(client, *args)

