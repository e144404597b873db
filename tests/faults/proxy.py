"""A small fault-injecting TCP proxy between clients and a broker, for fault tests.

``FaultyProxy(host, port)`` listens on a loopback port (``port=``, else a free one) and relays
bytes both ways; start the broker with ``--advertise`` naming the proxy so that
clients send every request through it.  The
broker-to-client stream is parsed with the sans-I/O frame reader so faults can be aimed at
one response:

- ``lose_responses(api, n)``: the next ``n`` responses of ``api`` are not delivered; the
  client's connection is cut instead (the broker has executed the request by then);
- ``refuse = True``: new client connections are closed at once, before the handshake;
- ``cut_all()``: close every relayed connection now;
- ``partition()``: a network partition: existing connections are cut and new ones refused
  until ``heal()``.

``raw=True`` relays bytes both ways without parsing (for other protocols, such as etcd's
gRPC); ``lose_responses`` needs the parsed mode.

Runs on the test's event loop; ``close()`` stops it and every relay.
"""

from __future__ import annotations

import asyncio
import contextlib

from sluice.protocol import frames


class FaultyProxy:
    def __init__(self, upstream_host: str, upstream_port: int, port: int = 0, *, raw: bool = False) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.raw = raw
        self._port = port
        self.refuse = False
        self._lose: dict[int, int] = {}  # api -> responses still to lose
        self.lost = 0  # responses lost so far
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> FaultyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)
        return self

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def lose_responses(self, api: int, n: int = 1) -> None:
        assert not self.raw, "a raw proxy does not see responses"
        self._lose[api] = self._lose.get(api, 0) + n

    def cut_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()

    def partition(self) -> None:
        """Cut every relayed connection and refuse new ones until ``heal()``."""
        self.refuse = True
        self.cut_all()

    def heal(self) -> None:
        self.refuse = False

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut_all()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        if self.refuse:
            cwriter.transport.abort()
            return
        try:
            breader, bwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.transport.abort()
            return
        if self.refuse:  # partitioned while connecting
            for w in (cwriter, bwriter):
                w.transport.abort()
            return
        self._writers.update((cwriter, bwriter))
        up = asyncio.ensure_future(self._pipe(creader, bwriter))
        down = asyncio.ensure_future(
            self._pipe(breader, cwriter) if self.raw else self._responses(breader, cwriter)
        )
        self._tasks.update((up, down))
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in (cwriter, bwriter):
                w.transport.abort()
                self._writers.discard(w)
            for t in (up, down):
                t.cancel()
                self._tasks.discard(t)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay broker -> client frame by frame, losing the responses asked for."""
        parser = frames.FrameReader(frames.DEFAULT_MAX_FRAME_BYTES, handshake=True)
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                for ev in parser.feed(data):
                    if isinstance(ev, frames.Handshake):
                        writer.write(frames.encode_server_handshake(ev.first, ev.second))
                        continue
                    if ev.kind == frames.RESPONSE and self._lose.get(ev.api, 0) > 0:
                        self._lose[ev.api] -= 1
                        self.lost += 1
                        return  # the caller cuts both sides
                    body = (bytes(ev.attachments),) if len(ev.attachments) else ()
                    writer.writelines(
                        frames.encode_frame(
                            ev.kind, ev.api, ev.version, ev.correlation, bytes(ev.header), body
                        )
                    )
                await writer.drain()
