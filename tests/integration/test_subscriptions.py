"""Subscriptions against real broker processes: shared and separate consumption, ack
deadlines, disconnects, nacks and backoff, ordered mode, seek, delete, describe, restarts,
close, ``run`` and the blocking subscriber (broker/subscription.py,
broker/subscriptions/, client/subscriber.py).  Dead letters and re-drive, and topics
changing under a subscription, have files of their own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from sluice.client.subscriber import Subscriber
from sluice.client.sync import SyncSubscriber
from sluice.protocol.subscriptions import SubscriptionConfig
from sub_helpers import (
    FAST,
    NEVER_MS,
    describe,
    make_topic,
    nothing_more,
    produce,
    settled,
    take,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

# --------------------------------------------------------------------------- sharing


async def test_two_subscribers_share_a_subscription_every_message_once(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 3)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", SubscriptionConfig(ack_timeout_ms=NEVER_MS))
    a = Subscriber(bs, "orders", "work", prefetch=20, create=False)
    b = Subscriber(bs, "orders", "work", prefetch=20, create=False)
    await a.start()
    await b.start()
    total = 3 * 200
    got: dict[str, list] = {"a": [], "b": []}
    b_has_one = asyncio.Event()

    async def consume(name: str, sub: Subscriber) -> None:
        held = []
        while sum(map(len, got.values())) < total:
            msg = await sub.get(timeout=0.2)
            if msg is None:
                continue
            got[name].append(msg)
            if name == "b":
                b_has_one.set()
            # a acks nothing until b has a message: a's credit runs out, so b must get some
            held.append(msg)
            if name == "b" or b_has_one.is_set():
                for h in held:
                    h.ack()
                held.clear()
        for h in held:
            h.ack()

    try:
        produced = asyncio.ensure_future(produce(bs, "orders", 200, 3))
        await asyncio.wait_for(asyncio.gather(consume("a", a), consume("b", b)), 60)
        values = await produced
        await a.flush()
        await b.flush()
        infos = await settled(bs, "orders", "work")
    finally:
        await a.close()
        await b.close()
    everything = got["a"] + got["b"]
    assert Counter(m.value for m in everything) == Counter(values.keys())  # each exactly once
    assert got["a"] and got["b"]
    assert {m.attempt for m in everything} == {1}
    assert {m.partition for m in everything} == {0, 1, 2}
    for m in everything:
        assert values[m.value] == m.partition
    assert [i.consumers for i in infos] == [2, 2, 2]


async def test_a_full_consumer_does_not_hold_up_one_with_credit(broker):
    """Several batches arrive at once; the first consumer fills up on the first: the next
    ones go to the other consumer, not wait for the first to ack."""
    bs = broker.bootstrap
    await make_topic(bs)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", SubscriptionConfig(ack_timeout_ms=NEVER_MS))
    a = Subscriber(bs, "orders", "work", prefetch=5, create=False)
    b = Subscriber(bs, "orders", "work", prefetch=5, create=False)
    await a.start()
    await b.start()
    try:
        async with Producer(bs, batch_size=300) as p:  # one request, several batches
            await (await p.send_many("orders", [b"v%03d" % i for i in range(60)], partition=0))
        got_a = await take(a, 1)
        got_b = await take(b, 1, timeout=20)  # a holds all it got, unacked
        assert {m.value for m in got_a}.isdisjoint(m.value for m in got_b)
    finally:
        await a.close()
        await b.close()


async def test_two_subscriptions_each_see_every_message(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    values = await produce(bs, "orders", 50, 2)
    seen = {}
    for name in ("billing", "audit"):
        async with Subscriber(bs, "orders", name) as sub:
            msgs = await take(sub, 100)
            for m in msgs:
                m.ack()
            await nothing_more(sub, 0.3)
        seen[name] = sorted(m.value for m in msgs)
        await settled(bs, "orders", name)
    assert seen["billing"] == seen["audit"] == sorted(values)
    async with Admin(bs) as admin:
        assert await admin.list_subscriptions("orders") == {"orders": ["audit", "billing"]}


# --------------------------------------------------------------------------- redelivery


async def test_ack_deadline_redelivers_with_attempt_two(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 3)
    before = time.monotonic()
    cfg = SubscriptionConfig(ack_timeout_ms=500, **FAST)
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        first = await take(sub, 3)
        assert [m.attempt for m in first] == [1, 1, 1]
        first[0].ack()
        first[2].ack()
        again = await take(sub, 1)
        assert time.monotonic() - before >= 0.5  # not before its ack deadline
        assert (again[0].offset, again[0].value, again[0].attempt) == (first[1].offset, first[1].value, 2)
        again[0].ack()
        await nothing_more(sub, 0.8)  # acked ones never come back, this one no more
    await settled(bs, "orders", "work")


# A consumer that takes messages, prints their offsets and never acks them (killed).
HOLDING_CONSUMER = textwrap.dedent("""
    import asyncio, sys
    from sluice.client.subscriber import Subscriber

    async def main(bootstrap, n):
        sub = Subscriber(bootstrap, "orders", "work", create=False, prefetch=n)
        await sub.start()
        for _ in range(n):
            msg = await sub.get()
            print(msg.offset, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
""")


async def test_disconnect_redelivers_at_once(broker):
    """A consumer killed holding unacked messages: they go to another consumer at once,
    long before their ack deadline."""
    bs = broker.bootstrap
    await make_topic(bs)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", SubscriptionConfig(ack_timeout_ms=NEVER_MS, **FAST))
    values = await produce(bs, "orders", 10)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDING_CONSUMER, bs, "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        held = []
        for _ in range(5):
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
            assert line, proc.stderr.read() if proc.poll() is not None else "no output"
            held.append(int(line))
        [info] = await describe(bs, "orders", "work")
        assert info.in_flight >= 5 and info.consumers == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    async with Subscriber(bs, "orders", "work", create=False) as sub:
        msgs = await take(sub, 10, timeout=20)  # the ack timeout is 10 minutes
        for m in msgs:
            m.ack()
        await nothing_more(sub, 0.3)
    assert sorted(m.value for m in msgs) == sorted(values)
    assert {m.offset for m in msgs if m.attempt == 2} >= set(held)  # those it held count as tried
    await settled(bs, "orders", "work")


async def test_nack_delay_and_backoff(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 2)
    cfg = SubscriptionConfig(ack_timeout_ms=NEVER_MS, backoff_initial_ms=400, backoff_multiplier=2.0)
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        m0, m1 = await take(sub, 2)
        # a nack with its own delay: not before it
        nacked = time.monotonic()
        m0.nack(delay_ms=300)
        [again] = await take(sub, 1)
        assert time.monotonic() - nacked >= 0.3
        assert (again.offset, again.attempt) == (m0.offset, 2)
        again.ack()
        # nacks without a delay: the subscription's backoff, 400 ms then 800 ms
        waits = []
        msg = m1
        for attempt in (1, 2):
            nacked = time.monotonic()
            msg.nack()
            [msg] = await take(sub, 1)
            waits.append(time.monotonic() - nacked)
            assert (msg.offset, msg.attempt) == (m1.offset, attempt + 1)
        assert waits[0] >= 0.4 and waits[1] >= 0.8, waits
        msg.ack()
        await nothing_more(sub, 0.3)
    await settled(bs, "orders", "work")


# --------------------------------------------------------------------------- ordered


async def test_ordered_mode_keeps_order_under_nacks(broker):
    bs = broker.bootstrap
    n = 40
    await make_topic(bs, "orders", 3)
    values = await produce(bs, "orders", n, 3, chunk=7)
    cfg = SubscriptionConfig(mode="ordered", ack_timeout_ms=NEVER_MS, **FAST)
    acked: dict[int, list[int]] = defaultdict(list)  # partition -> offsets in the order processed
    first_values: dict[int, list[bytes]] = defaultdict(list)
    offsets: dict[int, list[int]] = defaultdict(list)
    nacked = 0
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        # one message of each partition held unsettled: nothing more is handed out
        held = await take(sub, 3)
        assert sorted((m.partition, m.offset) for m in held) == [(0, 0), (1, 0), (2, 0)]
        await nothing_more(sub, 0.5)
        while sum(map(len, acked.values())) < 3 * n:
            [msg] = [held.pop(0)] if held else await take(sub, 1)
            p = msg.partition
            # a later message never before an earlier one is acked
            done = acked[p]
            assert not offsets[p] or msg.offset == offsets[p][-1] or msg.offset > offsets[p][-1], msg
            assert msg.offset not in done, f"{msg!r} acked already"
            expected = None if not offsets[p] else offsets[p][-1]
            if expected is not None and expected not in done:
                assert msg.offset == expected, f"{msg!r} while {expected} not acked"
            offsets[p].append(msg.offset)
            if msg.attempt == 1 and len(offsets[p]) % 5 == 0:
                msg.nack(reason="try again")
                nacked += 1
                continue
            done.append(msg.offset)
            first_values[p].append(msg.value)
            msg.ack()
        await nothing_more(sub, 0.3)
    assert nacked >= 3
    for p in range(3):
        assert acked[p] == sorted(acked[p])
        assert first_values[p] == sorted(v for v, part in values.items() if part == p)
    await settled(bs, "orders", "work")


@pytest.mark.parametrize("chunk", [10, 1], ids=["one-batch", "a-batch-each"])
async def test_ordered_mode_a_nack_counts_for_the_nacked_message_only(broker, chunk):
    """Offsets 2 and 3 fail once each, max_attempts=2: each is redelivered once and then
    acked; the messages behind a nacked one come after its redelivery, at their first
    attempt, whether they share its stored batch or not; nothing is dead-lettered."""
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 10, chunk=chunk)
    # a backoff: the messages behind a nacked one must wait for its redelivery, not pass it
    cfg = SubscriptionConfig(mode="ordered", max_attempts=2, ack_timeout_ms=NEVER_MS, backoff_initial_ms=300)
    log = []
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        while len(log) < 12:
            [msg] = await take(sub, 1)
            log.append((msg.offset, msg.attempt))
            if msg.offset in (2, 3) and msg.attempt == 1:
                msg.nack()
            else:
                msg.ack()
        await nothing_more(sub, 0.3)
    assert log == [(0, 1), (1, 1), (2, 1), (2, 2), (3, 1), (3, 2), *((o, 1) for o in range(4, 10))]
    [info] = await settled(bs, "orders", "work")
    assert info.dead_lettered == 0


async def test_prefetch_bounds_the_messages_out_inside_a_large_batch(broker):
    """2000 messages in one stored batch, prefetch 10: never more than 10 out to the
    consumer, new or redelivered (a consumer that closed with 999 unsettled hands them
    back as one retry); each comes once, at its first attempt."""
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 2000, chunk=2000)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", SubscriptionConfig(ack_timeout_ms=NEVER_MS))
    first = Subscriber(bs, "orders", "work", prefetch=1000, create=False)
    async with first:
        [msg] = await take(first, 1)
        await wait_for(lambda: _in_flight(bs, 1000), "1000 messages out to the first consumer")
        msg.ack()
    # closed with 999 unsettled that the application did not take: handed back as one
    # retry, redelivered at once, the attempt not counted
    got = []
    sub = Subscriber(bs, "orders", "work", prefetch=10, create=False)
    async with sub, Admin(bs) as admin:
        [held] = await take(sub, 1)
        got.append((held.offset, held.attempt))
        await asyncio.sleep(0.3)  # a whole batch would be out by now
        [info] = await admin.describe_subscription("orders", "work")
        assert info.in_flight == 10, info
        held.ack()
        while len(got) < 1999:
            for msg in await sub.getmany(100, timeout=5):
                got.append((msg.offset, msg.attempt))
                msg.ack()
            [info] = await admin.describe_subscription("orders", "work")
            assert info.in_flight <= 10, info
    assert sorted(got) == [(o, 1) for o in range(1, 2000)]
    await settled(bs, "orders", "work")


async def _in_flight(bs: str, n: int) -> bool:
    [info] = await describe(bs, "orders", "work")
    assert info.in_flight <= n, info
    return info.in_flight == n


# --------------------------------------------------------------------------- seek


async def test_seek_to_earliest_and_to_a_time_replays(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    early = await produce(bs, "orders", 5, prefix="early")
    await asyncio.sleep(0.02)
    middle_ms = int(time.time() * 1000)
    await asyncio.sleep(0.02)
    late = await produce(bs, "orders", 5, prefix="late")
    everything = sorted([*early, *late])
    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS) as sub, Admin(bs) as admin:
        msgs = await take(sub, 10)
        for m in msgs:
            m.ack()
        await sub.flush()
        assert sorted(m.value for m in msgs) == everything
        await settled(bs, "orders", "work")

        await admin.seek_subscription("orders", "work", "earliest")
        again = await take(sub, 10)
        assert sorted(m.value for m in again) == everything
        assert {m.attempt for m in again} == {1}
        for m in again:
            m.ack()
        await sub.flush()
        await settled(bs, "orders", "work")

        await admin.seek_subscription("orders", "work", f"time:{middle_ms}")
        replay = await take(sub, 5)
        assert sorted(m.value for m in replay) == sorted(late)
        for m in replay:
            m.ack()
        await nothing_more(sub, 0.5)

    # with no consumer attached: back to the start, then to the end, skipping everything
    async with Admin(bs) as admin:
        await admin.seek_subscription("orders", "work", "earliest")
        [info] = await describe(bs, "orders", "work")
        assert info.confirmed == 0 and info.backlog >= 10
        await admin.seek_subscription("orders", "work", "latest")
    await settled(bs, "orders", "work")
    async with Subscriber(bs, "orders", "work", create=False) as sub:
        await nothing_more(sub, 0.5)


async def test_seek_while_acks_are_written_replays_everything(broker):
    """A seek landing while the partition's pump reads (the cursor record the last acks
    wrote, say) replays from the seek's offset: nothing below the read is skipped."""
    bs = broker.bootstrap
    await make_topic(bs)
    values = await produce(bs, "orders", 20, chunk=5)
    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS) as sub, Admin(bs) as admin:
        for round_ in range(25):
            msgs = await take(sub, 20, timeout=20)
            assert sorted(m.value for m in msgs) == sorted(values), round_
            for m in msgs:
                m.ack()
            await sub.flush()  # the broker writes the cursor within 10 ms: seek meanwhile
            await asyncio.sleep(round_ % 5 * 0.003)
            await admin.seek_subscription("orders", "work", "earliest")


# --------------------------------------------------------------------------- delete


async def test_delete_ends_a_live_subscriber(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    await produce(bs, "orders", 1, 2)
    sub = Subscriber(bs, "orders", "work")
    await sub.start()
    try:
        for m in await take(sub, 2):
            m.ack()
        await sub.flush()
        async with Admin(bs) as admin:
            await admin.delete_subscription("orders", "work")
            with pytest.raises(errors.UnknownSubscription):
                await sub.get(timeout=20)
            with pytest.raises(errors.UnknownSubscription):
                await admin.describe_subscription("orders", "work")
            with pytest.raises(errors.UnknownSubscription):
                await admin.delete_subscription("orders", "work")
            assert await admin.list_subscriptions("orders") == {"orders": []}
    finally:
        await sub.close()
    # a subscriber that will not create it fails at start
    with pytest.raises(errors.UnknownSubscription):
        await Subscriber(bs, "orders", "work", create=False).start()


# --------------------------------------------------------------------------- describe


async def test_describe_counts(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 10)
    cfg = SubscriptionConfig(ack_timeout_ms=NEVER_MS)
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        msgs = await take(sub, 10)
        for m in msgs[:3]:
            m.ack()
        msgs[5].ack()
        for m in msgs[6:8]:
            m.nack(delay_ms=NEVER_MS)
        await sub.flush()

        async def counts():
            [i] = await describe(bs, "orders", "work")
            got = (i.confirmed, i.in_flight, i.retrying, i.backlog, i.consumers)
            return i if got == (3, 4, 2, 6, 1) else None  # 3 4 8 9 in flight; 6 7 retrying

        info = await wait_for(counts, "describe to show the acks")
        assert info.next_read >= 10 and info.high_watermark >= 10 and info.dead_lettered == 0
        assert info.acked_ranges >= 1  # 5 (and the partition's own subscription records)
        assert info.config.ack_timeout_ms == NEVER_MS and info.stalled == ""
        async with Subscriber(bs, "orders", "work", create=False) as other:
            await other.start()
            [i] = await describe(bs, "orders", "work")
            assert i.consumers == 2
            await nothing_more(other, 0.2)  # nothing to give: all in flight or waiting
    [i] = await describe(bs, "orders", "work")
    assert i.consumers == 0 and i.in_flight == 0 and i.retrying == 6  # given back


# --------------------------------------------------------------------------- restarts


async def test_broker_restart_keeps_the_cursor(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    values = await produce(bs, "orders", 20, 2)
    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS) as sub:
        msgs = await take(sub, 40)
        acked = {m.value for m in msgs if m.offset % 3 != 1}  # out of order: gaps kept as ranges
        for m in reversed(msgs):
            if m.value in acked:
                m.ack()
        await sub.flush()
    assert broker.stop() == 0
    broker.start()
    async with Subscriber(bs, "orders", "work", create=False) as sub:
        msgs = await take(sub, 40 - len(acked))
        for m in msgs:
            m.ack()
        await nothing_more(sub, 0.5)
    assert {m.value for m in msgs} == set(values) - acked
    await settled(bs, "orders", "work")


async def test_close_hands_prefetched_messages_back(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    values = await produce(bs, "orders", 10)
    sub = Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS)
    await sub.start()
    [first] = await take(sub, 1)
    first.ack()

    async def all_delivered():
        [i] = await describe(bs, "orders", "work")
        return i.confirmed == 1 and i.in_flight == 9

    await wait_for(all_delivered, "the rest to be prefetched")
    await sub.close()
    async with Subscriber(bs, "orders", "work", create=False) as other:
        rest = await take(other, 9, timeout=20)  # at once: the ack timeout is 10 minutes
        assert {m.attempt for m in rest} == {1}  # handed back, not tried
        assert sorted(m.value for m in rest) == sorted(values)[1:]
        for m in rest:
            m.ack()
    await settled(bs, "orders", "work")


# --------------------------------------------------------------------------- run, sync


async def test_run_acks_on_return_and_nacks_on_exception(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    values = await produce(bs, "orders", 20, 2)
    running = 0
    most = 0
    four = asyncio.Event()
    calls: Counter = Counter()
    done: set[bytes] = set()
    finished = asyncio.Event()

    async def handler(msg):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            if running == 4:
                four.set()
            await asyncio.wait_for(four.wait(), 10)  # the first four run at once
            calls[msg.value] += 1
            if msg.attempt == 1 and msg.offset % 3 == 0:
                raise ValueError(f"no {msg.value!r}")
            done.add(msg.value)
            if len(done) == len(values):
                finished.set()
        finally:
            running -= 1

    sub = Subscriber(bs, "orders", "work", config=SubscriptionConfig(ack_timeout_ms=NEVER_MS, **FAST))
    await sub.start()
    task = asyncio.ensure_future(sub.run(handler, concurrency=4))
    try:
        await asyncio.wait_for(finished.wait(), 30)
    finally:
        await sub.close()
        await asyncio.wait_for(task, 10)
    assert most == 4
    assert done == set(values)
    assert {v for v, n in calls.items() if n == 2} == {v for v in values if int(v[-6:]) % 3 == 0}
    assert set(calls.values()) == {1, 2}
    await settled(bs, "orders", "work")


async def test_sync_subscriber_from_a_thread(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    values = await produce(bs, "orders", 15, 2)
    got: list = []
    failure: list = []

    def consume():
        try:
            with SyncSubscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS) as sub:
                while len(got) < 30:
                    msgs = sub.getmany(10, timeout=10)
                    assert msgs, f"only {len(got)} messages"
                    for m in msgs:
                        got.append(m.value)
                        m.ack()
                sub.flush()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            failure.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    await asyncio.to_thread(t.join, 60)
    assert not t.is_alive() and not failure, failure
    assert sorted(got) == sorted(values)
    await settled(bs, "orders", "work")


async def test_run_takes_a_plain_function_handler(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders")
    values = await produce(bs, "orders", 6)
    calls: Counter = Counter()

    def handler(msg):
        calls[msg.value] += 1
        if msg.attempt == 1 and msg.offset == 2:
            raise ValueError("not yet")

    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS, max_attempts=3, **FAST) as sub:
        task = asyncio.ensure_future(sub.run(handler))
        [info] = await settled(bs, "orders", "work", timeout=10)
    await asyncio.wait_for(task, 10)
    assert info.dead_lettered == 0
    assert calls == {v: 2 if v.endswith(b"000002") else 1 for v in values}


async def test_run_leaves_a_message_the_handler_settled_itself(broker):
    """A handler that nacks with its own delay, or acks and then fails: ``run`` keeps that
    settlement and neither adds a second one nor stops."""
    bs = broker.bootstrap
    await make_topic(bs, "orders")
    values = await produce(bs, "orders", 4)
    calls: Counter = Counter()
    loop_errors = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))

    async def handler(msg):
        calls[msg.value] += 1
        if msg.offset == 1 and msg.attempt == 1:
            msg.nack(delay_ms=0, reason="again")
        elif msg.offset == 2:
            msg.ack()
            raise ValueError("after the ack")

    async with Subscriber(bs, "orders", "work", ack_timeout_ms=NEVER_MS, max_attempts=3, **FAST) as sub:
        task = asyncio.ensure_future(sub.run(handler))
        [info] = await settled(bs, "orders", "work", timeout=10)
        assert not task.done()
    await asyncio.wait_for(task, 10)
    assert info.dead_lettered == 0 and loop_errors == []  # no handling task failed
    assert calls == {v: 2 if v.endswith(b"000001") else 1 for v in values}


async def test_backoff_settings_as_keywords(broker):
    bs = broker.bootstrap
    await make_topic(bs, "orders")
    async with Subscriber(bs, "orders", "work", backoff_initial_ms=100, backoff_max_ms=400, max_attempts=2):
        pass
    [info] = await describe(bs, "orders", "work")
    assert (info.config.backoff_initial_ms, info.config.backoff_max_ms, info.config.max_attempts) == (100, 400, 2)


async def test_a_subscriber_warns_once_of_settings_an_existing_subscription_does_not_have(broker, caplog):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", SubscriptionConfig(mode="ordered"))
    caplog.set_level("WARNING", logger="sluice.client.subscriber")
    async with Subscriber(bs, "orders", "work", max_attempts=3, mode="ordered"):
        pass
    warnings = [r.getMessage() for r in caplog.records if "other settings" in r.getMessage()]
    assert warnings == [
        "subscription work of orders exists with other settings, which were not changed: max_attempts 0 (asked 3)"
    ]
    caplog.clear()
    async with Subscriber(bs, "orders", "work", mode="ordered"):  # asks nothing it lacks
        pass
    async with Subscriber(bs, "orders", "work"):  # asks nothing: takes what it has
        pass
    assert not [r for r in caplog.records if "other settings" in r.getMessage()]
    assert {i.config.max_attempts for i in await describe(bs, "orders", "work")} == {0}
