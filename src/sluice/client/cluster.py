"""The cluster as a client sees it: the metadata cache that routes partitions to brokers,
one ``Connection`` (client/transport.py) per broker, and the way to a group's coordinator.

``Cluster`` keeps what the last ``MetadataResponse`` said (topic -> partition count, leader
node per partition, max message bytes) and opens connections by node id.

Concurrency: everything here runs on one event loop and is not thread-safe; the sync
facade (``client.sync``) gives each client its own loop thread.  Clients take a
``connection_factory`` (``async (host, port) -> Connection-like``) so unit tests can swap in
an in-memory broker.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sluice import errors
from sluice.client.addresses import parse_bootstrap
from sluice.client.transport import Connection, ConnectionFactory
from sluice.protocol import frames, messages
from sluice.protocol.coordinator import GROUPS_TOPIC, group_partition


@dataclass(slots=True)
class TopicInfo:
    """What the client knows of one topic: leaders indexed by partition (-1: no leader)."""

    name: str
    leaders: list[int]
    max_message_bytes: int

    @property
    def partitions(self) -> int:
        return len(self.leaders)



class Cluster:
    """Metadata cache and connection pool: (topic, partition) -> leader node -> Connection.

    ``refresh(topics)`` asks any reachable broker for metadata.  Connections are keyed by
    address and reached through node ids, so a single-node cluster reuses its bootstrap
    connection and several brokers work the same way.  A broken connection is dropped and
    reopened on next use.

    Callers that need the same address while it is being opened share one connect task and
    wait on it through ``asyncio.shield``: cancelling one caller never fails another, and
    the connect finishes (or fails) for the others.  ``close()`` cancels connects still
    running; their waiters get ``ClientClosed``.

    Requests to "any broker" (metadata, admin) avoid brokers that failed lately: one whose
    request timed out, whose connection broke or could not be opened is asked last until
    it answers again.  Otherwise a stalled broker (SIGSTOP, a partitioned host: it accepts
    connections but never answers) that was the controller would be asked again and again,
    and a client could never learn who leads now.
    """

    def __init__(
        self,
        bootstrap: str | Iterable[str],
        *,
        connection_factory: ConnectionFactory | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self._factory = connection_factory
        self._connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._max_frame_bytes = max_frame_bytes
        self._conns: dict[tuple[str, int], Connection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Task] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.unknown: dict[str, errors.BrokerError] = {}  # topic -> error of last refresh
        self.controller_id = -1
        self._failed: dict[tuple[str, int], float] = {}  # address -> when it last failed
        self._closed = False

    # ------------------------------------------------------------------ connections

    async def _connect(self, addr: tuple[str, int]) -> Connection:
        if self._closed:
            raise errors.ClientClosed("client is closed")
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        task = self._connecting.get(addr)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._open(addr), name=f"sluice-connect-{addr[0]}:{addr[1]}"
            )
            self._connecting[addr] = task
            task.add_done_callback(functools.partial(self._connect_done, addr))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                # the shared connect was cancelled by close(), not this caller
                raise errors.ClientClosed("client closed while connecting") from None
            raise

    async def _open(self, addr: tuple[str, int]) -> Connection:
        """The shared connect task of ``_connect``; bounded by ``connect_timeout``."""
        if self._factory is not None:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    conn = await self._factory(*addr)
            except TimeoutError:
                raise errors.BrokerUnreachable(
                    f"connecting to {addr[0]}:{addr[1]} timed out after {self._connect_timeout:g}s"
                ) from None
        else:
            conn = await Connection.open(
                *addr, connect_timeout=self._connect_timeout, max_frame_bytes=self._max_frame_bytes
            )
        if self._closed:
            conn.close()
            raise errors.ClientClosed("client closed while connecting")
        self._conns[addr] = conn
        return conn

    def _connect_done(self, addr: tuple[str, int], task: asyncio.Task) -> None:
        if self._connecting.get(addr) is task:
            del self._connecting[addr]
        if not task.cancelled():
            task.exception()  # every waiter may be gone: nobody else would retrieve it

    async def connection(self, node_id: int) -> Connection:
        """The connection to broker ``node_id`` (opened on demand)."""
        addr = self.brokers.get(node_id)
        if addr is None:
            raise errors.NotLeader(f"broker {node_id} is not in the cluster metadata")
        return await self._connect(addr)

    def connected(self, node_id: int) -> Connection | None:
        """The open connection to broker ``node_id`` when there is one, else None (then
        ``connection`` opens one)."""
        addr = self.brokers.get(node_id)
        conn = self._conns.get(addr) if addr is not None and not self._closed else None
        return conn if conn is not None and not conn.closed else None

    def node_failed(self, node_id: int) -> None:
        """A request to broker ``node_id`` broke or timed out: ask it last for metadata."""
        addr = self.brokers.get(node_id)
        if addr is not None:
            self._failed[addr] = time.monotonic()

    async def any_connection(self) -> Connection:
        """A connection to some live broker: the controller, an open one, else bootstrap;
        brokers that failed lately come last, the longest-failed first."""
        addr = self.brokers.get(self.controller_id)
        if addr is not None and addr not in self._failed:
            try:
                return await self._connect(addr)
            except errors.ConnectionClosed:
                self._failed[addr] = time.monotonic()
        for a, conn in self._conns.items():
            if not conn.closed and a not in self._failed:
                return conn
        failures: list[errors.ConnectionClosed] = []
        candidates = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap]))
        candidates.sort(key=lambda a: self._failed.get(a, -math.inf))  # stable: healthy first
        for addr in candidates:
            try:
                return await self._connect(addr)
            except errors.ConnectionClosed as exc:
                self._failed[addr] = time.monotonic()
                failures.append(exc)
        if len(failures) == 1:
            raise failures[0]
        raise errors.BrokerUnreachable(
            "no broker reachable: " + "; ".join(str(exc) for exc in failures)
        )

    async def request(self, request, attachments=(), timeout: float | None = None):
        """Send ``request`` to any broker (metadata, admin).  A broker that does not answer
        (timeout, broken connection) is asked last next time."""
        conn = await self.any_connection()
        addr = next((a for a, c in self._conns.items() if c is conn), None)
        try:
            result = await conn.request(request, attachments, timeout or self.request_timeout)
        except (errors.ConnectionClosed, errors.RequestTimedOut):
            self._failed[addr] = time.monotonic()
            raise
        self._failed.pop(addr, None)
        return result

    async def coordinator(self, group: str) -> Connection:
        """The connection to ``group``'s coordinator: the leader of its ``__groups``
        partition (protocol/coordinator.py), from metadata, refreshed when unknown.
        ``NotCoordinator`` (retriable) while that partition has no leader."""
        for attempt in range(2):
            info = self.topics.get(GROUPS_TOPIC)
            if info is not None:
                leader = info.leaders[group_partition(group, info.partitions)]
                if leader >= 0 and leader in self.brokers:
                    return await self.connection(leader)
            if attempt == 0:
                await self.refresh([GROUPS_TOPIC])
        error = self.unknown.get(GROUPS_TOPIC)
        if error is not None:
            raise errors.NotCoordinator(f"no coordinator for group {group!r}: {error}") from error
        raise errors.NotCoordinator(f"no coordinator for group {group!r}: its {GROUPS_TOPIC} partition has no leader")

    async def coordinator_request(
        self, group: str, request, check: Callable[[object], None] | None = None, timeout: float | None = None
    ):
        """Send a group request to ``group``'s coordinator; return the response.

        ``check(response)`` raises the errors the response carries per partition or per
        group.  On ``NotCoordinator`` (answered or raised by ``check``) or a lost
        connection, the cached leaders of ``__groups`` are forgotten and the error raised:
        the caller retries, and the retry asks the metadata again.
        """
        try:
            conn = await self.coordinator(group)
            response, _ = await conn.request(request, (), timeout or self.request_timeout)
            if check is not None:
                check(response)
            return response
        except (errors.NotCoordinator, errors.ConnectionClosed):
            self.mark_stale(GROUPS_TOPIC)
            raise

    # ------------------------------------------------------------------ metadata

    async def refresh(
        self, topics: Iterable[str] | None = None, timeout: float | None = None
    ) -> messages.MetadataResponse:
        """Fetch metadata for ``topics`` (None: all) and update the cache; ``timeout``
        bounds the request (default ``request_timeout``).

        Topics the broker reports with an error are dropped from ``topics`` and their error
        kept in ``unknown``.
        """
        wanted = None if topics is None else sorted(set(topics))
        response, _ = await self.request(messages.MetadataRequest(topics=wanted), timeout=timeout)
        self._apply(response)
        return response

    def _apply(self, response: messages.MetadataResponse) -> None:
        boot_hosts = {h for h, _ in self.bootstrap}
        for b in response.brokers:
            host = b.host
            if host in ("", "0.0.0.0", "::") and len(boot_hosts) == 1:
                # A broker bound to a wildcard address: reach it the way we reached bootstrap.
                host = next(iter(boot_hosts))
            self.brokers[b.node_id] = (host, b.port)
        self.controller_id = response.controller_id
        for t in response.topics:
            if t.error:
                self.topics.pop(t.name, None)
                self.unknown[t.name] = errors.error_for_code(t.error, t.message or t.name)
                continue
            self.unknown.pop(t.name, None)
            count = max((p.partition for p in t.partitions), default=-1) + 1
            leaders = [-1] * count
            for p in t.partitions:
                leaders[p.partition] = p.leader if not p.error else -1
            self.topics[t.name] = TopicInfo(t.name, leaders, t.max_message_bytes)

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def leader(self, topic: str, partition: int) -> int:
        """Leader node id of a partition, or -1 when unknown."""
        info = self.topics.get(topic)
        if info is None or partition >= len(info.leaders):
            return -1
        return info.leaders[partition]

    def leaders(self, topic: str, n: int) -> list[int]:
        """Leader node ids of the ``n`` first partitions of ``topic`` (-1: unknown)."""
        info = self.topics.get(topic)
        known = info.leaders[:n] if info is not None else []
        return known + [-1] * (n - len(known))

    def mark_stale(self, topic: str) -> None:
        """Forget a topic's leaders (after NotLeader); the next refresh restores them."""
        info = self.topics.get(topic)
        if info is not None:
            info.leaders = [-1] * len(info.leaders)

    # ------------------------------------------------------------------ shutdown

    async def close(self) -> None:
        """Close every connection and cancel connects in progress.  Idempotent."""
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
        for c in conns:
            await c.wait_closed()
