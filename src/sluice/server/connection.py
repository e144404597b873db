"""One client connection: bytes <-> protocol events <-> broker handlers.

The only server module that touches a transport.  Requests are handled concurrently (one
task per request, never per record) and answered as they complete; correlation ids let the
client match them.  Bad input is answered, then the connection is closed:

- bad handshake magic or no common version: a server handshake with the error code;
- a frame over the cap, a malformed frame, a request that is not a request: a response frame
  with correlation 0 and API 0xFFFF carrying the error;
- an unknown API key or version, an API this broker has no handler for, an undecodable
  header: a response with the request's correlation id carrying UNSUPPORTED_VERSION /
  INVALID_REQUEST.

Nothing a client sends can crash the broker: handler bugs are logged and answered with
UNKNOWN_SERVER_ERROR on that request only.

Each request's handler gets this connection as its peer (broker/peer.py ``Peer``: the
client's ``address``, ``push``, ``on_close``...).  Server push: ``push`` writes a frames.PUSH frame (a messages.PUSHES struct, and
attachments) to the client unasked, e.g. a transaction check to a registered producer
(broker/transactions/) or messages for a subscriber (broker/subscriptions/), which
pushes only while ``writable`` and resumes from ``on_writable``; ``on_close`` callbacks
run when the connection goes, so state tied to it is dropped.

Shutdown (``Server.stop``): requests that arrive are refused (BROKER_SHUTTING_DOWN) but
those of followers (``REPLICA_APIS``): a leader's ``acks=all`` writes in flight complete
only once its followers fetched them, so follower connections stay served until the
clients' requests are done, and are closed last.

Flow control: per connection, at most ``max_in_flight`` requests holding at most
``max_in_flight_bytes`` of frames are handled at once; past either, and while the
transport's write buffer is full, the connection stops reading.
"""

from __future__ import annotations

import asyncio
import logging

from sluice.errors import (
    BrokerError,
    BrokerShuttingDown,
    InvalidRequest,
    ProtocolError,
    TooManyConnections,
    UnknownServerError,
    UnsupportedVersion,
)
from sluice.protocol import frames
from sluice.protocol import messages as m

log = logging.getLogger("sluice.server")

LINGER_S = 1.0  # after an error: how long input is drained before the socket closes
HANDSHAKE_TIMEOUT_S = 10.0
# what followers send; served also while the broker stops (see ``Server.stop``)
REPLICA_APIS = frozenset({m.Api.REPLICA_FETCH, m.Api.OFFSETS_FOR_LEADER_EPOCH})


class Connection(asyncio.Protocol):
    """One client connection; the ``Peer`` (broker/peer.py) of each of its requests:
    every handler is called as ``handler(request, attachments, connection)``."""

    def __init__(self, server) -> None:
        self.server = server
        self.handlers = server.handlers
        self.reader = frames.FrameReader(server.config.max_frame_bytes, handshake=True)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.version: int | None = None
        self.tasks: dict[asyncio.Task, int] = {}  # request task -> bytes of its frame
        self.in_flight_bytes = 0
        self.max_in_flight = server.config.max_in_flight_per_connection
        self.max_in_flight_bytes = server.config.max_in_flight_bytes_per_connection
        self._reading_paused = False
        self._writing_paused = False
        self._closing = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._close_callbacks: list = []
        self.replica = False  # a follower broker's: it sent replica requests
        self._writable_callbacks: list = []

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if not self.server.register(self):
            err = TooManyConnections(f"the broker already has {self.server.config.max_connections} connections")
            transport.write(frames.encode_server_handshake(0, err.code))
            self._close()
            return
        # a peer that never says who it is does not get to hold a connection slot
        self._handshake_timer = asyncio.get_running_loop().call_later(
            HANDSHAKE_TIMEOUT_S, self._handshake_expired
        )

    def _handshake_expired(self) -> None:
        if self.version is None and not self._closing:
            log.info("%s: no handshake within %g s; closing", self.peer, HANDSHAKE_TIMEOUT_S)
            self._close(linger=0)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.server.unregister(self)
        for task in self.tasks:
            task.cancel()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            cb()

    @property
    def address(self) -> str:
        """The client's ``host:port`` (``?`` when unknown)."""
        return self.peer

    @property
    def closed(self) -> bool:
        return self._closing

    def on_close(self, callback) -> None:
        """Call ``callback()`` once when the connection is lost (at once if it is)."""
        if self._closing:
            callback()
        else:
            self._close_callbacks.append(callback)

    def push(self, key: int, version: int, message, attachments=()) -> bool:
        """Write a server push; False (nothing written) when the connection is going."""
        if self._closing or self.version is None or self.transport is None or self.transport.is_closing():
            return False
        self.transport.writelines(frames.encode_frame(frames.PUSH, key, version, 0, m.encode(message), attachments))
        return True

    @property
    def writable(self) -> bool:
        """False while the transport's write buffer is full (push no more until
        ``on_writable`` callbacks run) or the connection is going."""
        return not self._writing_paused and not self._closing

    def on_writable(self, callback) -> None:
        """Call ``callback()`` once, the next time a full write buffer drains."""
        self._writable_callbacks.append(callback)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()
        callbacks, self._writable_callbacks = self._writable_callbacks, []
        for cb in callbacks:
            cb()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        failure = None
        try:
            events = self.reader.feed(data)
        except ProtocolError as exc:
            events, failure = exc.events, exc
        for event in events:
            if isinstance(event, frames.Frame):
                self._on_frame(event)
            else:
                self._on_handshake(event)
            if self._closing:
                return
        if failure is not None:
            self._fail(failure)

    def eof_received(self) -> bool:
        return False  # close our side too once the client is done sending

    # ------------------------------------------------------------------ protocol

    def _on_handshake(self, hs: frames.Handshake) -> None:
        version = frames.negotiate(hs.first, hs.second)
        if version is None:
            log.info("%s: no common protocol version in [%d, %d]", self.peer, hs.first, hs.second)
            self.transport.write(frames.encode_server_handshake(0, UnsupportedVersion.code))
            self._close()
            return
        self.version = version
        self._handshake_timer.cancel()
        self.transport.write(frames.encode_server_handshake(version, 0))

    def _on_frame(self, frame: frames.Frame) -> None:
        if frame.kind != frames.REQUEST:
            self._fail(ProtocolError(f"expected a request frame, got kind {frame.kind}"))
            return
        try:
            req_type, _ = m.types_for(frame.api, frame.version)
            handler = self.handlers.get(frame.api)
            if handler is None:  # in the protocol, but not served by this broker
                raise UnsupportedVersion(f"this broker does not serve {m.Api(frame.api).name}")
            request = m.decode(frame.header, req_type)
        except BrokerError as exc:
            log.info("%s: %s; closing", self.peer, exc)
            self._respond(frame, m.Response(error=exc.code, message=exc.message), ())
            self._close()
            return
        if frame.api in REPLICA_APIS:
            self.replica = True
        elif self.server.stopping:  # followers still fetch: the acks=all writes in flight need them
            exc = BrokerShuttingDown("the broker is shutting down")
            self._respond(frame, m.Response(error=exc.code, message=exc.message), ())
            return
        task = asyncio.ensure_future(self._handle(frame, handler, request))
        size = len(frame.header) + len(frame.attachments)
        self.tasks[task] = size
        self.in_flight_bytes += size
        task.add_done_callback(self._task_done)
        self._update_reading()

    async def _handle(self, frame: frames.Frame, handler, request) -> None:
        try:
            result = await handler(request, frame.attachments, self)
        except BrokerError as exc:
            self._respond(frame, m.Response(error=exc.code, message=exc.message), ())
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: answer this request, keep the broker up
            log.exception("%s: handler for API %d failed", self.peer, frame.api)
            err = UnknownServerError(f"{type(exc).__name__}: {exc}")
            self._respond(frame, m.Response(error=err.code, message=err.message), ())
            return
        if result is not None:
            response, attachments = result
            self._respond(frame, response, attachments)

    def _task_done(self, task: asyncio.Task) -> None:
        self.in_flight_bytes -= self.tasks.pop(task, 0)
        self._update_reading()

    def _respond(self, frame: frames.Frame, response: m.Response, attachments) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        header = m.encode(response)
        self.transport.writelines(
            frames.encode_frame(
                frames.RESPONSE, frame.api, frame.version, frame.correlation, header, attachments
            )
        )

    def _fail(self, exc: ProtocolError) -> None:
        """Answer a broken stream with one last error frame, then close."""
        log.info("%s: protocol error: %s; closing", self.peer, exc)
        err = InvalidRequest(str(exc))
        if self.version is None:
            self.transport.write(frames.encode_server_handshake(0, err.code))
        else:
            header = m.encode(m.Response(error=err.code, message=err.message))
            self.transport.writelines(
                frames.encode_frame(frames.RESPONSE, frames.CONNECTION_ERROR_API, 0, 0, header)
            )
        self._close()

    # ------------------------------------------------------------------ flow control

    def _update_reading(self) -> None:
        if self.transport is None or self._closing:
            return
        should_pause = (
            self._writing_paused
            or len(self.tasks) >= self.max_in_flight
            or self.in_flight_bytes >= self.max_in_flight_bytes
        )
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def _close(self, linger: float = LINGER_S) -> None:
        """Close after an error: send FIN after what was written, then drop the socket.

        Closing at once while the peer is still sending makes the kernel answer with RST,
        which can destroy the error we just wrote before the peer reads it.  So the write
        side is shut first, further input is discarded, and the socket closes ``linger``
        seconds later (or when the peer closes).
        """
        self._closing = True
        t = self.transport
        if t is None or t.is_closing():
            return
        if linger and t.can_write_eof():
            t.write_eof()
            t.resume_reading()  # drain what the peer still sends
            asyncio.get_running_loop().call_later(linger, t.close)
        else:
            t.close()

    async def drain_and_close(self, grace: float) -> None:
        """Let in-flight requests finish (up to ``grace`` seconds), then close.  A
        follower's connection is closed at once: its requests are long polls that only
        move data, and the follower fetches from the next leader."""
        if self.tasks and not self.replica:
            await asyncio.wait(list(self.tasks), timeout=grace)
        self._close(linger=0)
