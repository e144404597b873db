"""Pending retries are journaled in the partition's log: after a kill -9 of the broker
every one comes back when due with its attempt count, and in key-ordered mode a restored
retry still holds its key's later messages back.  Real broker processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.client import Producer, Subscriber
from sluice.protocol.subscriptions import SubscriptionConfig
from sub_helpers import NEVER_MS, describe, make_topic, produce, wait_for

pytestmark = pytest.mark.timeout(120)



async def take(sub: Subscriber, n: int, timeout: float = 20.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"{len(out)} of {n} messages arrived"
        out += await sub.getmany(n - len(out), timeout=0.5)
    return out


async def test_every_pending_retry_survives_a_kill_with_its_attempt_and_due_time(broker):
    """1,500 scattered nacks (more than one cursor record could once hold), a kill -9,
    a restart: each of them comes back once, as attempt 2, not before it is due."""
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 3000, chunk=100)
    delay_ms = 3000
    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS, prefetch=3000) as sub:
        msgs = await take(sub, 3000)
        nacked = {m.offset for m in msgs if m.offset % 2}
        nacked_at = time.time()
        for m in msgs:
            if m.offset in nacked:
                m.nack(delay_ms=delay_ms, reason="later")
            else:
                m.ack()
        await sub.flush()
        await wait_for(lambda: _retrying(bs, len(nacked)), "the nacks to be taken")
        await asyncio.sleep(0.2)  # cursor records are group-committed every 10 ms
        broker.kill()
    broker.start()
    infos = await describe(bs, "orders", "work")
    assert infos[0].retrying == len(nacked)
    async with Subscriber(bs, "orders", "work", create=False, prefetch=3000) as sub:
        first = await sub.get(timeout=20)
        assert first is not None
        arrived = time.time()
        again = [first, *await take(sub, len(nacked) - 1)]
        for m in again:
            m.ack()
        await sub.flush()
        assert await sub.get(timeout=0.5) is None
    assert arrived >= nacked_at + delay_ms / 1000 - 0.05  # not before due (clock reads 50 ms apart)
    assert sorted(m.offset for m in again) == sorted(nacked)
    assert {m.attempt for m in again} == {2}
    assert {m.value for m in again}  # the messages themselves, not empty shells


async def _retrying(bs: str, n: int):
    infos = await describe(bs, "orders", "work")
    return infos[0].retrying == n and infos[0].in_flight == 0


async def test_key_ordered_restored_retry_still_parks_its_key(broker):
    """k0's first message is nacked for 2 s, then the broker is killed: after the restart
    k0's second message waits for the first (redelivered as attempt 2), while k1 flows."""
    bs = broker.bootstrap
    await make_topic(bs)
    async with Producer(bs, linger_ms=1) as p:
        futures = [await p.send("orders", v, key=v[:2]) for v in (b"k0-0", b"k1-0", b"k0-1", b"k1-1")]
        await asyncio.gather(*futures)
    config = SubscriptionConfig(mode="key-ordered", ack_timeout_ms=NEVER_MS, backoff_initial_ms=NEVER_MS, backoff_max_ms=NEVER_MS)
    async with Subscriber(bs, "orders", "work", config=config) as sub:
        got = {m.value: m for m in await take(sub, 2)}
        assert set(got) == {b"k0-0", b"k1-0"}
        got[b"k0-0"].nack(delay_ms=2000)
        got[b"k1-0"].ack()
        k1 = await take(sub, 1)
        assert k1[0].value == b"k1-1"
        k1[0].ack()
        await sub.flush()
        await asyncio.sleep(0.2)  # cursor records are group-committed every 10 ms
        broker.kill()
    broker.start()
    async with Subscriber(bs, "orders", "work", create=False) as sub:
        first = await take(sub, 1, timeout=20)
        assert (first[0].value, first[0].attempt) == (b"k0-0", 2)
        assert await sub.get(timeout=0.5) is None  # k0-1 waits for it
        first[0].ack()
        second = await take(sub, 1)
        assert (second[0].value, second[0].attempt) == (b"k0-1", 1)
        second[0].ack()
        await sub.flush()


async def test_at_the_acked_ranges_bound_reading_stops_and_says_why(broker):
    """Every other message acked, the rest held: at 10,000 acked ranges the broker reads
    no new message (describe's ``stalled``, a warning in its log), and once the held ones
    are acked it reads on and delivers the rest."""
    from sluice.broker.subscriptions.ledger import MAX_ACKED_RANGES

    bs = broker.bootstrap
    await make_topic(bs)
    total = 2 * MAX_ACKED_RANGES + 5000
    await produce(bs, "orders", total, chunk=500)
    # credit for the held half and 2,000 more: the broker reads as acks come back
    prefetch = MAX_ACKED_RANGES + 2000
    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS, prefetch=prefetch) as sub:
        held = []
        got = 0

        async def stalled():
            infos = await describe(bs, "orders", "work")
            return infos[0] if infos[0].stalled else None

        info = None
        while info is None:
            for m in await sub.getmany(5000, timeout=0.2):
                got += 1
                if m.offset % 2:
                    m.ack()
                else:
                    held.append(m)
            await sub.flush()
            info = await stalled()
        assert "acked ranges" in info.stalled and info.acked_ranges >= MAX_ACKED_RANGES  # + acks of what was out
        while batch := await sub.getmany(5000, timeout=0.5):  # what was on its way
            got += len(batch)
            held += batch
        assert await sub.get(timeout=0.5) is None  # nothing new while stalled
        info = (await describe(bs, "orders", "work"))[0]
        assert got < total and info.backlog == total - (got - len(held)) and info.stalled  # backlog: unacked
        assert "reads no new message until acks close gaps" in broker.log()
        for m in held:
            m.ack()
        await sub.flush()
        while got < total:
            for m in await sub.getmany(5000, timeout=1.0):
                got += 1
                m.ack()
        await sub.flush()
        info = (await describe(bs, "orders", "work"))[0]
        assert info.stalled == "" and info.acked_ranges <= 1
