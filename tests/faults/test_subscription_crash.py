"""Subscriptions across broker SIGKILLs: every message ends acked, and only messages whose
ack was not yet durable (acked just before a kill) or that were in flight come again.

The consumer acks out of order (a shuffled pool of held messages, some nacked) while the
broker is killed twice mid-consumption and restarted on the same data directory.  Cursor
records are group-committed (broker/subscriptions/store.py ``FLUSH_S``), so a kill loses at
most the acks of the last moments: those messages are delivered again, never lost.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict

import pytest

from sluice.client import Admin
from sluice.client.subscriber import Subscriber
from sluice.protocol.subscriptions import SNAPSHOT_KEY, SubscriptionConfig
from sub_helpers import describe, make_topic, produce, wait_for

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 3
PER_PARTITION = 6_667  # 20,001 messages
KILLS_AT = (0.3, 0.65)  # fractions of the messages acked
ACK_WINDOW_S = 2.0  # an ack this long before a kill may not be durable yet (flushes every 10 ms)


async def test_acks_survive_broker_kills(broker_factory):
    rng = random.Random(20261126)
    b = broker_factory().start()
    bs = b.bootstrap
    await make_topic(bs, "orders", PARTITIONS)
    values = await produce(bs, "orders", PER_PARTITION, PARTITIONS, chunk=100)
    total = len(values)
    # deliveries and settlements per value, in order: ("deliver" | "ack" | "nack", monotonic time)
    events: dict[bytes, list[tuple[str, float]]] = defaultdict(list)
    acked: set[bytes] = set()
    kills: list[tuple[float, float]] = []  # (killed at, listening again at)
    restarting: asyncio.Task | None = None

    async def kill_and_restart() -> None:
        killed = time.monotonic()
        await asyncio.to_thread(b.kill)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(b.start)
        kills.append((killed, time.monotonic()))

    cfg = SubscriptionConfig(ack_timeout_ms=120_000, backoff_initial_ms=50, backoff_max_ms=200)
    sub = Subscriber(bs, "orders", "work", config=cfg, prefetch=1000, request_timeout_ms=5000)
    await sub.start()
    pool: list = []
    next_kill = 0
    deadline = time.monotonic() + 180
    try:
        while len(acked) < total or pool:
            assert time.monotonic() < deadline, f"acked {len(acked)} of {total}"
            msgs = await sub.getmany(500, timeout=0.2)
            now = time.monotonic()
            for m in msgs:
                events[m.value].append(("deliver", now))
            pool.extend(msgs)
            rng.shuffle(pool)
            cut = len(pool) // 2 if msgs else len(pool)  # hold half back: acks land out of order
            settle, pool = pool[:cut], pool[cut:]
            for m in settle:
                if m.attempt == 1 and rng.random() < 0.03:
                    m.nack(delay_ms=rng.choice([0, 20, None]), reason="flaky")
                    events[m.value].append(("nack", now))
                else:
                    m.ack()
                    events[m.value].append(("ack", now))
                    acked.add(m.value)
            if next_kill < len(KILLS_AT) and len(acked) >= KILLS_AT[next_kill] * total and restarting is None:
                restarting = asyncio.ensure_future(kill_and_restart())
                next_kill += 1
            if restarting is not None and restarting.done():
                await restarting
                restarting = None
        while pool or not (infos := await settled_now(bs)):  # copies still held or still coming
            for m in pool:
                m.ack()
            pool = await sub.getmany(500, timeout=0.2)
            await sub.flush()
    finally:
        await sub.close()
        if restarting is not None:
            await restarting
    assert len(kills) == len(KILLS_AT)
    assert set(values) == acked  # every message ended acked: none lost
    for i in infos:
        assert i.confirmed == i.high_watermark and i.dead_lettered == 0 and i.expired == 0, i

    # every delivery after the first is explained: a nack, or a kill that lost its ack or
    # caught it in flight
    after_nack = 0
    after_ack: list[float] = []  # how long before the kill each lost ack was made
    in_flight = 0  # not settled when the broker was killed (settled after it, or not at all)
    unexplained = []
    for value, evs in events.items():
        previous: tuple[str, float] | None = None
        delivered_at = None
        for kind, at in evs:
            if kind != "deliver":
                previous = (kind, at)
                continue
            if delivered_at is not None:
                crossed = [k for k in kills if delivered_at <= k[1] and at >= k[0]]
                if previous is not None and previous[0] == "nack":
                    after_nack += 1
                elif not crossed:
                    unexplained.append((value, evs))
                elif previous is None or previous[1] >= crossed[0][0]:
                    in_flight += 1  # delivered, not settled when the broker died
                else:
                    killed = crossed[0][0]
                    after_ack.append(killed - previous[1])
                    if previous[1] < killed - ACK_WINDOW_S:
                        unexplained.append((value, evs))
            delivered_at = at
            previous = None
    redelivered = sum(1 for evs in events.values() if sum(k == "deliver" for k, _ in evs) > 1)
    print(
        f"\n{total} messages, {len(kills)} kills: {redelivered} delivered more than once "
        f"({after_nack} redeliveries after a nack, {len(after_ack)} after an ack lost to a kill "
        f"(made up to {max(after_ack, default=0) * 1000:.0f} ms before it), {in_flight} not settled at a kill)"
    )
    assert not unexplained, unexplained[:5]

    # the cursor is durable: after a clean restart nothing comes again
    assert b.stop() == 0
    b.start()
    async with Subscriber(bs, "orders", "work", create=False) as again:
        msg = await again.get(timeout=1.0)
        assert msg is None, msg
    infos = await describe(bs, "orders", "work")
    assert all(i.backlog == 0 for i in infos), infos


async def settled_now(bs: str):
    """The descriptions if nothing is left to deliver or settle; None otherwise."""
    infos = await describe(bs, "orders", "work")
    return infos if all(i.backlog == 0 and i.in_flight == 0 and i.retrying == 0 for i in infos) else None


@pytest.mark.parametrize("delay_ms", [0, 20])
async def test_a_nack_of_a_delivery_from_before_a_restart_fails_no_later_one(broker_factory, delay_ms):
    """A message the broker lost track of in a restart comes again; a nack of the copy
    from before the restart then belongs to the delivery the broker lost, and must not
    fail the new one, which the application may be working on (a third copy would come)."""
    b = broker_factory().start()
    bs = b.bootstrap
    await make_topic(bs, "orders")
    await produce(bs, "orders", 1)
    cfg = SubscriptionConfig(ack_timeout_ms=120_000, backoff_initial_ms=0)
    sub = Subscriber(bs, "orders", "work", config=cfg, request_timeout_ms=5000)
    await sub.start()
    try:
        first = await sub.get(timeout=10)
        assert first is not None and first.attempt == 1
        b.kill()
        b.start()
        again = await sub.get(timeout=10)
        assert again is not None and again.offset == first.offset
        first.nack(delay_ms=delay_ms)  # the slow handler of the first copy gives up
        await sub.flush()
        more = await sub.getmany(10, timeout=1.0)
        assert more == [], more
        again.ack()
        await sub.flush()
    finally:
        await sub.close()
    infos = await describe(bs, "orders", "work")
    assert all(i.confirmed == i.high_watermark and i.backlog == 0 for i in infos), infos


@pytest.mark.parametrize("mode", ["unordered", "ordered"])
async def test_a_retry_out_when_a_snapshot_is_written_keeps_its_attempt_count_across_a_kill(broker_factory, mode):
    """A snapshot replaces the journal of retries; the delivery out at attempt 3 when one is
    written must come back after a crash as attempt 4 (it counts as failed, as when its
    consumer goes), not as a new message at attempt 1 with ``max_attempts`` out of reach."""
    b = broker_factory().start()
    bs = b.bootstrap
    async with Admin(bs) as admin:
        await admin.create_topic("orders", config={"segment.bytes": "1024"})
    await produce(bs, "orders", 1)
    segments = b.data_dir / "logs" / "orders-0"
    cfg = SubscriptionConfig(mode=mode, ack_timeout_ms=120_000, backoff_initial_ms=0, max_attempts=10)
    sub = Subscriber(bs, "orders", "work", config=cfg, request_timeout_ms=5000)
    await sub.start()
    try:
        for attempt in (1, 2):
            m = await sub.get(timeout=10)
            assert (m.offset, m.attempt) == (0, attempt)
            m.nack(delay_ms=0)
        third = await sub.get(timeout=10)
        assert (third.offset, third.attempt) == (0, 3)  # held: out when the snapshot is written
        before = {p.name for p in segments.glob("*.log")}
        await produce(bs, "orders", 3, prefix="x" * 600)  # rolls a segment: a snapshot is due

        async def snapshot_written():
            return any(SNAPSHOT_KEY in p.read_bytes() for p in segments.glob("*.log") if p.name not in before)

        await wait_for(snapshot_written, "a subscription snapshot in a new segment")
        b.kill()
        b.start()
        seen = {}
        while 0 not in seen:
            got = await sub.get(timeout=30)
            assert got is not None, seen
            seen.setdefault(got.offset, got.attempt)
        assert seen[0] == 4, seen
    finally:
        await sub.close()
