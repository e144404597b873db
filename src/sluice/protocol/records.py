"""Record batches in Kafka's RecordBatch v2 layout, byte for byte.

The record batch is the unit Sluice writes, replicates and serves.  The broker touches only
the batch header (check the CRC once, patch base offset / leader epoch / append time); the
records inside are built by producers and decoded by consumers.  Pure functions over bytes:
no I/O lives here.

Batch header (61 bytes, all big-endian)::

    offset size field                 notes
    0      8    base_offset           int64, set by the broker on append
    8      4    batch_length          int32, bytes after this field (total size - 12)
    12     4    partition_leader_epoch int32, set by the broker
    16     1    magic                 int8, always 2
    17     4    crc                   uint32, CRC-32C of bytes 21 .. end of batch
    21     2    attributes            int16: bits 0-2 compression (0 none, 3 lz4, 4 zstd),
                                      bit 3 timestamp type (1 = log append time),
                                      bit 4 transactional: a half message, never shown
                                      to readers (broker/transactions/),
                                      bit 5 control: broker markers (a rollback),
                                      never shown to readers,
                                      bit 6 commit: the visible copy of a half message
                                      written by the broker on commit; its first
                                      record carries the header ``sluice.txn.id``
    23     4    last_offset_delta     int32, record count - 1 for a producer's batch
    27     8    base_timestamp        int64 ms
    35     8    max_timestamp         int64 ms (the append time with log-append time)
    43     8    producer_id           int64, -1 when not idempotent
    51     2    producer_epoch        int16, -1 when not idempotent
    53     4    base_sequence         int32, -1 when not idempotent
    57     4    records_count         int32
    61     ..   records               compressed as a whole when bits 0-2 are set
                                          (protocol/compression.py)

Record (varints are zig-zag encoded, as in Kafka and protobuf ``sint``)::

    length varint | attributes int8 | timestamp_delta varlong | offset_delta varint |
    key_length varint (-1 = null) | key | value_length varint (-1 = null) | value |
    header_count varint | { header_key_length varint | key utf-8 |
                            header_value_length varint (-1 = null) | value } *
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import crc32c as _crc32c
import msgspec

from sluice import native
from sluice.errors import CorruptRecord
from sluice.protocol import records_py
from sluice.protocol.compression import (
    LZ4,
    MAX_COMPRESSED_RECORDS,
    MAX_DECOMPRESSED_BYTES,
    NO_COMPRESSION,
    ZSTD,
    compress,
    decompress,
)
from sluice.protocol.records_py import (  # noqa: F401 - varints are part of this module's API
    VARINT_TABLE_SIZE,
    VARINTS,
    Headers,
    decode_varint,
    encode_varint,
)

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base offset + batch length: the bytes batch_length does not count
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43  # producer_id, producer_epoch, base_sequence: 14 bytes from here
MAGIC = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
COMMIT_BIT = 0x40
# Batches a reader never shows: half messages and broker control markers.
HIDDEN_BITS = TRANSACTIONAL_BIT | CONTROL_BIT
# Batches only a broker writes: producers may send transactional (half) batches, not these.
BROKER_BITS = CONTROL_BIT | COMMIT_BIT

MIN_RECORD_SIZE = 7  # length, attributes, timestamp delta, offset delta, key, value, headers
# Validation is per-batch work on the event loop: bound it per request.
MAX_BATCHES_PER_PRODUCE = 32_768

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_H16 = struct.Struct(">h")
_PRODUCER = struct.Struct(">qhi")

crc32c = _crc32c.crc32c


_ABI_VERSION = 12  # the version of sluice._crecords this module calls (see _crecords.c)


def _compiled():
    """The compiled codec (``sluice._crecords``, chosen by ``sluice.native``), or None: not
    built, built from another version of its source, or turned off with
    ``SLUICE_PURE_PYTHON=1``.  The pure-Python functions here are its reference."""
    module = native.load("_crecords", _ABI_VERSION)
    if module is not None:
        module.init(CorruptRecord)
    return module


_C = _compiled()
COMPILED = _C is not None  # which codec this process runs: for `sluice bench` notes


class BatchHeader(NamedTuple):
    """The 61-byte header of one batch. ``size`` is the whole batch in bytes."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)


def parse_header(buf, pos: int = 0) -> BatchHeader:
    """Parse the batch header at ``buf[pos:]``; checks the length and magic, not the CRC.

    Raises ``CorruptRecord`` when fewer than 61 bytes are there, the magic is not 2, or
    the declared length is below the header size.
    """
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecord(f"truncated batch header: {len(buf) - pos} of {HEADER_SIZE} bytes")
    h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if h.magic != MAGIC:
        raise CorruptRecord(f"unsupported record batch magic {h.magic} (expected 2)")
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecord(f"batch length {h.batch_length} is below the header size")
    return h


def batch_crc_ok(buf, pos: int, size: int) -> bool:
    """True when the CRC-32C stored at ``pos`` covers ``buf[pos+21 : pos+size]`` correctly."""
    stored = _U32.unpack_from(buf, pos + CRC_OFFSET)[0]
    return crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size]) == stored


class BatchSpan(NamedTuple):
    """Where one validated batch sits in a buffer, and what it holds."""

    pos: int
    size: int
    count: int  # offsets it takes: last_offset_delta + 1
    max_timestamp: int
    producer_id: int = -1  # -1: not from an idempotent producer
    producer_epoch: int = -1
    base_sequence: int = -1
    attributes: int = 0


def batch_attributes(buf, pos: int = 0) -> int:
    """The attributes of the batch at ``buf[pos:]`` (its header was validated)."""
    return _H16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)[0]


def validate_batches(buf, max_batch_bytes: int, broker: bool = False) -> list[BatchSpan]:
    """Check a producer's concatenated batches; return one span per batch.

    Transactional (half message) batches are accepted; control and commit batches are
    refused unless ``broker`` (a broker's own write): only brokers write those.

    No Python work per record: header fields, one C-speed CRC over the batch, and the
    records' framing checked in C (``check_body``: what a consumer could not decode is
    never stored); a compressed batch is decompressed for that, up to
    ``MAX_DECOMPRESSED_BYTES``.  Raises ``CorruptRecord`` (bad framing, magic, CRC, counts,
    codec, records) or ``ValueError`` carrying the offending size when a batch exceeds
    ``max_batch_bytes`` (the caller maps it to ``MessageTooLarge``).  An empty buffer is
    corrupt: a produce carries at least one batch.
    """
    spans: list[BatchSpan] = []
    pos, end = 0, len(buf)
    if end == 0:
        raise CorruptRecord("no record batch in produce data")
    while pos < end:
        if len(spans) == MAX_BATCHES_PER_PRODUCE:
            raise CorruptRecord(f"more than {MAX_BATCHES_PER_PRODUCE} batches for one partition in one request")
        h = parse_header(buf, pos)
        size = h.size
        if pos + size > end:
            raise CorruptRecord(f"batch at byte {pos} declares {size} bytes, {end - pos} present")
        if size > max_batch_bytes:
            raise BatchTooLarge(size)
        if h.records_count < 1 or h.last_offset_delta != h.records_count - 1:
            raise CorruptRecord(
                f"batch at byte {pos}: {h.records_count} records but last offset delta "
                f"{h.last_offset_delta}"
            )
        # A record takes at least 7 bytes; compressed, a batch still holds at most 2**24.
        most = (size - HEADER_SIZE) // MIN_RECORD_SIZE if not h.compression else MAX_COMPRESSED_RECORDS
        if h.records_count > most:
            raise CorruptRecord(f"batch at byte {pos}: {h.records_count} records cannot fit {size} bytes")
        if h.compression not in (NO_COMPRESSION, LZ4, ZSTD):
            raise CorruptRecord(f"unsupported compression codec {h.compression}")
        if h.attributes & BROKER_BITS and not broker:
            raise CorruptRecord("control and commit batches are written by brokers only")
        if not batch_crc_ok(buf, pos, size):
            raise CorruptRecord(f"batch at byte {pos}: CRC-32C mismatch")
        body = memoryview(buf)[pos + HEADER_SIZE : pos + size]
        if h.compression:
            body = decompress(h.compression, body, MAX_DECOMPRESSED_BYTES)
        try:
            check_body(body, h.records_count)
        except CorruptRecord as exc:
            raise CorruptRecord(f"batch at byte {pos}: {exc}") from None
        spans.append(BatchSpan(
            pos, size, h.records_count, h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence,
            h.attributes,
        ))
        pos += size
    return spans


class BatchTooLarge(ValueError):
    """A batch above the topic's max message bytes; ``size`` is its size."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class ReplicaBatch(NamedTuple):
    """One batch of a leader's log as a follower receives it: offsets already assigned."""

    pos: int
    size: int
    base_offset: int
    next_offset: int
    max_timestamp: int
    leader_epoch: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attributes: int = 0


MAX_REPLICA_BATCH_BYTES = 64 * 1024 * 1024  # no leader accepts a larger batch


def validate_replica_batches(buf, max_batch_bytes: int = MAX_REPLICA_BATCH_BYTES) -> list[ReplicaBatch]:
    """Check batches copied from a leader's log; return one entry per batch.

    Per-batch work only: header, one CRC over each batch, offsets increasing from batch to
    batch (contiguous, but for the gaps a compacted leader's log has: storage/cleaner.py),
    leader epochs never decreasing.  Whether the first batch follows the follower's
    log end is for its writer to check.  A partial last batch (a fetch's size cap cut it)
    is not returned.  Raises ``CorruptRecord``; an empty buffer is valid (nothing new).
    """
    out: list[ReplicaBatch] = []
    pos, end = 0, len(buf)
    while end - pos >= HEADER_SIZE:
        h = parse_header(buf, pos)
        size = h.size
        if pos + size > end:
            break  # partial: the next fetch starts with it
        if size > max_batch_bytes:
            raise CorruptRecord(f"batch at byte {pos} of {size} bytes exceeds {max_batch_bytes}")
        if h.last_offset_delta < 0 or h.base_offset < 0 or h.leader_epoch < 0:
            raise CorruptRecord(f"batch at byte {pos}: offsets or epoch not assigned by a leader")
        if out and h.base_offset < out[-1].next_offset:
            raise CorruptRecord(f"batch at offset {h.base_offset} is below {out[-1].next_offset}, the end of the batch before")
        if out and h.leader_epoch < out[-1].leader_epoch:
            raise CorruptRecord(
                f"batch at offset {h.base_offset}: leader epoch {h.leader_epoch} after {out[-1].leader_epoch}"
            )
        if not batch_crc_ok(buf, pos, size):
            raise CorruptRecord(f"batch at offset {h.base_offset}: CRC-32C mismatch")
        pid = -1 if h.attributes & CONTROL_BIT else h.producer_id
        out.append(ReplicaBatch(
            pos, size, h.base_offset, h.next_offset, h.max_timestamp, h.leader_epoch,
            pid, h.producer_epoch, h.base_sequence, h.attributes,
        ))
        pos += size
    return out


def assign_offsets(
    buf: bytearray | memoryview,
    spans: Sequence[BatchSpan],
    base_offset: int,
    leader_epoch: int,
    append_time: int | None,
) -> int:
    """Patch offsets (and the append time) into validated batches, in place; return next offset.

    With ``append_time`` set, each batch becomes log-append-time: the timestamp-type bit is
    set, max_timestamp is the append time and the CRC is recomputed (one C call per batch).
    """
    offset = base_offset
    for span in spans:
        pos = span.pos
        _BASE_OFFSET.pack_into(buf, pos, offset)
        _I32.pack_into(buf, pos + 12, leader_epoch)
        if append_time is not None:
            attrs = _H16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)[0] | TIMESTAMP_TYPE_BIT
            _H16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attrs)
            _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, append_time)
            crc = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + span.size])
            _U32.pack_into(buf, pos + CRC_OFFSET, crc)
        offset += span.count
    return offset


# --------------------------------------------------------------------------- building


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None = None,
) -> bytes:
    """One record, length-prefixed, ready to concatenate into a batch body: one C call
    with the compiled codec, else ``records_py.encode_record``."""
    if _C is not None:
        return _C.encode_record(offset_delta, timestamp_delta, key, value, headers)
    return records_py.encode_record(offset_delta, timestamp_delta, key, value, headers)


# append_record(buf, limit, offset_delta, timestamp_delta, key, value, headers) -> int:
# append one record (``encode_record``'s bytes) to the bytearray ``buf`` if ``buf`` then
# holds at most ``limit`` bytes; return its size, or 0 when it would not fit (``buf``
# unchanged).  Raises, leaving ``buf`` unchanged, where ``encode_record`` raises.  The
# producer's per-record path, so the C function itself when compiled (no Python frame).
append_record = _C.append_record if _C is not None else records_py.append_record


def encode_keyless_records(values: Sequence[bytes], first_delta: int = 0) -> bytes:
    """Bodies of keyless, header-less records with timestamp delta 0, concatenated.

    The bulk path: one C call with the compiled codec, else ``records_py.encode_keyless``.
    """
    if first_delta + len(values) > VARINT_TABLE_SIZE:
        raise ValueError("too many records for one keyless batch")
    if _C is not None:
        return _C.encode_keyless(values, first_delta)
    return records_py.encode_keyless(values, first_delta)


def check_body(body, count: int) -> None:
    """Check that an uncompressed batch body holds exactly ``count`` well-formed records
    with offset deltas 0 .. ``count`` - 1 (``CorruptRecord`` if not): in C without building
    them when the compiled codec is there, else by decoding them with the reference."""
    if _C is not None:
        _C.check_body(body, count)
        return
    out: list[Record] = []
    h = _DELTAS._replace(records_count=count)
    records_py.decode_body(bytes(body), h, "", 0, -(1 << 63), out, None, Record, ())  # every record kept
    for n, r in enumerate(out):
        if r.offset != n:
            raise CorruptRecord(f"record {n} of a batch has offset delta {r.offset}")


def build_batch(
    records: bytes,
    count: int,
    base_timestamp: int,
    max_timestamp: int,
    codec: int = NO_COMPRESSION,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    flags: int = 0,
) -> bytes:
    """Wrap concatenated record bodies into one batch with base offset 0 and a fresh CRC.

    ``flags`` are attribute bits beside the codec (``TRANSACTIONAL_BIT``, ``CONTROL_BIT``,
    ``COMMIT_BIT``).
    """
    body = compress(codec, records) if codec else records
    tail = (
        struct.pack(
            ">hiqqqhii",
            codec | flags,
            count - 1,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + body
    )
    crc = crc32c(tail)
    return struct.pack(">qiibI", 0, len(tail) + 9, -1, MAGIC, crc) + tail


def stamp_producer(batch: bytes, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """A copy of one built batch with new producer id, epoch and base sequence, and its CRC
    recomputed (one C call): how an idempotent producer renumbers a batch it built already.
    The records, compressed or not, are untouched.  Raises ``struct.error`` for a value
    outside its field (int64, int16, int32)."""
    buf = bytearray(batch)
    _PRODUCER.pack_into(buf, PRODUCER_ID_OFFSET, producer_id, producer_epoch, base_sequence)
    _U32.pack_into(buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return bytes(buf)


# --------------------------------------------------------------------------- decoding


class Record(msgspec.Struct, frozen=True, gc=False):
    """One consumed message."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def iter_batches(buf, check_crc: bool = True) -> Iterator[tuple[BatchHeader, int]]:
    """Yield (header, position) of each whole batch in ``buf``; a partial tail is skipped.

    A fetch may end with a partial batch (a size cap cut it); that is normal and ignored.
    """
    pos, end = 0, len(buf)
    while end - pos >= HEADER_SIZE:
        h = parse_header(buf, pos)
        if pos + h.size > end:
            return
        if check_crc and not batch_crc_ok(buf, pos, h.size):
            raise CorruptRecord(f"batch at offset {h.base_offset}: CRC-32C mismatch")
        yield h, pos
        pos += h.size


def end_of_batches(buf) -> int | None:
    """``next_offset`` of the last whole batch in ``buf``; None if there is none.

    Where a reader goes on after a fetch: in a compacted log a batch may have lost its
    last records, or all of them, yet its offsets up to ``next_offset`` are still taken.
    """
    end = None
    for h, _ in iter_batches(buf, check_crc=False):
        end = h.next_offset
    return end


def decode_records(
    buf,
    topic: str,
    partition: int,
    min_offset: int = 0,
    check_crc: bool = True,
    *,
    max_offset: int | None = None,
    factory=Record,
    extra: tuple = (),
) -> list:
    """Decode every record of every whole batch in ``buf`` with offset ≥ ``min_offset``
    (and < ``max_offset`` unless None).

    Half messages (transactional batches) and control batches are skipped: no reader ever
    sees them.  Each record becomes ``factory(topic, partition, offset, timestamp, key, value,
    headers, *extra)`` — a ``Record`` unless the caller has a type of its own (at most 8
    ``extra`` arguments).
    """
    out: list = []
    mv = memoryview(buf)
    for h, pos in iter_batches(mv, check_crc):
        if h.next_offset <= min_offset or h.attributes & HIDDEN_BITS:
            continue
        if max_offset is not None and h.base_offset >= max_offset:
            break
        body = mv[pos + HEADER_SIZE : pos + h.size]
        if h.compression:
            body = decompress(h.compression, body)
        _decode_body(body, h, topic, partition, min_offset, out, max_offset, factory, extra)
    return out


def decode_batch(buf, h: BatchHeader, pos: int, topic: str = "", partition: int = 0) -> list[Record]:
    """Every record of the one batch at ``buf[pos:]`` whose header is ``h``, whatever its
    kind (half messages and control batches included): for the broker's transaction
    bookkeeping, not for readers."""
    out: list[Record] = []
    body = memoryview(buf)[pos + HEADER_SIZE : pos + h.size]
    if h.compression:
        body = decompress(h.compression, body)
    _decode_body(body, h, topic, partition, 0, out)
    return out


def decode_first(buf, h: BatchHeader, pos: int) -> Record | None:
    """The first record of the batch at ``buf[pos:]`` (any kind), without decoding the
    others; None for an empty batch.  For the broker's bookkeeping, which reads markers
    from a batch's first record."""
    if not h.records_count:
        return None
    body = memoryview(buf)[pos + HEADER_SIZE : pos + h.size]
    if h.compression:
        body = decompress(h.compression, body)
    body = body[: _first_record_end(body)]
    out: list[Record] = []
    _decode_body(body, h._replace(records_count=1), "", 0, 0, out)
    return out[0]


def split_first_record(body: bytes) -> tuple[Record, int]:
    """The first record of an uncompressed batch body, and where it ends: per-batch work
    for whoever rewrites one record and copies the others' bytes as they are.  The record's
    ``offset`` and ``timestamp`` are its offset and timestamp *deltas*.  Raises
    ``CorruptRecord`` when the body does not start with a whole, well-formed record."""
    end = _first_record_end(body)
    out: list[Record] = []
    _decode_body(body[:end], _DELTAS, "", 0, 0, out)
    return out[0], end


# A header under which _decode_body yields deltas: base offset and timestamp 0, create time.
_DELTAS = BatchHeader(0, 0, 0, MAGIC, 0, 0, 0, 0, 0, -1, -1, -1, 1)


def _first_record_end(body) -> int:
    """Where the first record of an uncompressed body ends (its length varint and bytes)."""
    try:
        length, at = decode_varint(body, 0)
    except CorruptRecord:
        return len(body)
    return min(len(body), at + max(length, 0))


def _decode_body(
    body, h: BatchHeader, topic, partition, min_offset, out: list, max_offset=None, factory=Record, extra=(),
) -> None:
    """Decode the records of one batch body into ``out``: with the compiled codec when it
    was built, else with ``records_py.decode_body``, its reference."""
    if _C is not None:
        append_ts = h.max_timestamp if h.log_append_time else None
        _C.decode_body(
            body, h.records_count, h.base_offset, h.base_timestamp, append_ts, min_offset,
            topic, partition, factory, out, max_offset, extra,
        )
    else:
        records_py.decode_body(bytes(body), h, topic, partition, min_offset, out, max_offset, factory, extra)
