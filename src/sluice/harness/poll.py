"""Waiting for a condition: poll it until it holds or a deadline passes.

``eventually`` (from a coroutine) and ``wait_until`` (from plain code) share one contract:
call ``check()`` until it returns something truthy and return that; after ``timeout``
seconds raise ``NotReached`` naming ``what``.  Errors of the kinds in ``ignore`` count as
"not yet" (the last one is named in the failure); any other error ends the wait.  The
check runs at least once, also with a timeout of 0.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


class NotReached(AssertionError):
    """A polled condition did not hold in time (an ``AssertionError``: in a test, a failure)."""


class _Deadline:
    def __init__(self, timeout: float, what: str, ignore: tuple[type[BaseException], ...]) -> None:
        self.timeout, self.what, self.ignore = timeout, what, ignore
        self.at = time.monotonic() + timeout
        self.last: BaseException | None = None

    def check_passed(self) -> None:
        if time.monotonic() > self.at:
            said = f" (last error: {self.last!r})" if self.ignore else ""
            raise NotReached(f"{self.what} not reached within {self.timeout} s{said}")


async def eventually(
    check: Callable[[], Any], timeout: float = 10, what: str = "the condition", *,
    interval: float = 0.05, ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``check()`` (sync or async) every ``interval`` s until it returns something
    truthy, and return that (see the module's contract).  Event loop only."""
    deadline = _Deadline(timeout, what, ignore)
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except ignore as exc:
            result, deadline.last = None, exc
        if result:
            return result
        deadline.check_passed()
        await asyncio.sleep(interval)


def wait_until(
    check: Callable[[], Any], timeout: float = 10, what: str = "the condition", *,
    interval: float = 0.05, ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """``eventually`` for code without an event loop: blocks, sleeping ``interval`` s
    between calls of the sync ``check``."""
    deadline = _Deadline(timeout, what, ignore)
    while True:
        try:
            result = check()
        except ignore as exc:
            result, deadline.last = None, exc
        if result:
            return result
        deadline.check_passed()
        time.sleep(interval)
