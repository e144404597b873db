"""Client connections to brokers, and the metadata cache that routes partitions to them.

Only this module touches sockets on the client side.  ``Connection`` speaks the handshake and
frames of ``protocol.frames`` over an ``asyncio.Protocol`` and multiplexes requests by
correlation id; ``Cluster`` keeps what the last ``MetadataResponse`` said (topic -> partition
count, leader node per partition, max message bytes) and one ``Connection`` per broker.

Concurrency: everything here runs on one event loop and is not thread-safe; the sync
facade (``client.sync``) gives each client its own loop thread.  Producers and consumers take
a ``connection_factory`` (``async (host, port) -> Connection-like``) so unit tests can swap in
an in-memory broker.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from sluice import errors
from sluice.protocol import frames, messages
from sluice.protocol.coordinator import GROUPS_TOPIC, group_partition

ConnectionFactory = Callable[[str, int], Awaitable["Connection"]]

DEFAULT_PORT = 7400  # what `sluice serve` listens on
HANDSHAKE_TIMEOUT = 5.0  # seconds for a connected peer to answer the handshake


class _Protocol(asyncio.Protocol):
    """Bytes in -> frames -> pending futures; the asyncio half of ``Connection``."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def connection_made(self, transport) -> None:
        self.conn._connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.conn._data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn._paused = True

    def resume_writing(self) -> None:
        self.conn._resume_writing()


class Connection:
    """One handshaken connection to a broker; requests multiplexed by correlation id.

    Create with ``await Connection.open(host, port)``.  Any number of coroutines may call
    ``request`` concurrently; responses are matched to requests by correlation id, in
    whatever order the broker answers.  When the connection breaks or is closed, every
    pending request fails with ``errors.ConnectionClosed`` and later calls fail at once.
    """

    def __init__(
        self, host: str, port: int, *, max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self.host, self.port = host, port
        self._loop = asyncio.get_running_loop()
        self._reader = frames.FrameReader(max_frame_bytes, handshake=True)
        self._transport: asyncio.Transport | None = None
        # correlation id -> (future, response type, raise error responses)
        self._pending: dict[int, tuple[asyncio.Future, type, bool]] = {}
        self._correlation = itertools.count(1)
        self._handshake: asyncio.Future = self._loop.create_future()
        self._closed_fut: asyncio.Future = self._loop.create_future()
        self._paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._error: Exception | None = None  # why the connection is unusable
        self.version = 0
        # called with each server push (frames.PUSH: key, version, decoded struct, the
        # frame's attachments); pushes arriving while it is None are dropped
        self.on_push: Callable[[int, int, object, memoryview], None] | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Connection {self.host}:{self.port} {state} pending={len(self._pending)}>"

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        connect_timeout: float = 10.0,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
    ) -> Connection:
        """Connect and handshake.

        ``BrokerUnreachable`` when the TCP connect fails or takes over ``connect_timeout``;
        ``HandshakeTimeout`` when the peer accepts but does not answer the handshake within
        ``handshake_timeout`` (it is probably not a Sluice broker); ``ProtocolError`` when
        it answers something that is not a Sluice handshake.  A broker refusing the
        handshake raises the error of its code.
        """
        conn = cls(host, port, max_frame_bytes=max_frame_bytes)
        loop = conn._loop
        try:
            try:
                async with asyncio.timeout(connect_timeout):
                    await loop.create_connection(lambda: _Protocol(conn), host, port)
            except TimeoutError:
                raise errors.BrokerUnreachable(
                    f"cannot connect to {host}:{port}: no answer within {connect_timeout:g}s"
                ) from None
            except OSError as exc:
                raise errors.BrokerUnreachable(
                    f"cannot connect to {host}:{port}: {_os_reason(exc)}"
                ) from exc
            try:
                async with asyncio.timeout(handshake_timeout):
                    await conn._handshake
            except TimeoutError:
                raise errors.HandshakeTimeout(
                    f"connected to {host}:{port} but it did not answer the Sluice handshake "
                    f"within {handshake_timeout:g}s: is it a Sluice broker?"
                ) from None
            except errors.ProtocolError as exc:
                raise type(exc)(f"{host}:{port} is not a Sluice broker: {exc}") from exc
            except errors.ConnectionClosed as exc:
                raise errors.ConnectionClosed(
                    f"{host}:{port} closed the connection before answering the Sluice "
                    "handshake: is it a Sluice broker?"
                ) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def closed(self) -> bool:
        return self._error is not None

    def close(self) -> None:
        """Close the connection; pending requests fail with ``ConnectionClosed``."""
        if self._error is None:
            self._fail(errors.ConnectionClosed(f"connection to {self.host}:{self.port} closed"))
        if self._transport is not None:
            self._transport.close()
        elif not self._closed_fut.done():
            self._closed_fut.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed_fut)

    # ------------------------------------------------------------------ requests

    async def request(
        self, request, attachments=(), timeout: float | None = None, *, check: bool = True
    ):
        """Send ``request`` and return ``(response, attachments_memoryview)``.

        Raises the broker's error when the response's top-level ``error`` is set (with
        ``check=False`` such a response is returned like any other: the caller reads
        ``error``), ``ConnectionClosed`` if the connection breaks first, and
        ``RequestTimedOut`` after ``timeout`` seconds.  A timeout **closes the connection**:
        the broker may still be executing the request, and a retry sent on the same
        connection could run beside it; every other request pending on the connection then
        fails with ``ConnectionClosed``.  Any exception raised here means no answer was
        read, so the request's fate on the broker is unknown once it was written.
        """
        return await self.write_request(request, attachments, timeout, check=check)

    def write_request(
        self, request, attachments=(), timeout: float | None = None, *, check: bool = True
    ) -> asyncio.Future:
        """``request`` without the coroutine: write the request now, before returning, and
        return the future of its answer, which ``request`` awaits (the same outcomes).
        Raises at once, having written nothing, when the connection is unusable or the
        request cannot be encoded.  Cancelling the future forgets the request: a late
        answer is ignored."""
        if self._error is not None:
            raise self._error
        api, version = messages.api_of(request)
        response_type = messages.types_for(api, version)[1]
        header = _encode(request)  # before anything is registered: it may raise
        correlation = next(self._correlation) & 0xFFFFFFFF
        fut = self._loop.create_future()
        self._pending[correlation] = (fut, response_type, check)
        self._transport.writelines(
            frames.encode_frame(frames.REQUEST, api, version, correlation, header, attachments)
        )
        handle = None
        if timeout is not None:
            handle = self._loop.call_later(timeout, self._expire, correlation, api, timeout)
        fut.add_done_callback(functools.partial(self._forget, correlation, handle))
        return fut

    def _forget(self, correlation: int, handle: asyncio.TimerHandle | None, fut: asyncio.Future) -> None:
        """A request's answer is in (or its caller gone): drop its timer and its entry."""
        if handle is not None:
            handle.cancel()
        self._pending.pop(correlation, None)

    def send_noreply(self, request, attachments=()) -> None:
        """Write a request the broker will not answer (produce with ``acks=0``)."""
        if self._error is not None:
            raise self._error
        api, version = messages.api_of(request)
        header = _encode(request)
        correlation = next(self._correlation) & 0xFFFFFFFF
        self._transport.writelines(
            frames.encode_frame(frames.REQUEST, api, version, correlation, header, attachments)
        )

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._error is not None:
            raise self._error
        if not self._paused:
            return
        fut = self._loop.create_future()
        self._drain_waiters.append(fut)
        await fut

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ protocol callbacks

    def _connection_made(self, transport) -> None:
        self._transport = transport
        transport.write(frames.encode_client_handshake())

    def _data_received(self, data: bytes) -> None:
        try:
            events = self._reader.feed(data)
        except errors.ProtocolError as exc:
            # Frames completed before the bad bytes are real answers: deliver them first.
            self._on_events(getattr(exc, "events", ()))
            self._fail(exc)
            self._transport.close()
            return
        self._on_events(events)

    def _on_events(self, events) -> None:
        pending = self._pending
        for ev in events:
            if type(ev) is frames.Handshake:
                self._on_handshake(ev)
                continue
            if ev.kind == frames.PUSH:
                self._on_push(ev)
                continue
            if ev.kind != frames.RESPONSE:
                continue
            if ev.correlation == 0 and ev.api == frames.CONNECTION_ERROR_API:
                # the broker reports why it is about to close the connection
                try:
                    err = messages.decode(ev.header, messages.Response)
                    self._fail(errors.error_for_code(err.error, err.message))
                except errors.SluiceError as exc:
                    self._fail(errors.ProtocolError(f"undecodable connection error: {exc}"))
                continue
            entry = pending.pop(ev.correlation, None)
            if entry is None:
                continue  # timed out or cancelled: the caller is gone
            fut, response_type, check = entry
            if fut.done():
                continue
            try:
                response = messages.decode(ev.header, response_type)
            except errors.SluiceError as exc:
                # messages.decode speaks for the broker side (InvalidRequest); from a
                # broker it means the peer broke the protocol.
                fut.set_exception(errors.ProtocolError(f"undecodable response: {exc}"))
                continue
            if response.error and check:
                fut.set_exception(errors.error_for_code(response.error, response.message))
            else:
                fut.set_result((response, ev.attachments))

    def _on_push(self, ev: frames.Frame) -> None:
        """Hand a server push to ``on_push``; unknown or undecodable pushes are dropped
        (a newer broker may push what this client does not know)."""
        handler = self.on_push
        if handler is None:
            return
        try:
            push_type = messages.PUSHES[messages.Push(ev.api)][ev.version]
            message = messages.decode(ev.header, push_type)
        except (ValueError, KeyError, errors.SluiceError):
            return
        handler(ev.api, ev.version, message, ev.attachments)

    def _on_handshake(self, ev: frames.Handshake) -> None:
        if self._handshake.done():
            return
        if ev.second != 0:
            exc = errors.error_for_code(ev.second, "broker refused the handshake")
        elif not frames.MIN_PROTOCOL_VERSION <= ev.first <= frames.PROTOCOL_VERSION:
            exc = errors.ProtocolError(f"broker chose unsupported protocol version {ev.first}")
        else:
            self.version = ev.first
            self._handshake.set_result(None)
            return
        self._fail(exc)
        self._transport.close()

    def _connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to {self.host}:{self.port} lost"
        if exc is not None:
            reason += f": {exc}"
        self._fail(errors.ConnectionClosed(reason))
        if not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def _resume_writing(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _expire(self, correlation: int, api: int, timeout: float) -> None:
        """A request's timeout: fail it, then close the connection (see ``request``)."""
        entry = self._pending.pop(correlation, None)
        if entry is None or entry[0].done():
            return
        what = f"{messages.Api(api).name} to {self.host}:{self.port}"
        entry[0].set_exception(
            errors.RequestTimedOut(f"no answer to {what} within {timeout:g}s")
        )
        self._fail(errors.ConnectionClosed(f"connection closed: {what} timed out after {timeout:g}s"))
        if self._transport is not None:
            self._transport.abort()  # unsent bytes of the request are dropped, not delivered late

    def _fail(self, exc: Exception) -> None:
        """Make the connection unusable and fail everything waiting on it.

        Waiters get ``_waiter_error(exc)``: the broker's own error class when the broker
        said why (a non-retriable refusal stays non-retriable), else ``ConnectionClosed``.
        """
        if self._error is None:
            self._error = exc
        pending, self._pending = self._pending, {}
        for fut, *_ in pending.values():
            if not fut.done():
                fut.set_exception(_waiter_error(exc))
        if not self._handshake.done():
            self._handshake.set_exception(exc)
            self._handshake.exception()  # retrieved: open() reports it
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(_waiter_error(exc))


def _encode(request) -> bytes:
    """The request's header bytes; ``ConfigError`` when a number in it does not fit the
    wire format (an offset past 2**63, say): a caller's mistake, found before sending."""
    try:
        return messages.encode(request)
    except OverflowError as exc:
        raise errors.ConfigError(
            f"{type(request).__name__} cannot be sent: a number in it is out of range ({exc})"
        ) from exc


def _os_reason(exc: OSError) -> str:
    """A short reason for a failed connect: "Connection refused", "Name or service not
    known" (the name did not resolve), else the exception's text."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror})"
    if exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


def _waiter_error(exc: Exception) -> Exception:
    """A fresh exception for one waiter of a failed connection (see ``Connection._fail``)."""
    if isinstance(exc, errors.BrokerError):
        return errors.error_for_code(exc.code, exc.message)
    if isinstance(exc, errors.ConnectionClosed):
        return exc
    err = errors.ConnectionClosed(str(exc))
    err.__cause__ = exc
    return err


# ---------------------------------------------------------------------- cluster metadata


@dataclass(slots=True)
class TopicInfo:
    """What the client knows of one topic: leaders indexed by partition (-1: no leader)."""

    name: str
    leaders: list[int]
    max_message_bytes: int

    @property
    def partitions(self) -> int:
        return len(self.leaders)


def parse_bootstrap(bootstrap: str | Iterable[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` or a list of ``"host:port"`` -> addresses; ``ConfigError``.

    The port defaults to ``DEFAULT_PORT`` and must be 1-65535; an IPv6 address takes
    brackets when it has a port (``[::1]:7400``).
    """
    items = bootstrap.split(",") if isinstance(bootstrap, str) else None
    if items is None and isinstance(bootstrap, Iterable) and not isinstance(bootstrap, bytes | bytearray):
        items = list(bootstrap)
    if items is None or not all(isinstance(item, str) for item in items):
        raise errors.ConfigError(f"bootstrap must be 'host:port[,host:port...]' or a list of them, got {bootstrap!r}")
    out = [_parse_address(item.strip()) for item in items if item.strip()]
    if not out:
        raise errors.ConfigError("bootstrap must name at least one host:port")
    return out


def _parse_address(item: str) -> tuple[str, int]:
    """One ``host[:port]``, ``[v6]:port`` or bare IPv6 address -> ``(host, port)``."""
    if "/" in item or "@" in item:
        raise errors.ConfigError(f"bad bootstrap address {item!r}: expected host:port, not a URL")
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise errors.ConfigError(f"bad bootstrap address {item!r}: expected [IPv6]:port")
        port = rest[1:] if rest else str(DEFAULT_PORT)
    elif item.count(":") > 1:  # a bare IPv6 address: no port
        host, port = item, str(DEFAULT_PORT)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise errors.ConfigError(
                f"bad bootstrap address {item!r}: neither host:port nor an IPv6 address"
            ) from None
    else:
        host, sep, port = item.partition(":")
        if not sep:
            port = str(DEFAULT_PORT)
    if not port.isascii() or not port.isdigit():
        raise errors.ConfigError(f"bad bootstrap address {item!r}: port {port!r} is not a number")
    if not 1 <= int(port) <= 65535:
        raise errors.ConfigError(f"bad bootstrap address {item!r}: port {port} is not in 1-65535")
    return host or "localhost", int(port)


async def _default_factory(host: str, port: int, **kw) -> Connection:
    return await Connection.open(host, port, **kw)


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
