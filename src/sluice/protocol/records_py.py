"""The pure-Python record codec: varints, and the records inside a batch body.

The reference that the compiled codec (``sluice._crecords``) is tested against, byte for
byte, and what runs where that is not built.  ``records`` calls one or the other; the
record layout is described there.  Pure functions over bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sluice.errors import CorruptRecord

VARINT_TABLE_SIZE = 1 << 15


def _encode_uvarint(u: int) -> bytes:
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def encode_varint(n: int) -> bytes:
    """Zig-zag varint of a signed 64-bit integer."""
    if 0 <= n < VARINT_TABLE_SIZE:
        return VARINTS[n]
    return _encode_uvarint((n << 1) ^ (n >> 63))


# VARINTS[n] is the zig-zag varint of the non-negative n < VARINT_TABLE_SIZE: lookups replace
# arithmetic per record (the producer's per-record path encodes with them too).
VARINTS: list[bytes] = [_encode_uvarint(n << 1) for n in range(VARINT_TABLE_SIZE)]
_NULL = b"\x01"  # zig-zag varint of -1
# Prefix shared by keyless records: attributes 0, timestamp delta 0, offset delta i, key -1.
_KEYLESS_HEAD = [b"\x00\x00" + VARINTS[i] + _NULL for i in range(VARINT_TABLE_SIZE)]


def _zz(n: int) -> bytes:
    return VARINTS[n] if 0 <= n < VARINT_TABLE_SIZE else encode_varint(n)


def decode_varint(buf, pos: int) -> tuple[int, int]:
    """Decode the zig-zag varint at ``buf[pos]``; return (value, next position)."""
    shift = result = 0
    while True:
        try:
            b = buf[pos]
        except IndexError:
            raise CorruptRecord("truncated varint") from None
        pos += 1
        if shift == 63 and b > 1:
            raise CorruptRecord("varint overflows 64 bits")
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


# --------------------------------------------------------------------------- encoding

Headers = Sequence[tuple[str, bytes | None]]


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None = None,
) -> bytes:
    """One record, length-prefixed, ready to concatenate into a batch body."""
    parts = [b"\x00", _zz(timestamp_delta), _zz(offset_delta)]
    if key is None:
        parts.append(_NULL)
    else:
        parts += (_zz(len(key)), key)
    if value is None:
        parts.append(_NULL)
    else:
        parts += (_zz(len(value)), value)
    if headers:
        parts.append(_zz(len(headers)))
        for hk, hv in headers:
            kb = hk.encode()
            parts += (_zz(len(kb)), kb)
            if hv is None:
                parts.append(_NULL)
            else:
                parts += (_zz(len(hv)), hv)
    else:
        parts.append(b"\x00")
    body = b"".join(parts)
    return _zz(len(body)) + body


def append_record(buf, limit, offset_delta, timestamp_delta, key, value, headers=None) -> int:
    """Append ``encode_record``'s bytes to the bytearray ``buf`` if it then holds at most
    ``limit`` bytes; return their size, or 0 (``buf`` unchanged) when they would not fit."""
    rec = encode_record(offset_delta, timestamp_delta, key, value, headers)
    if len(buf) + len(rec) > limit:
        return 0
    buf += rec
    return len(rec)


def encode_keyless(values: Sequence[bytes], first_delta: int = 0) -> bytes:
    """Bodies of keyless, header-less records with timestamp delta 0, concatenated: a few
    list lookups and one join per record, no per-record calls."""
    zz, head = VARINTS, _KEYLESS_HEAD
    parts: list[bytes] = []
    extend = parts.extend
    for i, v in enumerate(values, first_delta):
        vlen = len(v)
        vl = zz[vlen] if vlen < VARINT_TABLE_SIZE else encode_varint(vlen)
        h = head[i]
        body_len = len(h) + len(vl) + vlen + 1
        extend(
            (
                zz[body_len] if body_len < VARINT_TABLE_SIZE else encode_varint(body_len),
                h,
                vl,
                v,
                b"\x00",
            )
        )
    return b"".join(parts)


# --------------------------------------------------------------------------- decoding


def decode_body(
    body: bytes, h, topic, partition, min_offset, out: list, max_offset, factory, extra
) -> None:
    """Decode the records of one batch body (header ``h``, a ``records.BatchHeader``) into
    ``out``, as ``records.decode_records`` describes.

    One- and two-byte varints (the common cases) are decoded inline; longer ones call
    decode_varint.
    """
    pos, end = 0, len(body)
    base_offset, base_ts = h.base_offset, h.base_timestamp
    append_ts = h.max_timestamp if h.log_append_time else None
    dv = decode_varint
    append = out.append
    stop = math.inf if max_offset is None else max_offset
    try:
        for _ in range(h.records_count):
            b = body[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif body[pos + 1] < 0x80:  # two bytes: records up to 8 KiB
                z = (b & 0x7F) | (body[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = dv(body, pos)
            rec_end = pos + length
            if length < 0 or rec_end > end:
                raise CorruptRecord("record length runs past its batch")
            pos += 1  # attributes
            b = body[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                ts_delta, pos = dv(body, pos)
            b = body[pos]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                off_delta, pos = dv(body, pos)
            b = body[pos]
            if b == 1:
                key = None
                pos += 1
            else:
                klen, pos = dv(body, pos)
                if klen < 0:
                    raise CorruptRecord(f"bad key length {klen}")
                key = body[pos : pos + klen]
                pos += klen
            b = body[pos]
            if b == 1:
                value = None
                pos += 1
            else:
                if b < 0x80:
                    vlen = (b >> 1) ^ -(b & 1)
                    pos += 1
                elif body[pos + 1] < 0x80:
                    z = (b & 0x7F) | (body[pos + 1] << 7)
                    vlen = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    vlen, pos = dv(body, pos)
                if vlen < 0:
                    raise CorruptRecord(f"bad value length {vlen}")
                value = body[pos : pos + vlen]
                pos += vlen
            b = body[pos]
            if b == 0:
                headers = ()
                pos += 1
            else:
                headers, pos = decode_headers(body, pos)
            if pos != rec_end:
                raise CorruptRecord(
                    f"record fields take {pos - rec_end + length} of its {length} bytes"
                )
            offset = base_offset + off_delta
            if offset < min_offset or offset >= stop:
                continue
            append(
                factory(
                    topic,
                    partition,
                    offset,
                    append_ts if append_ts is not None else base_ts + ts_delta,
                    key,
                    value,
                    headers,
                    *extra,
                )
            )
    except IndexError:
        raise CorruptRecord("record runs past its batch") from None
    if pos != end:
        raise CorruptRecord(f"{end - pos} stray bytes after the last record of a batch")


def decode_headers(body: bytes, pos: int) -> tuple[tuple, int]:
    """The headers at ``body[pos:]`` and where they end.  One-byte varints (header counts,
    key lengths, values up to 63 bytes: the common cases) are decoded inline, and keys seen
    before are not decoded again (``KEYS``)."""
    b = body[pos]
    if b < 0x80:
        count = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        count, pos = decode_varint(body, pos)
    if count < 0 or count > len(body):
        raise CorruptRecord(f"bad header count {count}")
    headers = []
    append = headers.append
    keys = KEYS
    for _ in range(count):
        b = body[pos]
        if b < 0x80:
            klen = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            klen, pos = decode_varint(body, pos)
        if klen < 0:
            raise CorruptRecord("null header key")
        raw = body[pos : pos + klen]
        key = keys.get(raw)
        if key is None:
            try:
                key = raw.decode()
            except UnicodeDecodeError as exc:
                raise CorruptRecord("header key is not UTF-8") from exc
            if klen <= _MAX_KEY_BYTES and len(keys) < MAX_KEYS:
                keys[raw] = key
        pos += klen
        b = body[pos]
        if b < 0x80:
            vlen = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            vlen, pos = decode_varint(body, pos)
        if vlen < 0:
            value = None
        else:
            value = body[pos : pos + vlen]
            pos += vlen
        append((key, value))
    return tuple(headers), pos


# Header keys decoded so far (bytes -> str): applications use a few names, over and over.
KEYS: dict[bytes, str] = {}
MAX_KEYS = 4096
_MAX_KEY_BYTES = 64
