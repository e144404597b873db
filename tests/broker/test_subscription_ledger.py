"""A subscription's books on one partition (``Ledger``, broker/subscriptions/ledger.py)
without a log or a socket: units handed out to a real ``Session`` (over the in-memory
connection of tests/broker/in_memory.py), settled, failed, given back, sought, and the
cursor record written from them and loaded again."""

from __future__ import annotations

import time

from in_memory import Conn

from sluice.broker.subscriptions.ledger import Ledger
from sluice.broker.subscriptions.session import Session
from sluice.protocol import messages as m
from sluice.protocol.ranges import RangeSet
from sluice.protocol.subscriptions import CursorState, SubscriptionConfig

NEVER_MS = 600_000
BATCH = memoryview(b"\0" * 64)  # the ledger keeps the batch bytes, never reads them


def books(config: SubscriptionConfig | None = None, **state) -> tuple[Ledger, list[int]]:
    """A ledger of subscription ``work`` on ``t``-0, and the list its changes count in."""
    changes: list[int] = []
    config = config or SubscriptionConfig(ack_timeout_ms=NEVER_MS)
    ledger = Ledger(CursorState(name="work", config=config, **state), "t", 0, lambda: changes.append(1))
    return ledger, changes


def hand_out(ledger: Ledger, session: Session, a: int, b: int, attempt: int = 1) -> list[m.Delivery]:
    """Deliver offsets ``[a, b)`` (one stored batch) to ``session``, as the pump does."""
    deliveries: list[m.Delivery] = []
    ledger.hand_out(session, a, b, BATCH, RangeSet([(a, b)]), attempt, deliveries, [])
    ledger.next_read = max(ledger.next_read, b)
    return deliveries


def session(prefetch: int = 100) -> Session:
    return Session(Conn(), "t", "work", prefetch)


def test_out_of_order_acks_move_the_cursor_once_the_gap_closes():
    ledger, changes = books()
    s = session()
    hand_out(ledger, s, 0, 5)
    assert (ledger.in_flight(), s.outstanding) == (5, 5)
    ledger.settle(m.AckPartition(partition=0, acks=[(2, 5)]), stored=5)
    assert ledger.cursor.confirmed == 0 and ledger.cursor.acked.pairs() == [(2, 5)]
    assert (ledger.in_flight(), s.outstanding) == (2, 2)
    ledger.settle(m.AckPartition(partition=0, acks=[(0, 2)]), stored=5)
    assert ledger.cursor.confirmed == 5 and not ledger.cursor.acked
    assert (ledger.in_flight(), s.outstanding) == (0, 0)
    assert not ledger.out and changes


def test_a_nack_waits_for_the_backoff_and_the_last_attempt_is_due_at_once():
    config = SubscriptionConfig(ack_timeout_ms=NEVER_MS, max_attempts=2, backoff_initial_ms=5_000)
    ledger, _ = books(config)
    s = session()
    hand_out(ledger, s, 0, 3)
    before = time.monotonic()
    ledger.settle(m.AckPartition(partition=0, nacks=[(1, 2)], reason="bad"), stored=3)
    r = ledger.next_retry()
    assert (r.ranges, r.attempt, r.reason) == ([(1, 2)], 1, "bad")
    assert r.due >= before + 5.0  # the subscription's backoff after a first failure
    assert (ledger.in_flight(), ledger.retrying()) == (2, 1)
    ledger.retries.pop(r)
    hand_out(ledger, s, 1, 2, attempt=2)
    ledger.settle(m.AckPartition(partition=0, nacks=[(1, 2)]), stored=3)
    r = ledger.next_retry()
    assert r.attempt == 2 and r.due <= time.monotonic()  # dead-lettered with no backoff


def test_deliveries_not_pushed_go_back_with_their_attempt_uncounted():
    ledger, _ = books()
    s = session()
    deliveries = hand_out(ledger, s, 0, 4, attempt=3)
    ledger.not_delivered(s, deliveries)
    assert ledger.in_flight() == 0
    r = ledger.next_retry()
    assert (r.ranges, r.attempt, r.reason) == ([(0, 4)], 2, "not delivered")
    assert r.due <= time.monotonic()


def test_a_consumer_gone_counts_as_a_failure_due_now():
    ledger, _ = books()
    s, other = session(), session()
    hand_out(ledger, s, 0, 2)
    hand_out(ledger, other, 2, 4)
    ledger.give_back(s)
    assert ledger.in_flight() == 2  # the other consumer's units stay out
    r = ledger.next_retry()
    assert (r.ranges, r.attempt, r.reason) == ([(0, 2)], 1, "consumer disconnected")


def test_a_seek_forgets_what_is_out_and_retried():
    ledger, changes = books()
    s = session()
    hand_out(ledger, s, 0, 10)
    ledger.settle(m.AckPartition(partition=0, nacks=[(0, 3)]), stored=10)
    changes.clear()
    ledger.seek(4)
    assert (ledger.in_flight(), ledger.retrying(), s.outstanding) == (0, 0, 0)
    assert (ledger.cursor.confirmed, ledger.next_read, ledger.seeks) == (4, 4, 1)
    assert changes


def test_a_full_record_holds_the_deliveries_out_and_a_reload_restores_them():
    ledger, _ = books()
    s = session()
    hand_out(ledger, s, 0, 6, attempt=2)
    ledger.settle(m.AckPartition(partition=0, acks=[(0, 2)]), stored=6)
    state = ledger.state(full=True)
    assert state.full and state.confirmed == 2
    assert [(a, b, n) for a, b, n, _ in state.retries] == [(2, 6, 2)]  # out at attempt 2: failed
    again, _ = books(**{k: getattr(state, k) for k in ("confirmed", "acked", "retries")})
    assert again.restored.pairs() == [(2, 6)] and again.next_read == 2
    r = again.next_retry()
    assert (r.ranges, r.attempt) == ([(2, 6)], 2)
