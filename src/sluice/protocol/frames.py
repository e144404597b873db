"""Handshake and length-prefixed frames: bytes in, events out (sans-I/O).

Never imports asyncio or socket: the server connection and the client transport feed bytes
in and write the bytes this module returns, which is what makes the codec fuzzable.

Handshake (first bytes on a connection, 8 bytes each way)::

    client -> server   b"SLCE" | min_version u16 | max_version u16
    server -> client   b"SLCE" | version u16     | error_code u16   (0 = accepted)

Frame (all integers big-endian)::

    offset size field
    0      4    length        u32, bytes after this field; 13 <= length <= max_frame_bytes
    4      1    kind          0 request, 1 response, 2 server push
    5      2    api           u16 API key (see messages.Api)
    7      2    version       u16 API version
    9      4    correlation   u32 chosen by the requester, echoed in the response
    13     4    header_length u32, size of the msgpack header that follows
    17     ..   header        msgpack, decoded by messages.py into the API's struct
    ..     ..   attachments   raw bytes (record batches); their sizes are listed in the header

The length prefix is checked against the cap before a byte of the frame is buffered, and
frames are buffered only as their bytes arrive, so a peer cannot make us allocate what it
merely declares.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sluice.errors import FrameTooLarge, ProtocolError

MAGIC = b"SLCE"
PROTOCOL_VERSION = 1
MIN_PROTOCOL_VERSION = 1
HANDSHAKE_SIZE = 8
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

REQUEST, RESPONSE, PUSH = 0, 1, 2
# A response with this API key and correlation 0 reports an error of the whole connection
# (a broken frame); the broker closes the connection after it.  Requesters never use
# correlation 0.
CONNECTION_ERROR_API = 0xFFFF
_KINDS = (REQUEST, RESPONSE, PUSH)

_PREFIX = struct.Struct(">I")
_FIXED = struct.Struct(">IBHHII")  # length, kind, api, version, correlation, header_length
FIXED_SIZE = _FIXED.size  # 17
_MIN_LENGTH = FIXED_SIZE - 4
_HANDSHAKE = struct.Struct(">4sHH")


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame. ``header`` and ``attachments`` are views into one buffer."""

    kind: int
    api: int
    version: int
    correlation: int
    header: memoryview
    attachments: memoryview


@dataclass(frozen=True, slots=True)
class Handshake:
    """The peer's handshake: a version range (from a client) or a verdict (from a server)."""

    first: int  # client: min version; server: chosen version
    second: int  # client: max version; server: error code


def encode_client_handshake(
    min_version: int = MIN_PROTOCOL_VERSION, max_version: int = PROTOCOL_VERSION
) -> bytes:
    return _HANDSHAKE.pack(MAGIC, min_version, max_version)


def encode_server_handshake(version: int, error_code: int = 0) -> bytes:
    return _HANDSHAKE.pack(MAGIC, version, error_code)


def negotiate(min_version: int, max_version: int) -> int | None:
    """The highest protocol version both sides speak, or None."""
    top = min(max_version, PROTOCOL_VERSION)
    return top if top >= max(min_version, MIN_PROTOCOL_VERSION) else None


def encode_frame(
    kind: int, api: int, version: int, correlation: int, header: bytes, attachments=()
) -> list:
    """The buffers of one frame, for ``transport.writelines`` (attachments are not copied)."""
    size = FIXED_SIZE - 4 + len(header) + sum(len(a) for a in attachments)
    return [
        _FIXED.pack(size, kind, api, version, correlation & 0xFFFFFFFF, len(header)),
        header,
        *attachments,
    ]


class FrameReader:
    """Incremental decoder for one direction of a connection.

    ``feed(data)`` returns the events completed by ``data``: first a ``Handshake`` (when
    ``handshake=True``), then ``Frame`` objects.  Raises ``FrameTooLarge`` or
    ``ProtocolError`` on bytes that break the protocol; the exception's ``events`` holds
    what ``data`` completed before the bad bytes.  The reader is then unusable and the
    connection must be closed.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, handshake: bool = True):
        self.max_frame_bytes = max_frame_bytes
        self._need_handshake = handshake
        self._buf = bytearray()
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as events."""
        return len(self._buf)

    def feed(self, data) -> list:
        if self._broken:
            raise ProtocolError("reader already failed")
        buf = self._buf
        buf += data
        events: list = []
        pos = 0
        try:
            if self._need_handshake:
                if len(buf) < HANDSHAKE_SIZE:
                    if not MAGIC.startswith(bytes(buf[:4])):
                        raise ProtocolError("bad handshake magic: not a Sluice peer")
                    return events
                magic, first, second = _HANDSHAKE.unpack_from(buf, 0)
                if magic != MAGIC:
                    raise ProtocolError("bad handshake magic: not a Sluice peer")
                events.append(Handshake(first, second))
                self._need_handshake = False
                pos = HANDSHAKE_SIZE
            end = len(buf)
            while end - pos >= 4:
                length = _PREFIX.unpack_from(buf, pos)[0]
                if length > self.max_frame_bytes:
                    raise FrameTooLarge(
                        f"frame of {length} bytes exceeds the {self.max_frame_bytes}-byte cap"
                    )
                if length < _MIN_LENGTH:
                    raise ProtocolError(f"frame length {length} is below the {_MIN_LENGTH}-byte minimum")
                if end - pos < 4 + length:
                    break
                if pos == 0 and end == 4 + length:
                    # The buffer holds exactly this frame: hand it over instead of copying.
                    self._buf = bytearray()
                    events.append(_parse(buf, length))
                    return events
                events.append(_parse(buf[pos : pos + 4 + length], length))
                pos += 4 + length
        except ProtocolError as exc:
            self._broken = True
            exc.events = events  # what was decoded before the error, for the caller to act on
            raise
        if pos:
            del self._buf[:pos]
        return events


def _parse(payload: bytearray, length: int) -> Frame:
    _, kind, api, version, correlation, header_length = _FIXED.unpack_from(payload, 0)
    if kind not in _KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if header_length > length - (_MIN_LENGTH):
        raise ProtocolError(f"header length {header_length} runs past the frame")
    mv = memoryview(payload)
    split = FIXED_SIZE + header_length
    return Frame(kind, api, version, correlation, mv[FIXED_SIZE:split], mv[split:])
