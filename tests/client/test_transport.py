"""Connection against a tiny in-process frame server (no broker code)."""

import asyncio

import pytest

from sluice import errors
from sluice.client.transport import Connection, parse_bootstrap
from sluice.protocol import frames, messages


class EchoServer(asyncio.Protocol):
    """Handshakes, then answers MetadataRequest; ``mode`` picks misbehaviours."""

    mode = "ok"

    def connection_made(self, transport):
        self.t = transport
        self.reader = frames.FrameReader(handshake=True)

    def data_received(self, data):
        for ev in self.reader.feed(data):
            if isinstance(ev, frames.Handshake):
                if self.mode == "badmagic":
                    self.t.write(b"HTTP/1.1")
                else:
                    code = 3 if self.mode == "refuse" else 0
                    self.t.write(frames.encode_server_handshake(1, code))
                continue
            if self.mode == "silent":
                continue
            if self.mode == "error":
                resp = messages.MetadataResponse(error=2, message="nope")
            else:
                resp = messages.MetadataResponse(controller_id=7)
            self.t.writelines(frames.encode_frame(
                frames.RESPONSE, ev.api, ev.version, ev.correlation, messages.encode(resp), [b"xy"]))


@pytest.fixture
async def server():
    srv = await asyncio.get_running_loop().create_server(EchoServer, "127.0.0.1", 0)
    yield srv.sockets[0].getsockname()[1]
    EchoServer.mode = "ok"
    srv.close()


async def test_request_response(server):
    conn = await Connection.open("127.0.0.1", server)
    resps = await asyncio.gather(*(conn.request(messages.MetadataRequest()) for _ in range(50)))
    assert all(r.controller_id == 7 and bytes(a) == b"xy" for r, a in resps)
    conn.close()
    await conn.wait_closed()
    with pytest.raises(errors.ConnectionClosed):
        await conn.request(messages.MetadataRequest())


@pytest.mark.parametrize("mode, exc", [("refuse", errors.UnsupportedVersion),
                                       ("badmagic", errors.ProtocolError)])
async def test_handshake_failures(server, mode, exc):
    EchoServer.mode = mode
    with pytest.raises(exc):
        await Connection.open("127.0.0.1", server, connect_timeout=2)


async def test_error_and_timeout(server):
    EchoServer.mode = "error"
    conn = await Connection.open("127.0.0.1", server)
    with pytest.raises(errors.InvalidRequest, match="nope"):
        await conn.request(messages.MetadataRequest())
    EchoServer.mode = "silent"
    with pytest.raises(errors.RequestTimedOut):
        await conn.request(messages.MetadataRequest(), timeout=0.05)
    pending = asyncio.ensure_future(conn.request(messages.MetadataRequest()))
    await asyncio.sleep(0.01)
    conn.close()
    with pytest.raises(errors.ConnectionClosed):
        await pending


async def test_connect_refused():
    with pytest.raises(errors.ConnectionClosed):
        await Connection.open("127.0.0.1", 1, connect_timeout=2)


def test_parse_bootstrap():
    assert parse_bootstrap("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap(["[::1]:9"]) == [("::1", 9)]
    with pytest.raises(errors.ConfigError):
        parse_bootstrap("")
