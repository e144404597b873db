"""What a Subscriber settled on a partition and has not sent yet; acked offsets as ranges."""

from __future__ import annotations

from sluice import errors
from sluice.protocol.ranges import RangeSet
from sluice.protocol.transactions import MAX_DELAY_MS


def nack_delay(delay_ms: int | None) -> int:
    """The delay of ``Message.nack(delay_ms)`` as sent (-1: the subscription's backoff):
    an int of 0 to ``MAX_DELAY_MS`` (30 days, as delayed messages), else ``TypeError``
    (not an int) or ``ConfigError``."""
    if delay_ms is None:
        return -1
    if type(delay_ms) is not int:  # 1.5 would be cut, "5" is no number of milliseconds
        raise TypeError(f"delay_ms must be an int (milliseconds) or None, not {type(delay_ms).__name__}")
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        raise errors.ConfigError(
            f"delay_ms must be 0-{MAX_DELAY_MS} ({MAX_DELAY_MS // 86_400_000} days; None: the "
            f"subscription's backoff), got {delay_ms}"
        )
    return delay_ms


class Pending:
    """What was settled on one partition and not sent yet.

    ``nack_delays`` holds every nack, by delay; ``reasons`` those nacked with a reason,
    by (delay, reason): a request part has one delay and one reason, so nacks that differ
    in either go in parts of their own (nacks sharing a reason, the usual case, in one)."""

    __slots__ = ("acks", "nack_delays", "reasons", "releases", "touches")

    def __init__(self) -> None:
        self.acks: list[int] = []  # offsets, in the order acked
        self.nack_delays: dict[int, RangeSet] = {}
        self.reasons: dict[tuple[int, str], RangeSet] = {}
        self.touches = RangeSet()
        self.releases = RangeSet()

    def nack(self, offset: int, delay_ms: int, reason: str) -> None:
        self.nack_delays.setdefault(delay_ms, RangeSet()).add(offset, offset + 1)
        if reason:
            self.reasons.setdefault((delay_ms, reason), RangeSet()).add(offset, offset + 1)

    def drop_nacks(self) -> None:
        self.nack_delays.clear()
        self.reasons.clear()

    def nack_parts(self) -> list[tuple[int, str, RangeSet]]:
        """(delay, reason, offsets) of the nacks, one per delay and reason ("": none)."""
        out = []
        for delay, nacks in self.nack_delays.items():
            rest = nacks
            for (d, reason), offsets in self.reasons.items():
                if d != delay:
                    continue
                if rest is nacks:
                    rest = RangeSet(nacks.pairs())
                for a, b in offsets:
                    rest.remove(a, b)
                out.append((delay, reason, offsets))
            if rest:
                out.append((delay, "", rest))
        return out


def runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Offsets (any order, repeats allowed) as sorted half-open ranges."""
    offsets = sorted(set(offsets))
    if not offsets:
        return []
    if offsets[-1] - offsets[0] + 1 == len(offsets):  # one run: the usual case
        return [(offsets[0], offsets[-1] + 1)]
    out: list[list[int]] = []
    for o in offsets:
        if out and o <= out[-1][1]:
            out[-1][1] = max(out[-1][1], o + 1)
        else:
            out.append([o, o + 1])
    return [(a, b) for a, b in out]
