"""Storage test helpers: build batches, append them the way the partition writer does.

``append_batches`` follows ``broker.leader_append.LeaderAppends.write`` / ``Writer.write``
step for step (validate -> roll_due -> new segment, rolled segment flush + seal + recovery
point -> roll -> assign_offsets -> Segment.write -> appended -> the single-replica ISR step
advance_high_watermark), minus the threads, so a PartitionLog test exercises the same
sequence of calls the broker makes.
"""

from __future__ import annotations

import time

from sluice.protocol.records import (
    assign_offsets,
    build_batch,
    decode_records,
    encode_keyless_records,
    encode_record,
    iter_batches,
    validate_batches,
)
from sluice.storage.log import PartitionLog
from sluice.storage.segment import Segment

BIG = 1 << 30  # a max_batch_bytes no test batch reaches
TOPIC = "t"


def now_ms() -> int:
    return int(time.time() * 1000)


def make_batch(values: list[bytes], ts: int = 1_000) -> bytes:
    """One keyless batch of ``values``, every record stamped ``ts`` (base offset 0)."""
    return build_batch(encode_keyless_records(values), len(values), ts, ts)


def make_keyed_batch(records: list[tuple[bytes | None, bytes | None]], ts: int = 1_000) -> bytes:
    """One batch of (key, value) records (None: null), every record stamped ``ts``."""
    body = b"".join(encode_record(i, 0, k, v) for i, (k, v) in enumerate(records))
    return build_batch(body, len(records), ts, ts)


def append_batches(
    plog: PartitionLog,
    batches: list[list[bytes] | bytes],
    timestamps: list[int] | None = None,
    now: int | None = None,
    append_time: int | None = None,
    epoch: int = 0,
    advance: bool = True,
) -> list[int]:
    """Append one produce request holding ``batches`` (a keyless batch per value list, or
    a batch built already); return bases.

    Mirrors the writer: the whole request is one group, written with one ``Segment.write``.
    """
    if timestamps is None:
        timestamps = [1_000] * len(batches)
    data = bytearray(b"".join(
        v if isinstance(v, bytes) else make_batch(v, t) for v, t in zip(batches, timestamps, strict=True)
    ))
    spans = validate_batches(data, BIG)
    total = sum(s.size for s in spans)
    count = sum(s.count for s in spans)
    segment = plog.active
    if plog.roll_due(total, count, now_ms() if now is None else now):
        rolled, segment = segment, Segment.create(plog.directory, plog.next_offset, plog.config.index_interval_bytes)
        rolled.flush()
        rolled.seal()
        plog.write_recovery_point(segment.base_offset)
        plog.roll(segment)
    offset = plog.next_offset
    bases, metas = [], []
    for s in spans:
        ts = append_time if append_time is not None else s.max_timestamp
        bases.append(offset)
        metas.append((offset, offset + s.count, ts, s.size))
        offset += s.count
    assert assign_offsets(data, spans, plog.next_offset, epoch, append_time) == offset
    segment.write([data], total)
    plog.appended(segment, metas, offset, [(epoch, bases[0])])
    if advance:  # ISR = {this replica}: the high watermark follows the log end
        plog.advance_high_watermark(offset)
    return bases


def decode(data: bytes, min_offset: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of the whole batches in ``data`` at/after min_offset."""
    return [(r.offset, r.value) for r in decode_records(data, TOPIC, 0, min_offset=min_offset)]


def read_all(plog: PartitionLog, start: int | None = None) -> list[tuple[int, bytes]]:
    """Every record from ``start`` (default: log start) to the high watermark, via ``read``."""
    offset = plog.log_start_offset if start is None else start
    out: list[tuple[int, bytes]] = []
    while offset < plog.high_watermark:
        got = decode(plog.read(offset, 1 << 20, plog.high_watermark).data, offset)
        assert got, f"no record at {offset} below the high watermark {plog.high_watermark}"
        out += got
        offset = got[-1][0] + 1
    return out


def batch_bounds(data: bytes) -> list[tuple[int, int, int, int]]:
    """(position, size, base_offset, next_offset) of each whole batch in ``data``."""
    return [(pos, h.size, h.base_offset, h.next_offset) for h, pos in iter_batches(data)]
