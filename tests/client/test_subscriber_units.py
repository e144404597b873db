"""Subscriber pieces that need no broker: acked offsets as ranges, messages built by the
record decoder."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from sluice.client.subscriber import Message, _runs
from sluice.protocol.records import build_batch, decode_records, encode_record


@given(st.lists(st.integers(0, 200), max_size=60))
@example([1, 1, 3])  # a repeat and a gap of the same size: still two runs
def test_runs_are_the_sorted_ranges_of_the_offsets(offsets):
    got = _runs(list(offsets))
    covered = [o for a, b in got for o in range(a, b)]
    assert covered == sorted(set(offsets))
    assert all(b < c for (_, b), (c, _) in zip(got, got[1:], strict=False))  # disjoint, not touching


def test_messages_built_by_the_decoder():
    body = b"".join(encode_record(i, 0, b"k", b"v%d" % i, [("h", None)]) for i in range(4))
    batch = build_batch(body, 4, 1000, 1000)
    sub = object()
    msgs = decode_records(batch, "t", 2, 1, max_offset=3, factory=Message, extra=(3, 12.5, sub))
    assert [(m.offset, m.value, m.attempt, m.deadline, m.settled) for m in msgs] == [
        (1, b"v1", 3, 12.5, False), (2, b"v2", 3, 12.5, False)
    ]
    assert msgs[0]._sub is sub and msgs[0].headers == (("h", None),) and msgs[0].key == b"k"
    assert repr(msgs[0]) == "<Message t-2@1 attempt=3>"
