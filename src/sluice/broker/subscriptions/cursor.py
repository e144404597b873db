"""A subscription's cursor on one partition: the offsets settled (acked, or skipped as
hidden or expired) — all below ``confirmed``, and acked ranges above it (NSQ's confirmed
segments).  The durable part of a subscription (delivery.py; its records: store.py)."""

from __future__ import annotations

from sluice.protocol.ranges import Pairs, RangeSet


class Cursor:
    """Settled offsets: all below ``confirmed``, and ``acked`` above it."""

    def __init__(self, confirmed: int, acked: Pairs = ()) -> None:
        self.confirmed = confirmed
        self.acked = RangeSet(acked)
        self._advance()

    def ack(self, a: int, b: int) -> int:
        """Settle ``[a, b)``; returns how many offsets were not settled before."""
        a = max(a, self.confirmed)
        if a >= b:
            return 0
        added = self.acked.add(a, b)
        self._advance()
        return added

    def _advance(self) -> None:
        acked = self.acked
        while acked.starts and acked.starts[0] <= self.confirmed:
            self.confirmed = max(self.confirmed, acked.ends[0])
            del acked.starts[0], acked.ends[0]

    def unsettled(self, a: int, b: int) -> Pairs:
        """The parts of ``[a, b)`` not settled."""
        return self.acked.missing(max(a, self.confirmed), b) if b > self.confirmed else []

    def reset(self, offset: int) -> None:
        self.confirmed = offset
        self.acked = RangeSet()
