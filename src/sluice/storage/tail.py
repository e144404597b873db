"""Tail: the newest batches of a log's active segment, kept in memory as they were written.

A consumer at the end of a log asks for what was appended a moment ago.  Answering it from
these buffers costs no disk read and no trip to a reader thread, which is most of a tailing
consumer's latency.  ``read`` answers exactly as ``PartitionLog.read`` would from the
segment (the same bytes, cut at the same place) or says None, and the caller reads the log.

The tail holds whole writes of one segment, oldest first, at most about ``capacity`` bytes
(an older write is dropped once newer ones fill it).  It keeps references to the written
buffers, no copies, but for a buffer that is a small part of a larger request frame (a
produce to many partitions): that one is copied, so the tail never holds much more memory
than its bytes.  The partition's writer feeds it after each leader write and clears it
before anything rewrites the log under it (a truncation, a follower's write); a write to a
new segment starts it over, so it never reaches into a segment the cleaner may rewrite.
Event loop only.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from sluice.protocol.records import LOG_OVERHEAD


class Tail:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self._segment = -1  # base offset of the segment the writes are in
        self._pieces: list = []  # written buffers, in order
        self._piece_pos: list[int] = []  # where each piece starts in the stream of them all
        self._bases: list[int] = []  # first offset of each batch
        self._batch_pos: list[int] = []  # where each batch starts in the stream
        self._end = 0  # stream position after the newest piece
        self.end_offset = -1  # offset after the newest batch

    def add(
        self, segment: int, batches: Sequence[tuple[int, int, int, int]], buffers: Sequence
    ) -> None:
        """After a write of ``buffers`` (whole batches, in order) to segment ``segment``:
        ``batches`` holds each batch's (base offset, next offset, timestamp, size)."""
        if self.capacity <= 0:
            return
        continues = not self._bases or not batches or batches[0][0] == self.end_offset
        if segment != self._segment or not continues:
            self.clear()
            self._segment = segment
        pos = self._end
        for base, nxt, _ts, size in batches:
            self._bases.append(base)
            self._batch_pos.append(pos)
            pos += size
            self.end_offset = nxt
        for buf in buffers:
            owner = getattr(buf, "obj", None)  # a view holds its whole request frame alive
            if owner is not None and 2 * len(buf) < len(owner):
                buf = bytes(buf)  # a small part of a larger frame: keep a copy, not the frame
            self._piece_pos.append(self._end)
            self._pieces.append(buf)
            self._end += len(buf)
        if pos != self._end:  # batches and bytes disagree: keep nothing rather than guess
            self.clear()
            return
        if self._end - self._piece_pos[0] > self.capacity:
            self._trim()

    def _trim(self) -> None:
        drop = bisect_right(self._piece_pos, self._end - self.capacity)  # oldest pieces out
        drop = min(max(drop, 1), len(self._pieces) - 1)  # the newest piece stays, however big
        first = self._piece_pos[drop]
        del self._pieces[:drop], self._piece_pos[:drop]
        cut = bisect_right(self._batch_pos, first - 1)
        del self._bases[:cut], self._batch_pos[:cut]

    def read(self, offset: int, max_bytes: int, bound: int) -> bytes | None:
        """Bytes of whole batches from the one holding ``offset``, about ``max_bytes``, all
        below ``bound`` (at most the log end), as ``PartitionLog.read`` gives them; None when
        the tail does not hold ``offset`` or ``bound`` (read the log)."""
        bases = self._bases
        if not bases or offset < bases[0] or bound <= offset or bound > self.end_offset:
            return None
        if bound == self.end_offset:
            limit = self._end
        else:
            j = bisect_right(bases, bound) - 1
            if bases[j] != bound:  # a bound inside a batch: the log's rules apply
                return None
            limit = self._batch_pos[j]
        i = bisect_right(bases, offset) - 1
        pos = self._batch_pos[i]
        stop = min(limit, pos + max(max_bytes, LOG_OVERHEAD))
        if stop < limit:  # extend to the end of the first batch if the cap cut it
            first_end = self._batch_pos[i + 1] if i + 1 < len(bases) else self._end
            stop = max(stop, min(first_end, limit))
        return self._bytes(pos, stop)

    def _bytes(self, start: int, stop: int) -> bytes:
        k = bisect_right(self._piece_pos, start) - 1
        out = []
        while start < stop:
            piece, at = self._pieces[k], self._piece_pos[k]
            take = min(stop, at + len(piece))
            out.append(memoryview(piece)[start - at : take - at])
            start = take
            k += 1
        return b"".join(out)
