"""sluice.harness.poll: ``eventually`` and ``wait_until`` return the first truthy result,
fail with ``NotReached`` (an AssertionError) after the timeout, and treat only the errors
they are told to ignore as "not yet"."""

from __future__ import annotations

import time

import pytest

from sluice.harness import NotReached, eventually, wait_until


def _counter(truthy_from: int, value="done"):
    calls = []

    def check():
        calls.append(1)
        return value if len(calls) >= truthy_from else None

    return check, calls


async def test_eventually_returns_the_first_truthy_result_of_a_sync_or_async_check():
    check, calls = _counter(3)
    assert await eventually(check, 5, interval=0.001) == "done"
    assert len(calls) == 3

    async def async_check():
        return check()

    assert await eventually(async_check, 5) == "done"


async def test_eventually_fails_after_the_timeout_naming_what_it_waited_for():
    t0 = time.monotonic()
    with pytest.raises(NotReached, match="the answer not reached within 0.2 s") as info:
        await eventually(lambda: 0, 0.2, "the answer", interval=0.01)
    assert isinstance(info.value, AssertionError)
    assert time.monotonic() - t0 >= 0.2


async def test_eventually_checks_once_even_with_no_time():
    assert await eventually(lambda: 7, 0) == 7


async def test_only_the_ignored_errors_mean_not_yet():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("refused")
        return True

    assert await eventually(flaky, 5, interval=0.001, ignore=(OSError,)) is True
    with pytest.raises(ValueError):
        await eventually(lambda: int("x"), 5, ignore=(OSError,))

    def refused():
        raise OSError("still refused")

    with pytest.raises(NotReached, match="still refused"):
        await eventually(refused, 0.05, "a connection", interval=0.01, ignore=(OSError,))


def test_wait_until_is_the_same_without_a_loop():
    check, calls = _counter(2)
    assert wait_until(check, 5, interval=0.001) == "done"
    assert len(calls) == 2
    with pytest.raises(NotReached, match="nothing not reached within 0.05 s"):
        wait_until(lambda: None, 0.05, "nothing", interval=0.01)
