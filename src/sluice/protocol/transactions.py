"""Transactional messages on the wire and in the log: ids, reserved headers, the batches.

Sans-I/O, shared by the broker (broker/transactions/) and the client
(client/transaction.py).  A transaction is one **half message**: a batch its producer
writes into the target partition with the transactional attribute bit set, invisible to
every reader.  Its id is where it sits, ``(topic, partition, offset)``, printed
``topic/partition/offset``.  What ends it is one more batch in the same partition, written
by the partition's leader:

=========  ===================================  =========================================
end        batch                                records
=========  ===================================  =========================================
commit     attribute bit 6 (``COMMIT_BIT``),    the half's records, the first with the
           a normal batch: readers see it       header ``sluice.txn.id`` = the id: the
                                                copy *is* the record of the commit (one
                                                append); the others' bytes are copied as
                                                they are (``commit_copy``)
rollback   attribute bit 5 (``CONTROL_BIT``),   one record: key ``sluice.txn.rollback``,
           never shown to readers               value the half's offset (ASCII), headers
                                                ``sluice.txn.id`` and ``sluice.txn.reason``
=========  ===================================  =========================================

A half message's records carry ``sluice.txn.group`` (its producer group: who is asked
when it stays unresolved).  Whoever reads the partition's log from a half message onward
knows the half's fate; nothing else is needed to rebuild it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.errors import CorruptRecord
from sluice.protocol.compression import decompress
from sluice.protocol.records import (
    COMMIT_BIT,
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    Record,
    build_batch,
    encode_record,
    parse_header,
    split_first_record,
)

GROUP_HEADER = "sluice.txn.group"
ID_HEADER = "sluice.txn.id"
REASON_HEADER = "sluice.txn.reason"
CHECKS_HEADER = "sluice.txn.checks"
ROLLBACK_KEY = b"sluice.txn.rollback"
DISCARD_TOPIC = "__txn_discarded"  # half messages given up after max checks, for audit
# Delayed messages are half messages of this producer group that carry their delivery
# time in DELIVER_AT_HEADER (ms since the epoch, ASCII) on their first record: the leader
# commits them when they fall due, and never checks them back.
DELAY_GROUP = "sluice.delay"
DELIVER_AT_HEADER = "sluice.deliver_at"
MAX_DELAY_MS = 30 * 24 * 3600 * 1000
# Batch attribute bits that make a batch part of the transaction bookkeeping.
TXN_BITS = TRANSACTIONAL_BIT | CONTROL_BIT | COMMIT_BIT


def format_id(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"


def parse_id(text: str) -> tuple[str, int, int]:
    """``topic/partition/offset`` -> (topic, partition, offset); ``ValueError`` otherwise."""
    parts = text.rsplit("/", 2)
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"transaction id {text!r} is not topic/partition/offset")
    try:
        partition, offset = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"transaction id {text!r}: partition and offset must be integers") from None
    if not (0 <= partition < 2**31 and 0 <= offset < 2**63):
        raise ValueError(f"transaction id {text!r}: partition and offset must be ≥ 0 and fit the wire (32, 64 bits)")
    return parts[0], partition, offset


def half_batch(
    group: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    timestamp_ms: int,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    """The batch a producer sends for one half message; ``producer``: its idempotent
    producer id, epoch and sequence (so that a retried half is stored once)."""
    hdrs = [*headers, (GROUP_HEADER, group.encode())]
    body = encode_record(0, 0, key, value, hdrs)
    return build_batch(body, 1, timestamp_ms, timestamp_ms, 0, *producer, flags=TRANSACTIONAL_BIT)


def delayed_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    deliver_at_ms: int,
    timestamp_ms: int,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    """The half message holding delayed messages ``(key, value, headers)`` all due at
    ``deliver_at_ms``: one batch, so many messages of one time need one entry on the broker."""
    at = str(deliver_at_ms).encode()
    body = b"".join(
        encode_record(i, 0, key, value, [*headers, (GROUP_HEADER, DELAY_GROUP.encode()), (DELIVER_AT_HEADER, at)])
        for i, (key, value, headers) in enumerate(records)
    )
    return build_batch(body, len(records), timestamp_ms, timestamp_ms, 0, *producer, flags=TRANSACTIONAL_BIT)


def deliver_at_of(record: Record) -> int:
    """The delivery time of a delayed half's record; 0 for an ordinary half."""
    for k, v in record.headers:
        if k == DELIVER_AT_HEADER and v is not None:
            try:
                return int(v)
            except ValueError:
                return 0
    return 0


def group_of(record: Record) -> str:
    for k, v in record.headers:
        if k == GROUP_HEADER and v is not None:
            return v.decode(errors="replace")
    return ""


def commit_copy(half, half_id: str) -> bytes:
    """The visible copy of the half message batch ``half`` (its bytes as stored) that
    commits it: the same batch with the commit bit for the transactional bit, no producer
    id, a fresh CRC, and the header ``sluice.txn.id`` added to its first record.

    Per-batch work, whatever the number of records: only the first record is decoded and
    encoded again (with the id, which is what ends the half for whoever reads the log:
    ``resolved_offset``); the others are copied byte for byte, so they keep their keys,
    values, headers and timestamp and offset deltas, and a compressed half is decompressed
    and compressed again as a whole (one C call each).  The timestamp type and the batch
    timestamps are kept: readers see the records' timestamps of the half.  Raises
    ``CorruptRecord`` when ``half`` is not one whole batch or its first record is malformed.
    """
    h = parse_header(half)
    if h.size != len(half) or not h.records_count:
        raise CorruptRecord(f"a half message is one whole batch: {len(half)} bytes, header says {h.size}")
    body = memoryview(half)[HEADER_SIZE : h.size]
    raw = decompress(h.compression, body) if h.compression else bytes(body)
    first, end = split_first_record(raw)
    headers = [*first.headers, (ID_HEADER, half_id.encode())]
    records = encode_record(first.offset, first.timestamp, first.key, first.value, headers) + raw[end:]
    flags = (h.attributes & ~(COMPRESSION_MASK | TRANSACTIONAL_BIT)) | COMMIT_BIT
    return build_batch(records, h.records_count, h.base_timestamp, h.max_timestamp, h.compression, flags=flags)


def rollback_batch(half_id: str, offset: int, reason: str, now_ms: int) -> bytes:
    """The control batch that rolls a half message back."""
    body = encode_record(
        0, 0, ROLLBACK_KEY, str(offset).encode(),
        [(ID_HEADER, half_id.encode()), (REASON_HEADER, reason.encode())],
    )
    return build_batch(body, 1, now_ms, now_ms, flags=CONTROL_BIT)


def resolved_offset(attributes: int, recs: Sequence[Record]) -> int | None:
    """The half offset a commit or rollback batch ends; None for any other batch."""
    if not recs:
        return None
    if attributes & COMMIT_BIT:
        for k, v in recs[0].headers:
            if k == ID_HEADER and v is not None:
                try:
                    return parse_id(v.decode())[2]
                except (ValueError, UnicodeDecodeError):
                    return None
        return None
    if attributes & CONTROL_BIT and recs[0].key == ROLLBACK_KEY and recs[0].value is not None:
        try:
            return int(recs[0].value)
        except ValueError:
            return None
    return None
