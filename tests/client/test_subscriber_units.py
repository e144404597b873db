"""Subscriber pieces that need no broker: acked offsets as ranges, messages built by the
record decoder."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sluice import errors
from sluice.client.settling import runs
from sluice.client.subscriber import Message, Subscriber
from sluice.protocol.records import build_batch, decode_records, encode_record


@given(st.lists(st.integers(0, 200), max_size=60))
@example([1, 1, 3])  # a repeat and a gap of the same size: still two runs
def test_runs_are_the_sorted_ranges_of_the_offsets(offsets):
    got = runs(list(offsets))
    covered = [o for a, b in got for o in range(a, b)]
    assert covered == sorted(set(offsets))
    assert all(b < c for (_, b), (c, _) in zip(got, got[1:], strict=False))  # disjoint, not touching


def test_messages_built_by_the_decoder():
    body = b"".join(encode_record(i, 0, b"k", b"v%d" % i, [("h", None)]) for i in range(4))
    batch = build_batch(body, 4, 1000, 1000)
    sub, session = object(), object()
    msgs = decode_records(batch, "t", 2, 1, max_offset=3, factory=Message, extra=(3, 12.5, sub, session))
    assert [(m.offset, m.value, m.attempt, m.deadline, m.settled) for m in msgs] == [
        (1, b"v1", 3, 12.5, False), (2, b"v2", 3, 12.5, False)
    ]
    assert msgs[0]._sub is sub and msgs[0]._session is session
    assert msgs[0].headers == (("h", None),) and msgs[0].key == b"k"
    assert repr(msgs[0]) == "<Message t-2@1 attempt=3>"


def test_a_nack_counts_only_in_the_session_that_delivered_the_message():
    sub = Subscriber("127.0.0.1:1", "t", "s")  # never started: settling runs in place
    conn = object()
    sub._serve(0, conn)

    def delivered(offset: int) -> Message:
        return Message("t", 0, offset, 0, None, b"v", (), 1, 0.0, sub, sub._sessions.get(0))

    unsent, old = delivered(1), delivered(2)
    unsent.nack(delay_ms=5)
    assert sub._acks.pending[0].nack_delays[5].pairs() == [(1, 2)]
    sub._lost(0, conn)  # the connection went (a restart): both messages come again
    assert sub._acks.pending[0].nack_delays == {}  # the unsent nack went with its session
    sub._serve(0, conn)  # a new session, on the same connection even
    old.nack(delay_ms=5)  # its delivery went with the old session
    assert sub._acks.pending[0].nack_delays == {} and old.settled
    delivered(2).nack(delay_ms=5)  # the new session's copy
    assert sub._acks.pending[0].nack_delays[5].pairs() == [(2, 3)]


def test_a_message_is_settled_once():
    sub = Subscriber("127.0.0.1:1", "t", "s")  # never started: settling runs in place
    sub._serve(0, object())
    msg = Message("t", 0, 7, 0, None, b"v", (), 1, 0.0, sub, sub._sessions.get(0))
    msg.ack()
    for second in (msg.ack, msg.nack, lambda: msg.nack(delay_ms=5, reason="late")):
        with pytest.raises(errors.AlreadySettled, match=r"cannot n?ack <Message t-0@7 attempt=1>"):
            second()
    assert sub._acks.pending[0].acks == [7] and sub._acks.pending[0].nack_delays == {}  # the first stands
    msg.touch()  # a late touch (keep_alive's) is not a settlement: ignored


@pytest.mark.parametrize(
    ("delay_ms", "error", "match"),
    [
        (-5, errors.ConfigError, r"delay_ms must be 0-2592000000 \(30 days; None: .*\), got -5"),
        (30 * 86_400_000 + 1, errors.ConfigError, "got 2592000001"),
        (10**15, errors.ConfigError, "got 1000000000000000"),
        (1.5, TypeError, "delay_ms must be an int .* not float"),
        (2.0, TypeError, "not float"),
        ("x", TypeError, "not str"),
        (True, TypeError, "not bool"),
    ],
)
def test_a_nack_delay_is_milliseconds_of_at_most_30_days(delay_ms, error, match):
    sub = Subscriber("127.0.0.1:1", "t", "s")  # never started: settling runs in place
    sub._serve(0, object())
    msg = Message("t", 0, 7, 0, None, b"v", (), 1, 0.0, sub, sub._sessions.get(0))
    with pytest.raises(error, match=match):
        msg.nack(delay_ms=delay_ms)
    assert not msg.settled  # nothing nacked: the message may still be settled
    assert not (sub._acks.pending.get(0) and sub._acks.pending[0].nack_delays)
    msg.nack(delay_ms=30 * 86_400_000)  # the longest delay is taken, and the message is settled
    assert sub._acks.pending[0].nack_delays[30 * 86_400_000].pairs() == [(7, 8)] and msg.settled
