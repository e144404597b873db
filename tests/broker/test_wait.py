"""``until_woken``: a long poll's wait returns on a wake-up or at its timeout, always takes
its callback back, and never swallows a cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.broker.wait import until_woken


class Waiters:
    """A partition's waiter list, as ``add_waiter`` / ``remove_waiter`` keep it."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def add(self, cb) -> None:
        self.callbacks.append(cb)

    def remove(self, cb) -> None:
        if cb in self.callbacks:
            self.callbacks.remove(cb)

    def wake_all(self) -> None:
        for cb in list(self.callbacks):
            cb()


def start(*parts: Waiters, timeout: float = 30.0) -> asyncio.Task:
    return asyncio.ensure_future(
        until_woken([p.add for p in parts], [p.remove for p in parts], timeout)
    )


async def test_a_wake_up_returns_on_the_next_turn_and_every_callback_is_taken_back():
    a, b = Waiters(), Waiters()
    task = start(a, b)
    await asyncio.sleep(0)
    assert len(a.callbacks) == len(b.callbacks) == 1
    b.wake_all()
    await asyncio.sleep(0)  # one turn of the loop: asyncio.wait would take two
    assert task.done() and task.result() is None
    assert a.callbacks == b.callbacks == []


async def test_without_a_wake_up_it_returns_at_its_timeout():
    a = Waiters()
    t0 = time.monotonic()
    await until_woken([a.add], [a.remove], 0.05)
    assert time.monotonic() - t0 >= 0.045
    assert a.callbacks == []


async def test_a_late_or_repeated_wake_up_is_harmless():
    a = Waiters()
    task = start(a)
    await asyncio.sleep(0)
    cb = a.callbacks[0]
    cb()
    cb()
    await task
    cb()  # after it returned


async def test_a_cancellation_while_waiting_is_raised_and_the_callback_taken_back():
    a = Waiters()
    task = start(a)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert a.callbacks == []


async def test_a_cancellation_arriving_with_the_wake_up_is_not_swallowed():
    a = Waiters()
    task = start(a)
    await asyncio.sleep(0)
    a.wake_all()
    task.cancel()  # before the task resumes from its wake-up
    with pytest.raises(asyncio.CancelledError):
        await task
    assert a.callbacks == []
