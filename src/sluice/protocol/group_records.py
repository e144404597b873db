"""The records of ``__groups``: one committed offset per record, keyed for compaction.

A group's committed offsets are records of its ``__groups`` partition (see
protocol/coordinator.py), one per (group, topic, partition).  The log is the state: the
latest record of a key holds that partition's committed offset, and a record with a null
value (a *tombstone*) says it has none any more (the group was deleted, or the topic).
Compaction (``cleanup.policy=compact``) may drop every record of a key but its latest.
Pure functions over bytes: no I/O lives here.

Key (msgpack array)::

    [0, group: str, topic: str, partition: int]      0: the key type "committed offset"

Value (msgpack array), or null for a tombstone::

    [0, offset: int, metadata: str, time_ms: int, client: str]
       0         record version
       offset    the committed offset: the next offset the group reads
       metadata  the application's commit metadata ("" if none)
       time_ms   broker time of the commit (-1: unknown, e.g. migrated from old files)
       client    host:port of the committing connection ("" if unknown)

Readers skip keys of another type (kept for later record kinds) and take any value
version's first five fields, so a newer broker can add fields at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from sluice.errors import CorruptRecord
from sluice.protocol.records import HEADER_SIZE, Record, build_batch, encode_record

OFFSET_KEY = 0  # key type of a committed offset
VALUE_VERSION = 0

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class OffsetKey(NamedTuple):
    """Whose offset a record holds: a group's, for one partition of one topic."""

    group: str
    topic: str
    partition: int


class Committed(NamedTuple):
    """One committed offset and what the broker knows of its commit."""

    offset: int
    metadata: str = ""
    time_ms: int = -1  # broker time of the commit; -1 when unknown
    client: str = ""  # client address (host:port) of the committing connection


class OffsetRecord(NamedTuple):
    """One decoded record of ``__groups``: ``value`` None is a tombstone."""

    offset: int  # its offset in the ``__groups`` partition
    key: OffsetKey
    value: Committed | None


def encode_key(key: OffsetKey) -> bytes:
    return _encode([OFFSET_KEY, key.group, key.topic, key.partition])


def encode_value(value: Committed | None) -> bytes | None:
    """The value bytes, or None (a tombstone) for None."""
    if value is None:
        return None
    return _encode([VALUE_VERSION, value.offset, value.metadata, value.time_ms, value.client])


def decode_key(raw: bytes) -> OffsetKey | None:
    """The key of a committed-offset record; None for a key of another type.
    ``CorruptRecord`` when the bytes are not a key of this layout."""
    try:
        fields = _decode(raw)
        if not isinstance(fields, list) or not fields or not isinstance(fields[0], int):
            raise ValueError(f"not a key: {fields!r}")
        if fields[0] != OFFSET_KEY:
            return None
        _, group, topic, partition = fields[:4]
        if not (isinstance(group, str) and isinstance(topic, str) and _is_int(partition)):
            raise ValueError(f"bad key fields {fields!r}")
        return OffsetKey(group, topic, partition)
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptRecord(f"unreadable __groups key {bytes(raw)!r}: {exc}") from exc


def decode_value(raw: bytes | None) -> Committed | None:
    """The committed offset a value holds; None for a tombstone.  ``CorruptRecord`` when
    the bytes are not a value of this layout."""
    if raw is None:
        return None
    try:
        fields = _decode(raw)
        if not isinstance(fields, list) or len(fields) < 5:
            raise ValueError(f"not a value: {fields!r}")
        _, offset, metadata, time_ms, client = fields[:5]
        if not (_is_int(offset) and isinstance(metadata, str) and _is_int(time_ms) and isinstance(client, str)):
            raise ValueError(f"bad value fields {fields!r}")
        return Committed(offset, metadata, time_ms, client)
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptRecord(f"unreadable __groups value {bytes(raw)!r}: {exc}") from exc


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def build_offsets_batches(
    entries: Iterable[tuple[OffsetKey, Committed | None]], timestamp_ms: int, max_batch_bytes: int
) -> bytes:
    """Record batches (base offset 0, concatenated, for ``validate_batches`` and a
    partition's writer) holding a record per entry, in order; a None value is a tombstone.

    A new batch starts before one would pass ``max_batch_bytes``; a single record too large
    for it still gets a batch of its own (which the partition then refuses).
    ``ValueError`` when ``entries`` is empty.
    """
    batches: list[bytes] = []
    body: list[bytes] = []
    size = HEADER_SIZE
    for key, value in entries:
        rec = encode_record(len(body), 0, encode_key(key), encode_value(value))
        if body and size + len(rec) > max_batch_bytes:
            batches.append(build_batch(b"".join(body), len(body), timestamp_ms, timestamp_ms))
            body, size = [], HEADER_SIZE
            rec = encode_record(0, 0, encode_key(key), encode_value(value))
        body.append(rec)
        size += len(rec)
    if not body:
        raise ValueError("a batch of committed offsets needs at least one entry")
    batches.append(build_batch(b"".join(body), len(body), timestamp_ms, timestamp_ms))
    return b"".join(batches)


def decode_offset_record(rec: Record) -> OffsetRecord | None:
    """The committed offset (or tombstone) a record of ``__groups`` holds; None for a key
    of another type.  ``CorruptRecord`` when its key or value is not of this layout."""
    if rec.key is None:
        raise CorruptRecord(f"record {rec.offset} of {rec.topic}-{rec.partition} has no key")
    key = decode_key(rec.key)
    if key is None:
        return None
    return OffsetRecord(rec.offset, key, decode_value(rec.value))
