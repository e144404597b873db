"""``RangeSet`` (protocol/ranges.py) and the subscription ``Cursor`` (broker/cursor.py)
against plain Python sets of offsets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.broker.subscriptions.cursor import Cursor
from sluice.protocol.ranges import RangeSet, count, first

LIMIT = 60
offsets = st.integers(0, LIMIT)
spans = st.tuples(offsets, offsets)


def as_set(pairs) -> set[int]:
    return {o for a, b in pairs for o in range(a, b)}


def runs(values: set[int]) -> list[tuple[int, int]]:
    """The sorted, disjoint, merged ranges of ``values``."""
    out: list[tuple[int, int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


class RangeSetModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rs = RangeSet()
        self.model: set[int] = set()

    @rule(span=spans)
    def add(self, span):
        a, b = span
        new = set(range(a, b)) - self.model
        assert self.rs.add(a, b) == len(new)
        self.model |= new

    @rule(span=spans)
    def remove(self, span):
        a, b = span
        gone = set(range(a, b)) & self.model
        assert self.rs.remove(a, b) == len(gone)
        self.model -= gone

    @rule(offset=offsets)
    def pop_below(self, offset):
        self.rs.pop_below(offset)
        self.model = {o for o in self.model if o >= offset}

    @rule(span=spans)
    def overlap_and_missing(self, span):
        a, b = span
        inside = set(range(a, b))
        overlap = self.rs.overlap(a, b)
        missing = self.rs.missing(a, b)
        assert overlap == runs(inside & self.model)
        assert missing == runs(inside - self.model)
        assert count(overlap) + count(missing) == max(0, b - a)

    @rule(offset=st.integers(-2, LIMIT + 2))
    def contains(self, offset):
        assert (offset in self.rs) == (offset in self.model)

    @invariant()
    def same_as_model(self):
        assert self.rs.pairs() == runs(self.model)  # sorted, disjoint, adjacent ones merged
        assert self.rs.count() == len(self.model)
        assert len(self.rs) == len(runs(self.model))
        assert bool(self.rs) == bool(self.model)
        assert RangeSet(self.rs.pairs()) == self.rs


TestRangeSetModel = RangeSetModel.TestCase
TestRangeSetModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@given(st.lists(spans, max_size=20))
def test_built_from_pairs_is_their_union(pairs):
    assert as_set(RangeSet(pairs)) == as_set(p for p in pairs if p[0] < p[1])
    assert RangeSet(pairs).pairs() == runs(as_set(p for p in pairs if p[0] < p[1]))


def test_empty_and_reversed_spans_change_nothing():
    rs = RangeSet([(3, 5)])
    assert rs.add(7, 7) == 0 and rs.add(9, 8) == 0
    assert rs.remove(4, 4) == 0 and rs.remove(5, 3) == 0
    assert rs.pairs() == [(3, 5)]
    assert rs.overlap(9, 2) == [] and rs.missing(9, 2) == []


def test_in_order_acks_are_one_range():
    rs = RangeSet()
    for o in range(10_000):
        rs.add(o, o + 1)
    assert rs.pairs() == [(0, 10_000)] and len(rs) == 1 and rs.count() == 10_000


# --------------------------------------------------------------------------- Cursor


@given(
    start=st.integers(0, 20),
    n=st.integers(0, 60),
    data=st.data(),
)
def test_cursor_confirmed_is_lowest_unacked(start, n, data):
    """Acks in random order (with repeats and spans): ``confirmed`` is always the lowest
    unacked offset, ``acked`` holds exactly the acked offsets above it."""
    cursor = Cursor(start)
    acked: set[int] = set()
    end = start + n
    steps = data.draw(st.lists(st.tuples(st.integers(0, end + 3), st.integers(1, 4)), max_size=80))
    for a, width in steps:
        b = a + width
        new = set(range(max(a, start), b)) - acked
        assert cursor.ack(a, b) == len(new)
        acked |= new
        lowest = start
        while lowest in acked:
            lowest += 1
        assert cursor.confirmed == lowest
        above = {o for o in acked if o > lowest}
        assert cursor.acked.pairs() == runs(above)
        for x in range(0, end + 8):
            for y in (x, x + 1, x + 5):
                want = set(range(max(x, start), y)) - acked
                assert cursor.unsettled(x, y) == runs(want)
    # everything acked, in a shuffled order: confirmed is the end, no range left
    order = data.draw(st.permutations(range(start, end)))
    for o in order:
        cursor.ack(o, o + 1)
    top = start + n
    while top in acked:
        top += 1
    assert cursor.confirmed == max(top, end)
    assert cursor.unsettled(0, end) == []


def test_cursor_from_a_loaded_state_merges_ranges_touching_confirmed():
    c = Cursor(10, [(10, 12), (14, 15)])
    assert c.confirmed == 12 and c.acked.pairs() == [(14, 15)]
    assert c.unsettled(0, 20) == [(12, 14), (15, 20)]
    assert c.ack(0, 5) == 0  # below confirmed: settled already
    c.reset(3)
    assert c.confirmed == 3 and not c.acked and c.unsettled(0, 5) == [(3, 5)]


def test_first_takes_the_first_n_offsets():
    pairs = [(0, 3), (5, 6), (8, 12)]
    assert first(pairs, 0) == []
    assert first(pairs, 2) == [(0, 2)]
    assert first(pairs, 4) == [(0, 3), (5, 6)]
    assert first(pairs, 6) == [(0, 3), (5, 6), (8, 10)]
    assert first(pairs, 100) == pairs
