"""Compaction of one record batch: keep some of its records, keep everything else.

Pure functions over the bytes of whole batches (layout in protocol/records.py); the log
cleaner (storage/cleaner.py) decides *which* records to keep and calls these to rewrite.

A rewritten batch keeps its header as it was — base offset, last offset delta (so its
``next_offset`` is unchanged even when its last record goes), leader epoch, attributes
(compression included), timestamps, producer id / epoch and base sequence.  Only the
records, ``records_count``, ``batch_length`` and the CRC change.  Each kept record keeps
its bytes, so its offset delta and timestamp delta, hence its offset and timestamp, are
unchanged: a cleaned log has gaps, never renumbered offsets.  A batch may be left with no
record at all (``records_count`` 0): readers skip it by its ``next_offset``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple

from sluice.errors import CorruptRecord
from sluice.protocol.compression import compress, decompress
from sluice.protocol.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    crc32c,
    decode_varint,
    parse_header,
)

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_RECORDS_COUNT_OFFSET = 57


class RecordSlice(NamedTuple):
    """One record of a batch body: its offset, key, whether it is a tombstone (null value),
    and where its bytes (length prefix included) sit in the body."""

    offset: int
    key: bytes | None
    tombstone: bool
    start: int
    end: int


def batch_body(batch, h: BatchHeader) -> bytes:
    """The uncompressed records of ``batch`` (whose header is ``h``)."""
    body = memoryview(batch)[HEADER_SIZE : h.size]
    return decompress(h.compression, body) if h.compression else bytes(body)


def iter_records(body: bytes, h: BatchHeader) -> Iterator[RecordSlice]:
    """Yield each record of an uncompressed batch body; ``CorruptRecord`` on bad framing.

    Only the fields compaction needs are decoded (offset, key, null value); the rest of a
    record is kept as bytes.
    """
    pos, end = 0, len(body)
    try:
        for _ in range(h.records_count):
            start = pos
            length, pos = decode_varint(body, pos)
            rec_end = pos + length
            if length < 0 or rec_end > end:
                raise CorruptRecord("record length runs past its batch")
            pos += 1  # attributes
            _, pos = decode_varint(body, pos)  # timestamp delta
            off_delta, pos = decode_varint(body, pos)
            klen, pos = decode_varint(body, pos)
            key = None
            if klen >= 0:
                key = body[pos : pos + klen]
                pos += klen
            vlen, _ = decode_varint(body, pos)
            if pos > rec_end:
                raise CorruptRecord("record fields run past the record")
            yield RecordSlice(h.base_offset + off_delta, key, vlen < 0, start, rec_end)
            pos = rec_end
    except IndexError:
        raise CorruptRecord("record runs past its batch") from None
    if pos != end:
        raise CorruptRecord(f"{end - pos} stray bytes after the last record of a batch")


def rewrite_batch(batch, keep: Callable[[RecordSlice], bool]) -> tuple[bytes, int]:
    """``batch`` with only the records ``keep`` accepts; returns (bytes, records kept).

    When every record is kept the batch's own bytes come back unchanged (no re-encoding,
    no recompression).  Otherwise the header is copied and only ``batch_length``,
    ``records_count`` and the CRC are set anew; the body is recompressed with the batch's
    codec.  The result may hold no record.  ``CorruptRecord`` when the batch is malformed.
    """
    h = parse_header(batch)
    body = batch_body(batch, h)
    records = list(iter_records(body, h))
    kept = [r for r in records if keep(r)]
    if len(kept) == len(records):
        return bytes(memoryview(batch)[: h.size]), len(kept)
    new_body = b"".join(body[r.start : r.end] for r in kept)
    if h.compression:
        new_body = compress(h.compression, new_body)
    out = bytearray(memoryview(batch)[:HEADER_SIZE])
    out += new_body
    _I32.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    _I32.pack_into(out, _RECORDS_COUNT_OFFSET, len(kept))
    _U32.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out), len(kept)
