"""The delayed-delivery loop wakes at the earliest delivery time it knows, looking at
least every ``TICK_S`` for halves stored meanwhile."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from sluice.broker.transactions import delays
from sluice.broker.transactions.delays import DelayedDelivery


def delivery(*states) -> DelayedDelivery:
    txns = SimpleNamespace(states={("t", i): st for i, st in enumerate(states)})
    return DelayedDelivery(txns)


def state(*times: int, current: bool = True):
    return SimpleNamespace(due=sorted((at, i) for i, at in enumerate(times)), current=current)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_nothing_due_looks_again_after_a_tick():
    assert delivery()._wait() == delays.TICK_S
    assert delivery(state())._wait() == delays.TICK_S


def test_wakes_at_the_earliest_delivery_time_of_the_partitions_led_here(monkeypatch):
    now = 1_700_000_000_000
    monkeypatch.setattr(delays, "time", SimpleNamespace(time=lambda: now / 1000, monotonic=time.monotonic))
    led = delivery(state(now + 60_000), state(now + 4, now + 8), state(now - 1000, current=False))
    assert led._wait() == pytest.approx(0.0045)


@pytest.mark.parametrize("ahead_ms", [-5_000, -1, 0])
def test_a_due_half_is_looked_at_within_a_millisecond_never_in_a_busy_loop(ahead_ms):
    assert delivery(state(now_ms() + ahead_ms))._wait() == delays.MIN_WAIT_S


def test_a_far_delivery_time_still_looks_every_tick():
    assert delivery(state(now_ms() + 3_600_000))._wait() == delays.TICK_S
