"""One client connection to a broker.

Only this module touches sockets on the client side.  ``Connection`` speaks the handshake and
frames of ``protocol.frames`` over an ``asyncio.Protocol`` and multiplexes requests by
correlation id.  Which broker to talk to is the cluster's business (client/cluster.py);
broker addresses are parsed in client/addresses.py.

Concurrency: everything here runs on one event loop and is not thread-safe; the sync
facade (``client.sync``) gives each client its own loop thread.  Producers and consumers take
a ``connection_factory`` (``async (host, port) -> Connection-like``) so unit tests can swap in
an in-memory broker.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import socket
from collections.abc import Awaitable, Callable

from sluice import errors
from sluice.protocol import frames, messages

ConnectionFactory = Callable[[str, int], Awaitable["Connection"]]

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
