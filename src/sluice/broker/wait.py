"""Waiting on the event loop, cancellation-safe."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds passed.  (``asyncio.wait_for``
    on 3.11 can swallow a cancellation that arrives as the event is set, and a loop
    around it then never ends.)"""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([waiter], timeout=timeout)
    finally:
        waiter.cancel()


async def until_woken(
    subscribe: Iterable[Callable[[Callable[[], None]], None]],
    unsubscribe: Iterable[Callable[[Callable[[], None]], None]],
    timeout: float,
) -> None:
    """A long poll's wait: hand one wake-up callback to every ``subscribe`` (a partition's
    ``add_waiter``, say), return when one calls it or ``timeout`` seconds passed, and take
    it back with every ``unsubscribe``.  A cancellation of the waiting task is raised, also
    one that arrives as it is woken.

    The task awaits ``woken`` itself, not ``asyncio.wait`` over it: a wake-up resumes it on
    the loop's next turn, where ``asyncio.wait`` takes one turn more (a tailing consumer's
    fetch is answered that much sooner)."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    timer = loop.call_later(timeout, wake)
    for add in subscribe:
        add(wake)
    try:
        await woken
    finally:
        timer.cancel()
        for remove in unsubscribe:
            remove(wake)
