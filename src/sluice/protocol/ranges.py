"""Sets of offsets kept as sorted, disjoint half-open ranges ``[start, end)``.

Sans-I/O, shared by the broker (a subscription's acked offsets, what is in flight) and the
client (what a delivery wants).  Adjacent ranges are merged, so the number of ranges is
the number of gaps, not of offsets: a million acks in order are one range.  Every
operation costs O(log n + k) for n ranges and k ranges touched.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

Pairs = list[tuple[int, int]]


class RangeSet:
    __slots__ = ("ends", "starts")

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        for a, b in pairs:
            self.add(a, b)

    def __len__(self) -> int:
        """The number of ranges (not of offsets: see ``count``)."""
        return len(self.starts)

    def __bool__(self) -> bool:
        return bool(self.starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends, strict=True)

    def __repr__(self) -> str:
        return f"RangeSet({list(self)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RangeSet) and self.starts == other.starts and self.ends == other.ends

    def pairs(self) -> Pairs:
        return list(self)

    def count(self) -> int:
        """How many offsets the set holds."""
        return sum(self.ends) - sum(self.starts)

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self.starts, offset) - 1
        return i >= 0 and offset < self.ends[i]

    def add(self, a: int, b: int) -> int:
        """Add ``[a, b)``; returns how many offsets were not in the set before."""
        if a >= b:
            return 0
        starts, ends = self.starts, self.ends
        i = bisect_left(ends, a)  # first range ending at or after a: it may touch [a, b)
        j = bisect_right(starts, b)  # ranges from i to j-1 touch or overlap [a, b)
        if i == j:
            starts.insert(i, a)
            ends.insert(i, b)
            return b - a
        covered = sum(min(ends[k], b) - max(starts[k], a) for k in range(i, j) if starts[k] < b and ends[k] > a)
        new_a, new_b = min(a, starts[i]), max(b, ends[j - 1])
        starts[i:j] = [new_a]
        ends[i:j] = [new_b]
        return (b - a) - covered

    def remove(self, a: int, b: int) -> int:
        """Remove ``[a, b)``; returns how many offsets were in the set."""
        if a >= b:
            return 0
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, a)  # first range ending after a
        j = bisect_left(starts, b)  # ranges i..j-1 overlap [a, b)
        if i >= j:
            return 0
        removed = sum(min(ends[k], b) - max(starts[k], a) for k in range(i, j))
        keep_s, keep_e = [], []
        if starts[i] < a:
            keep_s.append(starts[i])
            keep_e.append(a)
        if ends[j - 1] > b:
            keep_s.append(b)
            keep_e.append(ends[j - 1])
        starts[i:j] = keep_s
        ends[i:j] = keep_e
        return removed

    def overlap(self, a: int, b: int) -> Pairs:
        """The parts of ``[a, b)`` in the set (none when ``[a, b)`` is empty)."""
        if a >= b:
            return []
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, a)
        out = []
        while i < len(starts) and starts[i] < b:
            out.append((max(starts[i], a), min(ends[i], b)))
            i += 1
        return out

    def missing(self, a: int, b: int) -> Pairs:
        """The parts of ``[a, b)`` not in the set."""
        out, at = [], a
        for s, e in self.overlap(a, b):
            if s > at:
                out.append((at, s))
            at = e
        if at < b:
            out.append((at, b))
        return out

    def pop_below(self, offset: int) -> None:
        """Drop everything below ``offset``."""
        if self.starts and self.starts[0] < offset:
            self.remove(self.starts[0], offset)


def count(pairs: Iterable[tuple[int, int]]) -> int:
    return sum(b - a for a, b in pairs)


def first(pairs: Iterable[tuple[int, int]], n: int) -> Pairs:
    """The first ``n`` offsets of ``pairs`` (sorted, disjoint), as pairs."""
    out = []
    for a, b in pairs:
        if n <= 0:
            break
        out.append((a, min(b, a + n)))
        n -= out[-1][1] - a
    return out
