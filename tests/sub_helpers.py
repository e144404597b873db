"""Helpers of the subscription tests (``from sub_helpers import ...``): topics, produced
values, subscription descriptions, taking messages, waiting for a condition."""

from __future__ import annotations

import asyncio
import time

from sluice.client import Admin, Producer, Subscriber
from sluice.harness import eventually

FAST = dict(backoff_initial_ms=0)  # redeliver failures at once (tests about other delays set theirs)
NEVER_MS = 600_000  # an ack timeout no test waits for


async def take(sub: Subscriber, n: int, timeout: float = 30.0) -> list:
    """The next ``n`` messages (fails if they do not come within ``timeout`` s)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        msg = await sub.get(timeout=max(0.0, deadline - time.monotonic()))
        assert msg is not None, f"got {len(out)} of {n} messages: {[m.value for m in out]}"
        out.append(msg)
    return out


async def nothing_more(sub: Subscriber, wait: float = 0.5) -> None:
    msg = await sub.get(timeout=wait)
    assert msg is None, f"unexpected {msg!r} {msg.value!r}"


async def make_topic(bootstrap: str, name: str = "orders", partitions: int = 1) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(name, partitions=partitions)


async def produce(bootstrap: str, topic: str, per_partition: int, partitions: int = 1, *,
                  chunk: int = 10, prefix: str = "m") -> dict[bytes, int]:
    """``per_partition`` values into each partition in batches of ``chunk``; value ->
    partition.  Values are ``<prefix>-<partition>-<seq>`` (seq zero-padded, so they sort
    in offset order)."""
    out: dict[bytes, int] = {}
    async with Producer(bootstrap, linger_ms=1) as p:
        futures = []
        for p_ in range(partitions):
            values = [f"{prefix}-{p_}-{i:06d}".encode() for i in range(per_partition)]
            out.update((v, p_) for v in values)
            for i in range(0, per_partition, chunk):
                futures.append(await p.send_many(topic, values[i:i + chunk], partition=p_))
        await asyncio.gather(*futures)
    return out


async def describe(bootstrap: str, topic: str, name: str):
    async with Admin(bootstrap) as admin:
        return await admin.describe_subscription(topic, name)


async def wait_for(check, what: str, timeout: float = 30.0, every: float = 0.05):
    """Poll ``await check()`` until it returns something true; fail after ``timeout`` s
    (``sluice.harness.eventually``)."""
    return await eventually(check, timeout, what, interval=every)


async def settled(bootstrap: str, topic: str, name: str, timeout: float = 30.0):
    """Wait until the subscription has nothing left (backlog, in flight, retrying all 0)
    on every partition; returns the descriptions."""
    last = []

    async def check():
        infos = last[:] = await describe(bootstrap, topic, name)
        done = all(i.backlog == 0 and i.in_flight == 0 and i.retrying == 0 for i in infos)
        return infos if done else None

    try:
        return await wait_for(check, f"{topic}/{name} to be settled", timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {last}") from None
