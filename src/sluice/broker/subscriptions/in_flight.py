"""What one subscription has out on one partition: delivery units and their ack deadlines.

A ``Unit`` is one stored batch delivered to one consumer, with the offsets of it that the
delivery wants settled, its attempt number and its ack deadline.  ``InFlight`` keeps the
units by batch base offset (sorted, so the units overlapping an offset range are found by
bisection) and their deadlines on a heap: no timer per message.  It decides nothing: the
delivery (broker/subscriptions/delivery.py) settles, expires and requeues.

Event loop only.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.protocol.ranges import RangeSet

if TYPE_CHECKING:
    from sluice.broker.subscriptions.session import Session


@dataclass(eq=False)
class Unit:
    base: int  # the batch's base offset
    end: int  # its next offset
    data: memoryview  # the batch
    want: RangeSet  # offsets of it delivered here and not settled yet
    attempt: int
    session: Session
    deadline: float = 0.0  # monotonic


class InFlight:
    """The units out, by batch base offset, and a heap of their deadlines (entries of
    units settled or touched since stay in the heap and are skipped when popped)."""

    def __init__(self) -> None:
        self._units: dict[int, list[Unit]] = {}  # batch base -> units of it in flight
        self._bases: list[int] = []  # sorted keys of _units
        self._deadlines: list[tuple[float, int, Unit]] = []
        self._seq = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._units)

    def units(self) -> list[Unit]:
        return [u for units in self._units.values() for u in units]

    def of_batch(self, base: int) -> list[Unit]:
        return list(self._units.get(base, ()))

    def count(self) -> int:
        """Offsets out and not settled."""
        return sum(u.want.count() for units in self._units.values() for u in units)

    def add(self, unit: Unit) -> None:
        units = self._units.get(unit.base)
        if units is None:
            self._units[unit.base] = [unit]
            insort(self._bases, unit.base)
        else:
            units.append(unit)
        heapq.heappush(self._deadlines, (unit.deadline, next(self._seq), unit))

    def drop(self, unit: Unit) -> None:
        """Forget ``unit`` (settled, failed, or its consumer gone); no-op if already gone."""
        units = self._units.get(unit.base)
        if units is None or unit not in units:
            return
        units.remove(unit)
        if not units:
            del self._units[unit.base]
            del self._bases[bisect_left(self._bases, unit.base)]

    def overlapping(self, a: int, b: int) -> list[Unit]:
        """The units out whose batches overlap ``[a, b)``."""
        if a >= b:
            return []
        bases = self._bases
        i = max(bisect_right(bases, a) - 1, 0)
        j = bisect_left(bases, b)
        return [u for base in bases[i:j] for u in self._units[base] if u.end > a]

    def touch(self, unit: Unit, deadline: float) -> None:
        """Move ``unit``'s ack deadline (a consumer extends it)."""
        unit.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._seq), unit))

    def expired(self, now: float) -> list[Unit]:
        """Take out the units whose deadline passed by ``now``, in deadline order."""
        heap = self._deadlines
        out = []
        while heap and heap[0][0] <= now:
            deadline, _, unit = heapq.heappop(heap)
            if unit.deadline != deadline or unit not in self._units.get(unit.base, ()):
                continue  # touched since, or settled
            self.drop(unit)
            out.append(unit)
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline on the heap (maybe of a unit settled since: a wake-up for
        nothing, never one missed)."""
        return self._deadlines[0][0] if self._deadlines else None

    def clear(self) -> None:
        self._units.clear()
        self._bases.clear()
        self._deadlines.clear()
