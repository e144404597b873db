"""Frames and handshake: byte tables, chunked round trips, caps, fuzz."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import FrameTooLarge, ProtocolError
from sluice.protocol import frames
from sluice.protocol.frames import (
    Frame,
    FrameReader,
    Handshake,
    encode_client_handshake,
    encode_frame,
    encode_server_handshake,
    negotiate,
)

# --------------------------------------------------------------------------- byte tables


def test_frame_byte_table():
    header = b"\x81\xa1a\x01"  # msgpack {"a": 1}
    got = b"".join(encode_frame(frames.REQUEST, 5, 1, 0x01020304, header, [b"AB", b"CDE"]))
    assert got == (
        bytes.fromhex("00000016")  # length 22 = 13 + 4 (header) + 5 (attachments)
        + bytes.fromhex("00")  # kind: request
        + bytes.fromhex("0005")  # api 5
        + bytes.fromhex("0001")  # version 1
        + bytes.fromhex("01020304")  # correlation
        + bytes.fromhex("00000004")  # header length
        + header
        + b"ABCDE"
    )


def test_frame_byte_table_empty_and_masked_correlation():
    got = b"".join(encode_frame(frames.PUSH, 0xFFFF, 0, -1, b""))
    assert got == bytes.fromhex("0000000d 02 ffff 0000 ffffffff 00000000")


def test_encode_frame_does_not_copy_attachments():
    att = bytearray(b"x" * 100)
    parts = encode_frame(frames.RESPONSE, 6, 1, 9, b"h", [att])
    assert parts[-1] is att and parts[1] == b"h" and len(parts[0]) == frames.FIXED_SIZE


def test_handshake_byte_table():
    assert frames.MAGIC == b"SLCE"
    assert encode_client_handshake() == b"SLCE" + bytes.fromhex("0001 0001")
    assert encode_client_handshake(2, 0x0102) == b"SLCE" + bytes.fromhex("0002 0102")
    assert encode_server_handshake(1) == b"SLCE" + bytes.fromhex("0001 0000")
    assert encode_server_handshake(0, 3) == b"SLCE" + bytes.fromhex("0000 0003")
    assert len(encode_client_handshake()) == frames.HANDSHAKE_SIZE == 8


def test_reader_parses_byte_table():
    data = b"SLCE\x00\x01\x00\x02" + bytes.fromhex("00000012 01 0006 0001 00000007 00000002")
    data += b"hdABC"
    events = FrameReader().feed(data)
    assert events[0] == Handshake(1, 2)
    f = events[1]
    assert (f.kind, f.api, f.version, f.correlation) == (frames.RESPONSE, 6, 1, 7)
    assert (bytes(f.header), bytes(f.attachments)) == (b"hd", b"ABC")


# --------------------------------------------------------------------------- round trips

U16 = st.integers(0, 0xFFFF)
frame_st = st.tuples(
    st.sampled_from([frames.REQUEST, frames.RESPONSE, frames.PUSH]),
    U16,
    U16,
    st.integers(0, 0xFFFFFFFF),
    st.binary(max_size=64),
    st.lists(st.binary(max_size=64), max_size=3),
)


def feed_chunks(reader: FrameReader, data: bytes, cuts: list[int]) -> list:
    events = []
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        events += reader.feed(data[a:b])
    return events


def as_tuple(f: Frame):
    return (f.kind, f.api, f.version, f.correlation, bytes(f.header), bytes(f.attachments))


@settings(max_examples=200)
@given(
    frame_list=st.lists(frame_st, max_size=6),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    handshake=st.none() | st.tuples(U16, U16),
    mv=st.booleans(),
)
def test_chunked_round_trip(frame_list, cuts, handshake, mv):
    data = b"".join(
        b"".join(encode_frame(k, a, v, c, h, atts)) for k, a, v, c, h, atts in frame_list
    )
    if handshake is not None:
        data = encode_client_handshake(*handshake) + data
    reader = FrameReader(handshake=handshake is not None)
    if mv:
        data = memoryview(bytearray(data))  # transports may hand over any buffer
    events = feed_chunks(reader, data, cuts)
    if handshake is not None:
        assert events[0] == Handshake(*handshake)
        events = events[1:]
    # Compared only after every feed: earlier frames must survive later feeds.
    assert [as_tuple(f) for f in events] == [
        (k, a, v, c, h, b"".join(atts)) for k, a, v, c, h, atts in frame_list
    ]
    assert reader.buffered == 0


@given(frame_list=st.lists(frame_st, min_size=1, max_size=4))
def test_byte_at_a_time(frame_list):
    data = b"".join(b"".join(encode_frame(*f)) for f in frame_list)
    reader = FrameReader(handshake=False)
    events = []
    for i in range(len(data)):
        events += reader.feed(data[i : i + 1])
        assert (
            reader.buffered + sum(4 + 13 + len(f.header) + len(f.attachments) for f in events)
            == i + 1
        )
    assert len(events) == len(frame_list)


def test_server_handshake_event_then_frames():
    reader = FrameReader()
    assert reader.feed(encode_server_handshake(1, 0)[:5]) == []
    assert reader.buffered == 5
    assert reader.feed(encode_server_handshake(1, 0)[5:]) == [Handshake(1, 0)]
    assert reader.buffered == 0
    data = b"".join(encode_frame(frames.RESPONSE, 0, 1, 1, b"x"))
    assert [as_tuple(f) for f in reader.feed(data)] == [(1, 0, 1, 1, b"x", b"")]


def test_partial_frame_stays_buffered():
    data = b"".join(encode_frame(frames.REQUEST, 1, 1, 1, b"abc", [b"def"]))
    reader = FrameReader(handshake=False)
    assert reader.feed(data[:-1]) == []
    assert reader.buffered == len(data) - 1
    assert len(reader.feed(data[-1:])) == 1
    assert reader.buffered == 0


# --------------------------------------------------------------------------- caps


def test_oversized_prefix_fails_before_the_body():
    cap = 1 << 20
    reader = FrameReader(max_frame_bytes=cap, handshake=False)
    tracemalloc.start()
    try:
        assert reader.feed(b"\xff\xff\xff") == []
        assert reader.buffered == 3
        with pytest.raises(FrameTooLarge, match=str(2**32 - 1)):
            reader.feed(b"\xff")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.buffered <= 4
    assert peak < cap  # nothing near the declared (or even the capped) size was allocated


def test_oversized_prefix_after_handshake_in_one_feed():
    reader = FrameReader(max_frame_bytes=1 << 20)
    with pytest.raises(FrameTooLarge):
        reader.feed(encode_client_handshake() + struct.pack(">I", (1 << 20) + 1))
    assert reader.buffered <= 12


@pytest.mark.parametrize("cap", [13, 64, 1000])
def test_cap_is_inclusive(cap):
    ok = b"".join(encode_frame(frames.REQUEST, 1, 1, 1, b"", [b"z" * (cap - 13)]))
    assert len(FrameReader(max_frame_bytes=cap, handshake=False).feed(ok)) == 1
    too_big = b"".join(encode_frame(frames.REQUEST, 1, 1, 1, b"", [b"z" * (cap - 12)]))
    with pytest.raises(FrameTooLarge):
        FrameReader(max_frame_bytes=cap, handshake=False).feed(too_big[:4])


@pytest.mark.parametrize("length", [0, 1, 12])
def test_length_below_minimum(length):
    reader = FrameReader(handshake=False)
    with pytest.raises(ProtocolError, match="minimum") as info:
        reader.feed(struct.pack(">I", length))
    assert not isinstance(info.value, FrameTooLarge)


def test_minimum_frame():
    (f,) = FrameReader(handshake=False).feed(
        bytes.fromhex("0000000d 00 0001 0001 00000001 00000000")
    )
    assert (bytes(f.header), bytes(f.attachments)) == (b"", b"")


@pytest.mark.parametrize(
    "data", [b"X", b"SX", b"SLX", b"SLCX", b"GET ", b"SLCe\x00\x01\x00\x01", b"\x00\x00\x00\x0d"]
)
def test_bad_handshake_magic(data):
    reader = FrameReader()
    with pytest.raises(ProtocolError, match="magic"):
        reader.feed(data)


def test_bad_handshake_magic_byte_by_byte():
    reader = FrameReader()
    assert reader.feed(b"S") == []
    assert reader.feed(b"L") == []
    with pytest.raises(ProtocolError, match="magic"):
        reader.feed(b"x")


@pytest.mark.parametrize(
    ("header_length", "attachments"), [(1, b""), (5, b"abcd"), (2**32 - 1, b"")]
)
def test_header_length_past_the_frame(header_length, attachments):
    body = struct.pack(">BHHII", 0, 1, 1, 1, header_length) + attachments
    with pytest.raises(ProtocolError, match="header length"):
        FrameReader(handshake=False).feed(struct.pack(">I", len(body)) + body)


@pytest.mark.parametrize("kind", [3, 4, 127, 255])
def test_unknown_kind(kind):
    data = bytearray(b"".join(encode_frame(frames.REQUEST, 1, 1, 1, b"")))
    data[4] = kind
    with pytest.raises(ProtocolError, match="kind"):
        FrameReader(handshake=False).feed(bytes(data))


@pytest.mark.parametrize(
    ("handshake", "bad"),
    [(True, b"NOPE"), (False, struct.pack(">I", 5)), (False, struct.pack(">I", 2**31))],
)
def test_reader_is_dead_after_an_error(handshake, bad):
    reader = FrameReader(handshake=handshake)
    with pytest.raises(ProtocolError):
        reader.feed(bad)
    good = b"".join(encode_frame(frames.REQUEST, 1, 1, 1, b""))
    for data in (b"", good, encode_client_handshake() + good):
        with pytest.raises(ProtocolError, match="already failed"):
            reader.feed(data)


def test_error_after_good_frames():
    good = b"".join(encode_frame(frames.REQUEST, 1, 1, 1, b""))
    reader = FrameReader(handshake=False)
    assert len(reader.feed(good)) == 1
    with pytest.raises(ProtocolError):
        reader.feed(struct.pack(">I", 3))


# --------------------------------------------------------------------------- fuzz


def feed_all(reader: FrameReader, chunks: list[bytes]) -> None:
    failed = False
    for chunk in chunks:
        try:
            events = reader.feed(chunk)
        except ProtocolError:
            failed = True
            continue
        assert not failed, "a failed reader accepted more bytes"
        for e in events:
            assert isinstance(e, Handshake | Frame)
            if isinstance(e, Frame):
                assert e.kind in (frames.REQUEST, frames.RESPONSE, frames.PUSH)
                assert 13 + len(e.header) + len(e.attachments) <= reader.max_frame_bytes


@settings(max_examples=300)
@given(
    chunks=st.lists(st.binary(max_size=64), max_size=6),
    handshake=st.booleans(),
    cap=st.sampled_from([13, 50, frames.DEFAULT_MAX_FRAME_BYTES]),
)
def test_fuzz_raw_bytes(chunks, handshake, cap):
    feed_all(FrameReader(max_frame_bytes=cap, handshake=handshake), chunks)


@settings(max_examples=300)
@given(
    prefix_length=st.integers(0, 80),
    kind=st.integers(0, 255),
    header_length=st.integers(0, 100) | st.integers(0, 2**32 - 1),
    rest=st.binary(max_size=80),
    cuts=st.lists(st.integers(0, 200), max_size=4),
)
def test_fuzz_plausible_frames(prefix_length, kind, header_length, rest, cuts):
    """Frames with a plausible fixed part, so the fuzz reaches _parse."""
    data = (
        encode_client_handshake()
        + struct.pack(">IBHHII", prefix_length, kind, 1, 1, 1, header_length)
        + rest
    )
    bounds = [0, *sorted(cuts), len(data)]
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    feed_all(FrameReader(max_frame_bytes=64), chunks)


# --------------------------------------------------------------------------- negotiate


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (1, 1, 1),
        (0, 1, 1),
        (1, 5, 1),
        (0, 0xFFFF, 1),
        (0, 0, None),
        (2, 5, None),
        (2, 1, None),
    ],
)
def test_negotiate_table(lo, hi, expected):
    assert (frames.MIN_PROTOCOL_VERSION, frames.PROTOCOL_VERSION) == (1, 1)
    assert negotiate(lo, hi) == expected


@given(U16, U16)
def test_negotiate_picks_the_highest_common_version(lo, hi):
    ours = range(frames.MIN_PROTOCOL_VERSION, frames.PROTOCOL_VERSION + 1)
    common = [v for v in ours if lo <= v <= hi]
    assert negotiate(lo, hi) == (max(common) if common else None)
