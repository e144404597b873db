"""Garbage on the wire against a real broker: a clear error, a closed connection, no crash."""

from __future__ import annotations

import socket
import struct

import psutil
import pytest

from sluice.protocol import frames
from sluice.protocol import messages as m

CAP = 64 * 1024 * 1024


def _connect(broker, handshake: bool = True) -> tuple[socket.socket, frames.FrameReader]:
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    reader = frames.FrameReader(handshake=True)
    if handshake:
        s.sendall(frames.encode_client_handshake())
    return s, reader


def _read_all(s: socket.socket) -> bytes:
    """Everything the broker sends until it closes the connection (fails on a hang)."""
    chunks = []
    while True:
        data = s.recv(65536)  # raises socket.timeout if the broker hangs
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _events(data: bytes):
    return frames.FrameReader(handshake=True).feed(data)


def _error_of(event) -> m.Response:
    return m.decode(event.header, m.Response)


def _still_serves(broker) -> None:
    s, reader = _connect(broker)
    with s:
        s.sendall(
            b"".join(
                frames.encode_frame(
                    frames.REQUEST, m.Api.METADATA, 1, 7, m.encode(m.MetadataRequest())
                )
            )
        )
        events = []
        while len(events) < 2:
            events += reader.feed(s.recv(65536))
        assert events[1].correlation == 7
        assert _error_of(events[1]).error == 0


def test_bad_handshake_magic(broker):
    s, _ = _connect(broker, handshake=False)
    with s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        hs = _events(_read_all(s))
    assert hs[0].second == 2  # INVALID_REQUEST in the handshake verdict
    _still_serves(broker)


def test_unsupported_protocol_version(broker):
    s, _ = _connect(broker, handshake=False)
    with s:
        s.sendall(frames.encode_client_handshake(50, 60))
        hs = _events(_read_all(s))
    assert hs[0].second == 3  # UNSUPPORTED_VERSION
    _still_serves(broker)


def test_oversized_length_prefix_is_refused_without_allocating(broker):
    rss_before = psutil.Process(broker.proc.pid).memory_info().rss
    s, _ = _connect(broker)
    with s:
        s.sendall(struct.pack(">I", 0xFFFFFFF0) + b"x" * 100)
        events = _events(_read_all(s))
    err = _error_of(events[-1])
    assert events[-1].api == 0xFFFF and err.error == 2
    assert "exceeds" in err.message
    rss_after = psutil.Process(broker.proc.pid).memory_info().rss
    assert rss_after - rss_before < 32 * 1024 * 1024
    _still_serves(broker)


def test_declared_but_unsent_frame_does_not_allocate(broker):
    """Declaring a frame just under the cap and sending nothing allocates nothing."""
    rss_before = psutil.Process(broker.proc.pid).memory_info().rss
    socks = []
    try:
        for _ in range(20):
            s, _ = _connect(broker)
            s.sendall(struct.pack(">I", CAP - 1) + b"\x00" * 16)
            socks.append(s)
        _still_serves(broker)
        rss_after = psutil.Process(broker.proc.pid).memory_info().rss
        assert rss_after - rss_before < 64 * 1024 * 1024  # 20 x 64 MiB would be 1.3 GiB
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize(
    "api,version,expected",
    [(999, 1, 3), (m.Api.PRODUCE, 77, 3), (m.Api.METADATA, 0, 3)],
)
def test_unknown_api_or_version(broker, api, version, expected):
    s, _ = _connect(broker)
    with s:
        s.sendall(
            b"".join(
                frames.encode_frame(frames.REQUEST, api, version, 42, m.encode(m.MetadataRequest()))
            )
        )
        events = _events(_read_all(s))
    frame = events[-1]
    assert frame.correlation == 42
    err = _error_of(frame)
    assert err.error == expected and err.message
    _still_serves(broker)


def test_undecodable_header(broker):
    s, _ = _connect(broker)
    with s:
        s.sendall(
            b"".join(frames.encode_frame(frames.REQUEST, m.Api.PRODUCE, 1, 5, b"\xc1garbage"))
        )
        events = _events(_read_all(s))
    assert events[-1].correlation == 5 and _error_of(events[-1]).error == 2
    _still_serves(broker)


def test_truncated_frame_then_close(broker):
    s, _ = _connect(broker)
    frame = b"".join(
        frames.encode_frame(frames.REQUEST, m.Api.METADATA, 1, 1, m.encode(m.MetadataRequest()))
    )
    s.sendall(frame[:-3])
    s.close()
    _still_serves(broker)


def test_random_garbage_never_crashes(broker):
    import random

    rng = random.Random(1234)
    for _ in range(30):
        s, _ = _connect(broker, handshake=rng.random() < 0.7)
        with s:
            try:
                s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 3000))))
                s.shutdown(socket.SHUT_WR)
                _read_all(s)
            except (ConnectionResetError, BrokenPipeError):
                pass
    assert broker.alive
    _still_serves(broker)


def test_produce_with_corrupt_batch_is_rejected(broker):
    """A batch whose CRC does not match is refused with INVALID_RECORD; the log stays clean."""
    from sluice.protocol import records as r

    s, reader = _connect(broker)
    correlations = iter(range(1, 100))
    with s:

        def call(req, att=()):
            api, ver = m.api_of(req)
            corr = next(correlations)
            s.sendall(b"".join(frames.encode_frame(frames.REQUEST, api, ver, corr, m.encode(req), att)))
            while True:
                for e in reader.feed(s.recv(65536)):
                    if isinstance(e, frames.Frame):
                        return m.decode(e.header, m.types_for(api, ver)[1])

        call(m.CreateTopicsRequest(topics=[m.NewTopic(name="crc", partitions=1)]))
        batch = bytearray(r.build_batch(r.encode_keyless_records([b"hello"]), 1, 1, 1))
        batch[-1] ^= 0xFF
        resp = call(
            m.ProduceRequest(
                partitions=[m.ProducePartition(topic="crc", partition=0, size=len(batch))]
            ),
            [bytes(batch)],
        )
        assert resp.partitions[0].error == 21 and "CRC" in resp.partitions[0].message
        resp = call(
            m.ProduceRequest(partitions=[m.ProducePartition(topic="crc", partition=0, size=10**6)]),
            [bytes(batch)],
        )
        assert resp.error == 2  # sizes do not match the attachments


def test_connection_limit_answers_too_many_connections(broker_factory):
    broker = broker_factory(extra_args=["--max-connections", "2"]).start()
    held = [_connect(broker)[0] for _ in range(2)]
    try:
        for s in held:
            assert _events(s.recv(64))[0].second == 0  # both admitted
        s, _ = _connect(broker)
        with s:
            verdict = _events(_read_all(s))[0]
        assert verdict.second == 16  # TOO_MANY_CONNECTIONS, then closed
    finally:
        for s in held:
            s.close()
    _still_serves(broker)  # a freed slot is usable again
