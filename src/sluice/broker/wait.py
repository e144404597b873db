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
    it back with every ``unsubscribe``."""
    woken = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    for add in subscribe:
        add(wake)
    try:
        await asyncio.wait([woken], timeout=timeout)
    finally:
        woken.cancel()
        for remove in unsubscribe:
            remove(wake)
