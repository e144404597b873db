"""Key-ordered delivery, tag filters and delayed messages, against real broker processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from sluice.client import Admin, Consumer, DelayedProducer, Producer, Subscriber
from sluice.harness import freeze
from sluice.protocol.subscriptions import TAG_HEADER, SubscriptionConfig
from sub_helpers import NEVER_MS, describe, make_topic, wait_for

pytestmark = pytest.mark.timeout(120)



async def test_key_ordered_parks_only_the_failing_key(broker):
    """k0's first message always fails: k0 waits (backoff 400 ms, three attempts, then the
    dead-letter topic) while k1-k3 flow; no key ever has two messages out at once; each
    key's messages come in offset order."""
    bs = broker.bootstrap
    await make_topic(bs)
    keys = [b"k0", b"k1", b"k2", b"k3"]
    async with Producer(bs, linger_ms=1) as p:
        futures = [await p.send("orders", b"%s-%02d" % (keys[i % 4], i // 4), key=keys[i % 4]) for i in range(40)]
        await asyncio.gather(*futures)
    config = SubscriptionConfig(mode="key-ordered", max_attempts=3, ack_timeout_ms=NEVER_MS, backoff_initial_ms=400)
    sub = Subscriber(bs, "orders", "work", config=config)
    firsts: dict[bytes, list[bytes]] = {k: [] for k in keys}
    out: dict[bytes, int] = {}
    events = []
    try:
        await sub.start()
        held: list = []
        while sum(map(len, firsts.values())) < 39:  # every message but the failing one
            for m in await sub.getmany(100, timeout=0.1):
                assert out.get(m.key, 0) == 0, f"two messages of key {m.key!r} out at once"
                out[m.key] = 1
                events.append((time.monotonic(), m.key, m.value, m.attempt))
                held.append(m)
            await asyncio.sleep(0.05)  # hold them a while: the broker must not send more of a key
            for m in held:
                out[m.key] = 0
                if m.value == b"k0-00":
                    m.nack(reason="always fails")
                else:
                    firsts[m.key].append(m.value)
                    m.ack()
            held = []
        await sub.flush()
        infos = await wait_for(
            lambda: _settled(bs), "the failing message to be dead-lettered and the rest settled", 30
        )
    finally:
        await sub.close()
    for k in keys:
        assert firsts[k] == sorted(firsts[k]), (k, firsts[k])
    assert len(firsts[b"k0"]) == 9 and all(len(firsts[k]) == 10 for k in keys[1:])
    assert infos[0].dead_lettered == 1
    # the other keys finished while k0 was parked behind its failing message
    others_done = max(t for t, k, _, _ in events if k != b"k0")
    k0_next = min(t for t, k, v, _ in events if v == b"k0-01")
    assert others_done < k0_next
    assert [a for _, _, v, a in events if v == b"k0-00"] == [1, 2, 3]


async def _settled(bs: str):
    infos = await describe(bs, "orders", "work")
    return infos if all(i.backlog == 0 and i.in_flight == 0 and i.retrying == 0 and i.waiting == 0
                        for i in infos) else None


@pytest.mark.parametrize("mode", ["ordered", "key-ordered"])
async def test_a_message_failing_its_last_attempt_is_dead_lettered_without_another_backoff(broker, mode):
    """The last failed attempt goes to the dead-letter topic at once: the messages behind
    it (ordered: the partition's; key-ordered: its key's) do not wait one more backoff."""
    bs = broker.bootstrap
    await make_topic(bs)
    async with Producer(bs, linger_ms=1) as p:
        await asyncio.gather(*[await p.send("orders", b"m%d" % i, key=b"k") for i in range(3)])
    config = SubscriptionConfig(mode=mode, max_attempts=3, ack_timeout_ms=NEVER_MS,
                                backoff_initial_ms=1000, backoff_max_ms=1000)
    async with Admin(bs) as admin:
        await admin.create_topic("orders.work.dlq")  # not timed: created before the first failure
    async with Subscriber(bs, "orders", "work", config=config) as sub:
        for attempt in (1, 2, 3):
            msg = await sub.get(timeout=10)
            assert (msg.value, msg.attempt) == (b"m0", attempt)
            msg.nack()
        failed_at = time.monotonic()
        msg = await sub.get(timeout=10)
        waited = time.monotonic() - failed_at
        assert msg.value == b"m1" and waited < 0.8, (msg, waited)  # not the 1 s backoff again
        msg.ack()


async def test_tag_filter_delivers_only_its_tags_and_counts_the_rest_acked(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    async with Producer(bs, linger_ms=1) as p:
        futures = []
        for i in range(30):
            tag = [b"red", b"blue", None][i % 3]
            headers = [(TAG_HEADER, tag)] if tag else []
            futures.append(await p.send("orders", b"%02d" % i, headers=headers))
        await asyncio.gather(*futures)
    got = []
    async with Subscriber(bs, "orders", "blues", tags=["blue"]) as sub:
        while len(got) < 10:
            m = await sub.get(timeout=10)
            assert m is not None, f"only {got} arrived"
            assert m.tag == "blue"
            got.append(int(m.value))
            m.ack()
        assert await sub.get(timeout=0.5) is None
        await sub.flush()
    assert got == list(range(1, 30, 3))
    infos = await wait_for(lambda: _settled_named(bs, "blues"), "the filtered subscription to be settled", 10)
    assert infos[0].confirmed == infos[0].high_watermark


async def _settled_named(bs: str, name: str):
    infos = await describe(bs, "orders", name)
    return infos if all(i.backlog == 0 and i.in_flight == 0 for i in infos) else None


async def test_delayed_messages_are_invisible_until_due_then_delivered_in_time_order(broker):
    bs = broker.bootstrap
    await make_topic(bs, partitions=2)
    now = int(time.time() * 1000)
    late, early = now + 2500, now + 1500
    async with DelayedProducer(bs) as producer:
        await producer.send_delayed("orders", [(b"a", b"%d" % late, []), (b"a", b"%d" % late, [])],
                                    deliver_at_ms=late)
        await producer.send_delayed("orders", [(b"b", b"%d" % early, [])], deliver_at_ms=early)
    consumer = Consumer(bs, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([("orders", 0), ("orders", 1)])
    await consumer.start()
    try:
        assert await consumer.getmany(timeout_ms=300) == []  # stored, not visible yet
    finally:
        await consumer.close()
    arrived = []
    async with Subscriber(bs, "orders", "work") as sub:
        while len(arrived) < 3:
            m = await sub.get(timeout=15)
            assert m is not None, f"only {arrived} delivered"
            arrived.append((time.time() * 1000, int(m.value), m.header("sluice.deliver_at")))
            m.ack()
    for received, due, header in arrived:
        assert received >= due, "delivered before its time"
        assert received - due < 5000  # a generous bound: the goal (100 ms) is measured by D1
        assert header == str(due).encode()
    assert [due for _, due, _ in arrived] == [early, late, late]


async def test_delayed_messages_falling_due_together_are_delivered_in_due_order(broker):
    """300 delayed messages, each its own batch, stored in shuffled order and all due while
    the broker is stopped: they come out of one partition in due order (their commits read
    the halves in parallel, and queue the copies in order)."""
    bs = broker.bootstrap
    order = list(range(300))
    random.Random(7).shuffle(order)
    margin = 3.0
    for attempt in range(4):
        # All must be stored before the first falls due (one stored after a later one was
        # delivered comes after it): leave ``margin`` times what 10 sends take, per send,
        # ahead; a machine slower than that meanwhile tries again on a new topic.
        topic = f"orders-{attempt}"
        await make_topic(bs, topic)
        async with DelayedProducer(bs) as producer:
            t0 = time.monotonic()
            for _ in range(10):  # due in an hour: never delivered during the test
                await producer.send_delayed(topic, [(None, b"x", [])], delay_ms=3_600_000)
            per_send_ms = (time.monotonic() - t0) * 100
            base = int(time.time() * 1000) + int(max(1000.0, margin * 300 * per_send_ms))
            for i in order:
                await producer.send_delayed(topic, [(None, b"%d" % i, [])], deliver_at_ms=base + i)
        if time.time() * 1000 < base:
            break
        margin *= 2
    else:
        raise AssertionError("four tries stored the messages too slowly to be due together")
    freeze(broker.proc.pid)
    try:
        await asyncio.sleep(max(base + 300 - time.time() * 1000, 0) / 1000 + 0.2)
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    got = []
    consumer = Consumer(bs, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([(topic, 0)])
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            got += [int(r.value) for r in await consumer.getmany(timeout_ms=500)]
    finally:
        await consumer.close()
    assert got == list(range(300))


async def test_delayed_messages_survive_a_kill_of_the_broker(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    due = int(time.time() * 1000) + 2000
    async with DelayedProducer(bs) as producer:
        await producer.send_delayed("orders", [(None, b"later", [])], deliver_at_ms=due)
    broker.kill()
    broker.start()
    async with Subscriber(bs, "orders", "work") as sub:
        m = await sub.get(timeout=20)
        assert m is not None and m.value == b"later"
        assert time.time() * 1000 >= due
        m.ack()
        assert await sub.get(timeout=0.5) is None  # delivered once


async def test_send_delayed_refuses_times_out_of_range(broker):
    from sluice.errors import ConfigError

    bs = broker.bootstrap
    await make_topic(bs)
    async with DelayedProducer(bs) as producer:
        with pytest.raises(ConfigError, match="within 30 days"):
            await producer.send_delayed("orders", [(None, b"x", [])], delay_ms=31 * 24 * 3600 * 1000)
        with pytest.raises(ConfigError, match="one of"):
            await producer.send_delayed("orders", [(None, b"x", [])])
