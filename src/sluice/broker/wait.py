"""Waiting on the event loop, cancellation-safe."""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds passed.  (``asyncio.wait_for``
    on 3.11 can swallow a cancellation that arrives as the event is set, and a loop
    around it then never ends.)"""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([waiter], timeout=timeout)
    finally:
        waiter.cancel()
