"""Sparse offset and time indexes of one segment.

Indexes are derived data: kept in memory while a segment is open, written beside the
segment when it is rolled or the log closes, rebuilt from the log by ``Segment.recover`` when
missing or invalid.  Entries are relative to the segment's base offset, fixed width.

``.index`` file, one 8-byte entry per indexed batch (big-endian)::

    relative_offset u32 | position u32         (base offset of a batch, its byte position)

``.timeindex`` file, one 12-byte entry each time the segment's max timestamp grows past an
indexed batch::

    timestamp i64 | relative_offset u32         (max timestamp so far, batch base offset)

Both lists are strictly increasing in every column; ``load`` rejects files that are not.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


class OffsetIndex:
    """Maps offsets to byte positions: the position of the last indexed batch at or below."""

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.offsets = array("q")
        self.positions = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, offset: int, position: int) -> None:
        """Index a batch starting at ``offset`` / ``position``; both must grow."""
        if self.offsets and (offset <= self.offsets[-1] or position <= self.positions[-1]):
            return
        self.offsets.append(offset)
        self.positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below ``offset``; (base, 0) if none."""
        i = bisect_right(self.offsets, offset)
        if i == 0:
            return self.base_offset, 0
        return self.offsets[i - 1], self.positions[i - 1]

    def truncate_to(self, offset: int) -> None:
        """Drop entries for batches at or above ``offset``."""
        i = bisect_right(self.offsets, offset - 1)
        del self.offsets[i:], self.positions[i:]

    def to_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(
            _OFFSET_ENTRY.pack(o - base, p) for o, p in zip(self.offsets, self.positions, strict=True)
        )

    @classmethod
    def from_bytes(cls, data: bytes, base_offset: int, size: int) -> OffsetIndex:
        """Parse an index file; ``ValueError`` unless entries are whole, sorted and < ``size``."""
        if len(data) % _OFFSET_ENTRY.size:
            raise ValueError("offset index has a partial entry")
        idx = cls(base_offset)
        last_o = last_p = -1
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            if rel <= last_o or pos <= last_p or pos >= size:
                raise ValueError("offset index entries are out of order or out of the segment")
            idx.offsets.append(base_offset + rel)
            idx.positions.append(pos)
            last_o, last_p = rel, pos
        return idx


class TimeIndex:
    """Maps timestamps to offsets: where to start scanning for the first batch at or after."""

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.offsets = array("q")

    def __len__(self) -> int:
        return len(self.timestamps)

    def append(self, timestamp: int, offset: int) -> None:
        """Record that the max timestamp reached ``timestamp`` at the batch ``offset``."""
        if self.timestamps and (timestamp <= self.timestamps[-1] or offset <= self.offsets[-1]):
            return
        self.timestamps.append(timestamp)
        self.offsets.append(offset)

    def scan_start(self, timestamp: int) -> int:
        """An offset at or before the first batch whose max timestamp is ≥ ``timestamp``.

        Every batch before the returned offset has a max timestamp below ``timestamp``.
        """
        # entries with ts < target: the batches they index (and all before) are below target
        i = bisect_right(self.timestamps, timestamp - 1)
        if i == 0:
            return self.base_offset
        return self.offsets[i - 1]

    def truncate_to(self, offset: int) -> None:
        i = bisect_right(self.offsets, offset - 1)
        del self.timestamps[i:], self.offsets[i:]

    def to_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(
            _TIME_ENTRY.pack(t, o - base) for t, o in zip(self.timestamps, self.offsets, strict=True)
        )

    @classmethod
    def from_bytes(cls, data: bytes, base_offset: int, next_offset: int) -> TimeIndex:
        if len(data) % _TIME_ENTRY.size:
            raise ValueError("time index has a partial entry")
        idx = cls(base_offset)
        last_t, last_o = None, -1
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            if (last_t is not None and ts <= last_t) or rel <= last_o or base_offset + rel >= next_offset:
                raise ValueError("time index entries are out of order or out of the segment")
            idx.timestamps.append(ts)
            idx.offsets.append(base_offset + rel)
            last_t, last_o = ts, rel
        return idx
