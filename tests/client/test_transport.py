"""Connection against a tiny in-process frame server (no broker code)."""

import asyncio

import pytest

from sluice import errors
from sluice.client.addresses import DEFAULT_PORT, parse_bootstrap
from sluice.client.cluster import Cluster
from sluice.client.transport import Connection
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
            if self.mode == "connerror":  # the broker says why it hangs up, then does
                header = messages.encode(messages.Response(error=3, message="go away"))
                self.t.writelines(frames.encode_frame(
                    frames.RESPONSE, frames.CONNECTION_ERROR_API, 0, 0, header))
                self.t.close()
                return
            if self.mode == "error":
                resp = messages.MetadataResponse(error=2, message="nope")
            else:
                resp = messages.MetadataResponse(controller_id=7)
            frame = b"".join(bytes(b) for b in frames.encode_frame(
                frames.RESPONSE, ev.api, ev.version, ev.correlation, messages.encode(resp), [b"xy"]))
            if self.mode == "garbage_after":  # a good answer, then bytes that break framing
                frame += b"\x00\x00\x00\x01"
            self.t.write(frame)


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


@pytest.mark.parametrize(
    "spelled, addr",
    [("127.0.0.1", ("127.0.0.1", 7400)), ("[::1]", ("::1", 7400)), ("::1", ("::1", 7400)),
     ("h:65535", ("h", 65535))],
)
def test_parse_bootstrap_default_port_is_sluices(spelled, addr):
    assert DEFAULT_PORT == 7400
    assert parse_bootstrap(spelled) == [addr]


@pytest.mark.parametrize(
    "bad",
    ["h:0", "h:65536", "127.0.0.1:99999", "h:x", "h:-1", "[::1]x", "h:\u0661", "http://h:1", "h:1/x", "u@h:1",
     "a:b:c", "h:1:2"],
)
def test_parse_bootstrap_refuses_bad_ports(bad):
    with pytest.raises(errors.ConfigError, match="bad bootstrap address"):
        parse_bootstrap(bad)


async def test_connect_refused_is_broker_unreachable():
    with pytest.raises(errors.BrokerUnreachable, match="127.0.0.1:1: Connection refused"):
        await Connection.open("127.0.0.1", 1, connect_timeout=2)


async def test_silent_peer_is_a_handshake_timeout_not_a_connect_timeout():
    """A server that accepts and never answers (an HTTP server waiting for a request line)
    fails after the handshake timeout, and says it connected."""
    accepted = []
    srv = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(errors.HandshakeTimeout) as ei:
            await Connection.open("127.0.0.1", port, connect_timeout=30, handshake_timeout=0.2)
        assert asyncio.get_running_loop().time() - t0 < 10
        assert f"connected to 127.0.0.1:{port}" in str(ei.value)
        assert "is it a Sluice broker?" in str(ei.value)
    finally:
        for w in accepted:
            w.close()
        srv.close()


async def test_wrong_peer_says_it_is_not_a_sluice_broker(server):
    EchoServer.mode = "badmagic"
    with pytest.raises(errors.ProtocolError, match=f"127.0.0.1:{server} is not a Sluice broker"):
        await Connection.open("127.0.0.1", server, connect_timeout=2)


async def test_unreachable_bootstrap_raises_the_connect_error_itself():
    cluster = Cluster("127.0.0.1:1", connect_timeout=2)
    try:
        with pytest.raises(errors.BrokerUnreachable, match="127.0.0.1:1"):
            await cluster.refresh()
    finally:
        await cluster.close()


# ---------------------------------------------------------------- review regressions


async def test_broker_error_on_close_keeps_its_class(server):
    """A broker's non-retriable reason for closing reaches pending requests as is."""
    conn = await Connection.open("127.0.0.1", server)
    EchoServer.mode = "connerror"
    with pytest.raises(errors.UnsupportedVersion, match="go away") as ei:
        await conn.request(messages.MetadataRequest(), timeout=2)
    assert not ei.value.retriable


async def test_frames_before_a_protocol_error_are_delivered(server):
    """Responses decoded before the bad bytes (``ProtocolError.events``) are answered."""
    conn = await Connection.open("127.0.0.1", server)
    EchoServer.mode = "garbage_after"
    resp, _ = await conn.request(messages.MetadataRequest(), timeout=2)
    assert resp.controller_id == 7
    await asyncio.wait_for(conn.wait_closed(), 2)
    assert conn.closed


async def test_cancelled_caller_does_not_fail_a_shared_connect():
    opened = []

    async def slow_factory(host, port):
        await asyncio.sleep(0.1)
        opened.append((host, port))
        return object.__new__(Connection)  # stands in: only identity matters here

    cluster = Cluster("h:1", connection_factory=slow_factory)
    a = asyncio.ensure_future(cluster._connect(("h", 1)))
    b = asyncio.ensure_future(cluster._connect(("h", 1)))
    await asyncio.sleep(0.02)
    a.cancel()
    conn = await asyncio.wait_for(b, 2)
    assert opened == [("h", 1)] and cluster._conns[("h", 1)] is conn
    assert a.cancelled()


async def test_close_during_connect_gives_client_closed():
    async def hanging_factory(host, port):
        await asyncio.sleep(60)

    cluster = Cluster("h:1", connection_factory=hanging_factory)
    waiter = asyncio.ensure_future(cluster._connect(("h", 1)))
    await asyncio.sleep(0.02)
    await cluster.close()
    with pytest.raises(errors.ClientClosed):
        await asyncio.wait_for(waiter, 2)


async def test_out_of_range_number_is_a_config_error_and_leaves_nothing_pending(server):
    """An offset past 2**64 cannot be encoded: ConfigError at once, no orphan future."""
    conn = await Connection.open("127.0.0.1", server)
    req = messages.FetchRequest(partitions=[messages.FetchPartition(topic="t", partition=0, offset=2**65)])
    with pytest.raises(errors.ConfigError, match="out of range"):
        await conn.request(req)
    assert conn.in_flight == 0
    conn.close()


class SilentServer(EchoServer):
    """Handshakes, then never answers a request: a stalled broker."""

    mode = "silent"


async def test_a_broker_that_timed_out_is_asked_last(server):
    """The controller stalls (accepts, never answers): after its request times out, the
    next metadata request goes to another broker instead of the stalled one again."""
    loop = asyncio.get_running_loop()
    silent = await loop.create_server(SilentServer, "127.0.0.1", 0)
    try:
        stalled = ("127.0.0.1", silent.sockets[0].getsockname()[1])
        cluster = Cluster([f"127.0.0.1:{server}"], request_timeout=0.2)
        cluster.brokers = {7: stalled, 8: ("127.0.0.1", server)}
        cluster.controller_id = 7
        with pytest.raises(errors.RequestTimedOut):
            await cluster.request(messages.MetadataRequest())
        for _ in range(3):  # every later request is answered, and the stalled one stays last
            resp, _ = await cluster.request(messages.MetadataRequest())
            assert resp.controller_id == 7
        await cluster.close()
    finally:
        silent.close()
