"""The etcd connection of an ``EtcdStore`` (etcd.py): endpoints, bounded calls, watches.

``EtcdClient`` holds the gRPC client of one endpoint at a time and runs every etcd call
of the store: bounded by ``request_timeout_ms``, its errors translated into Sluice errors
(``MetadataUnavailable``, retriable, naming the endpoint), moving to the next endpoint
after a call that could not reach one (with several).  gRPC reconnects on its own, at
most a second apart, so calls work again as soon as etcd is back.  It also follows key
prefixes through outages (``follow``), retries read-check-write loops lost to concurrent
writers (``retrying``), decodes stored JSON, and owns the store's background tasks.  It
knows nothing of the key layout, the session or the controller (etcd_session.py,
etcd_election.py).

Event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import aetcd
import msgspec
from aetcd import rpc

from sluice.errors import InvalidPartitions, InvalidRequest, MetadataUnavailable, UnknownServerError

log = logging.getLogger("sluice.cluster")

T = TypeVar("T")

_GRPC_OPTIONS = {
    # reconnect within a second of etcd coming back, not after gRPC's default 2 minutes
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # notice a silently dead connection under a watch (etcd refuses pings under 5 s apart)
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}
_CONTENDED_TRIES = 20  # read-check-write loops lost to concurrent writers before giving up


class EtcdClient:
    """The connection to the etcd endpoints ``endpoints`` (tried in turn) for cluster
    ``cluster`` (named in errors); every call bounded by ``request_timeout`` seconds."""

    def __init__(self, endpoints: list[tuple[str, int]], cluster: str, request_timeout: float) -> None:
        self.endpoints = endpoints
        self.cluster = cluster
        self.request_timeout = request_timeout
        self._endpoint = 0
        self.client = self._new_client()
        self.tasks: set[asyncio.Task] = set()
        self.closed = False  # set by the store's close: watches end, no endpoint is changed

    def where(self) -> str:
        host, port = self.endpoints[self._endpoint]
        return f"etcd {host}:{port}, cluster {self.cluster!r}"

    @property
    def transactions(self):
        """Builders of compares and operations for ``txn`` (the current client's)."""
        return self.client.transactions

    def _new_client(self) -> aetcd.Client:
        host, port = self.endpoints[self._endpoint]
        return aetcd.Client(host, port, timeout=self.request_timeout, options=_GRPC_OPTIONS)

    def spawn(self, coro) -> asyncio.Task:
        """Run ``coro`` as a background task of the store (cancelled by ``stop_tasks``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def stop_tasks(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:  # bounded: a task stuck in the etcd client must not hold the close
            await asyncio.wait(list(self.tasks), timeout=2 * self.request_timeout)

    async def close(self) -> None:
        await _close_quietly(self.client)

    async def call(
        self, what: str, op: Callable[[aetcd.Client], Awaitable[T]], timeout: float | None = None
    ) -> T:
        """Run one etcd call within the request timeout; errors become Sluice errors."""
        client = self.client
        try:
            return await bounded(op(client), timeout or self.request_timeout)
        except aetcd.InvalidArgumentError as exc:
            if "too many operations" in str(exc):
                raise InvalidPartitions(
                    f"{what}: etcd allows at most --max-txn-ops operations (128 by default) in "
                    f"one transaction, one per partition: create or grow the topic by fewer "
                    f"partitions at a time, or raise that limit of etcd"
                ) from exc
            raise InvalidRequest(f"{what}: etcd refused it: {exc}") from exc
        except (TimeoutError, aetcd.ClientError, rpc.AioRpcError) as exc:
            if isinstance(exc, TimeoutError):
                why = (
                    f"{self.where()} did not answer within {(timeout or self.request_timeout) * 1000:.0f} ms "
                    "(a change may still take effect when it does: check before retrying)"
                )
            else:
                why = f"{self.where()} failed ({str(exc) or type(exc).__name__})"
            if isinstance(exc, TimeoutError | aetcd.ConnectionFailedError | aetcd.ConnectionTimeoutError):
                await self._next_endpoint(client)
            raise MetadataUnavailable(f"{what}: {why}; retry when etcd is back") from exc

    async def _next_endpoint(self, failed: aetcd.Client) -> None:
        if len(self.endpoints) == 1 or failed is not self.client or self.closed:
            return
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)
        self.client = self._new_client()
        log.warning("moving to %s", self.where())
        self.spawn(_close_quietly(failed))

    async def cancel(self, watch) -> None:
        with contextlib.suppress(Exception):
            await bounded(watch.cancel(), self.request_timeout)

    async def txn(self, what: str, compare: list, success: list, failure: Sequence = ()):
        return await self.call(
            what, lambda c: c.transaction(compare=compare, success=success, failure=list(failure))
        )

    async def retrying(self, what: str, attempt: Callable[[], Awaitable[T | None]]) -> T:
        """Repeat a read-check-write ``attempt`` until it returns something other than None
        (None: a concurrent writer won the race)."""
        for _ in range(_CONTENDED_TRIES):
            result = await attempt()
            if result is not None:
                return result
        raise MetadataUnavailable(f"{what}: lost {_CONTENDED_TRIES} races to concurrent writers; retry")

    def decode(self, key: bytes, value: bytes, type_: type[T]) -> T:
        try:
            return msgspec.json.decode(value, type=type_)
        except msgspec.MsgspecError as exc:
            raise UnknownServerError(
                f"{self.where()}: key {key.decode(errors='replace')} holds {value[:200]!r}, "
                f"not a {type_.__name__} ({exc})"
            ) from exc

    async def follow(self, prefix: bytes) -> AsyncIterator[list[tuple[bytes, object | None]]]:
        """Changes under ``prefix`` as lists of ``(key, kv or None if deleted)``.

        The first list holds every key present (maybe none); after an outage or a compacted
        revision the prefix is read again and the differences yielded.  Ends on close.
        """
        known: dict[bytes, int] = {}  # key -> mod_revision
        first, failing = True, False
        while not self.closed:
            watch = None
            try:
                snap = await self.call(f"read {prefix.decode()}", lambda c: c.get_prefix(prefix))
                failing = False
                current = {kv.key: kv for kv in snap}
                diff = [(k, kv) for k, kv in sorted(current.items()) if known.get(k) != kv.mod_revision]
                diff += [(k, None) for k in sorted(known.keys() - current.keys())]
                known = {k: kv.mod_revision for k, kv in current.items()}
                if diff or first:
                    first = False
                    yield diff
                start = snap.header.revision + 1
                watch = await self.call(
                    f"watch {prefix.decode()}", lambda c, start=start: c.watch_prefix(prefix, start_revision=start)
                )
                async for event in watch:
                    if event.kind == "DELETE":
                        known.pop(event.kv.key, None)
                        yield [(event.kv.key, None)]
                    else:
                        known[event.kv.key] = event.kv.mod_revision
                        yield [(event.kv.key, event.kv)]
            except (MetadataUnavailable, aetcd.ClientError) as exc:
                (log.debug if failing else log.info)(
                    "watch of %s interrupted (%s); catching up when etcd answers", prefix.decode(), exc
                )
                failing = True
                await asyncio.sleep(min(0.5, self.request_timeout))
            finally:
                if watch is not None:
                    await self.cancel(watch)


async def _close_quietly(client: aetcd.Client) -> None:
    with contextlib.suppress(Exception):
        await bounded(client.close(), 2)


async def bounded(aw: Awaitable[T], timeout: float) -> T:
    """``await aw``, but return (raising ``TimeoutError``) after ``timeout`` seconds even if
    ``aw`` ignores its cancellation: it runs as a task of its own, cancelled and left
    behind when late.  (``asyncio.timeout`` alone cannot bound aetcd, whose watch teardown
    swallows ``CancelledError`` and can block on a full request queue once etcd went away.)"""
    task = asyncio.ensure_future(aw)
    # its outcome is seen even when nobody reads it: late, or this caller cancelled (as
    # ``PeerLiveness`` cancels its watchers) just as the call ended
    task.add_done_callback(_retrieve)
    try:
        done, _ = await asyncio.wait([task], timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        raise TimeoutError
    return task.result()


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
