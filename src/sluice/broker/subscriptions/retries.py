"""The redeliveries one subscription has pending on one partition, and their journal.

A ``Retry`` is a list of offset ranges waiting for its redelivery time (a nack, a deadline
passed, a consumer gone), with the attempt that failed and why.  ``Retries`` keeps them on
a heap by due time (ordered mode takes the one at the lowest offset instead), and the
journal: the retries with an attempt counted scheduled since the last cursor record, which
the next record carries (protocol/subscriptions.py), so attempt counts and due times
survive a restart without every record holding every retry.  A journal lost (a record not
written) is ``None``: the next record must hold them all.

Event loop only.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from sluice.protocol.ranges import Pairs, RangeSet

# a journal entry: (first offset, end offset, attempts so far, due time in ms since the epoch)
Entry = tuple[int, int, int, int]


@dataclass(order=True)
class Retry:
    due: float
    seq: int
    ranges: Pairs = field(compare=False)
    attempt: int = field(compare=False)  # deliveries so far
    reason: str = field(compare=False, default="")


def _first_offset(r: Retry) -> int:
    return r.ranges[0][0]


def failed_counts(
    ranges: Pairs, attempt: int, ordered: bool, failed: tuple[int, int] | None = None
) -> list[tuple[Pairs, int]]:
    """How a delivery of ``ranges`` that failed at ``attempt`` counts: (ranges, attempts
    so far).  In ordered mode only the failed message counts (``failed``, else the first
    one): the client gives a partition's messages out one at a time, so the application
    never saw the ones behind it, and they wait for its redelivery uncounted."""
    if not ordered or not ranges:
        return [(ranges, attempt)]
    a, b = failed or (ranges[0][0], ranges[0][0] + 1)
    rest = RangeSet(ranges)
    counted = rest.overlap(a, b)
    rest.remove(a, b)
    return [(counted, attempt), (rest.pairs(), attempt - 1)]


class Retries:
    """Pending redeliveries (a heap by due time) and the journal of those counted."""

    def __init__(self) -> None:
        self._heap: list[Retry] = []
        self._seq = itertools.count()
        self._journal: list[Entry] | None = []

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return iter(self._heap)

    def restore(self, ranges: Pairs, attempt: int, due: float) -> None:
        """A retry read from a cursor record (already on disk: not journaled again)."""
        heapq.heappush(self._heap, Retry(due, next(self._seq), ranges, attempt, "restored"))

    def schedule(self, ranges: Pairs, attempt: int, due: float, reason: str) -> bool:
        """Redeliver ``ranges`` (``attempt`` deliveries so far) at ``due`` (monotonic);
        True when journaled (an attempt counted): the cursor has a record to write."""
        if not ranges:
            return False
        heapq.heappush(self._heap, Retry(due, next(self._seq), list(ranges), attempt, reason))
        if attempt <= 0:
            return False
        if self._journal is not None:
            due_ms = int(time.time() * 1000 + (due - time.monotonic()) * 1000)
            self._journal.extend((a, b, attempt, due_ms) for a, b in ranges)
        return True

    def next(self, ordered: bool) -> Retry | None:
        """The retry to deliver next: the first due; in ordered mode the one at the lowest
        offset (it goes first, whenever it is due)."""
        if not self._heap:
            return None
        if ordered:
            return min(self._heap, key=_first_offset)
        return self._heap[0]

    def pop(self, r: Retry) -> None:
        heap = self._heap
        if heap[0] is r:
            heapq.heappop(heap)
        else:
            heap.remove(r)
            heapq.heapify(heap)

    # ------------------------------------------------------------------ the journal

    @property
    def journal_lost(self) -> bool:
        return self._journal is None

    def take_journal(self) -> list[Entry]:
        """The entries scheduled since the last record (the journal starts again)."""
        entries, self._journal = self._journal or [], []
        return entries

    def all_entries(self, now_ms: float, mono: float) -> list[Entry]:
        """Every pending retry as journal entries (a full record); the journal starts again."""
        self._journal = []
        return [(a, b, r.attempt, int(now_ms + (r.due - mono) * 1000)) for r in self._heap for a, b in r.ranges]

    def lose_journal(self) -> None:
        """The record that held the journal was not written: the next holds every retry."""
        self._journal = None

    def clear(self) -> None:
        """Forget every retry (a seek: its record holds none)."""
        self._heap.clear()
        self._journal = []
