"""What describe reports of a subscription: the same after a broker restart as before it,
with no consumer connected, and a backlog counting only the messages a consumer would get
(never the subscription records the partition holds), after seeks back and creations at
an earlier position too.  Real broker processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.client import Admin, Producer, Subscriber
from sluice.protocol.subscriptions import SubscriptionConfig
from sub_helpers import (
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

FIELDS = ("confirmed", "backlog", "in_flight", "retrying", "waiting", "dead_lettered", "expired", "stalled")


def _view(info) -> dict:
    return {f: getattr(info, f) for f in FIELDS} | {"read_all": info.next_read == info.high_watermark}


async def test_key_ordered_describe_is_the_same_after_a_restart(broker):
    """Key a's first message nacked for 5 minutes (a's other two wait behind it), key b's
    acked, the consumer gone: describe says backlog 3, retrying 1, waiting 2, everything
    read — and says the same after a SIGTERM and a restart, no consumer connecting."""
    bs = broker.bootstrap
    await make_topic(bs, "kd")
    async with Producer(bs, linger_ms=5) as p:
        futures = [await p.send("kd", v, key=v[:1]) for v in (b"a1", b"a2", b"a3", b"b1", b"b2", b"b3")]
        await asyncio.gather(*futures)
    config = SubscriptionConfig(mode="key-ordered", ack_timeout_ms=NEVER_MS)
    async with Subscriber(bs, "kd", "ko", config=config) as sub:
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:  # b's come one by one, as acked
            if (m := await sub.get(timeout=1.0)) is None:
                continue
            seen.append(m.value)
            if m.key == b"a":
                m.nack(delay_ms=300_000)
            else:
                m.ack()
        assert sorted(seen) == [b"a1", b"b1", b"b2", b"b3"], seen
        await sub.flush()

        async def taken():
            infos = await describe(bs, "kd", "ko")
            return infos if infos[0].retrying == 1 and infos[0].in_flight == 0 else None

        await wait_for(taken, "the nack and the acks to be taken")
    await asyncio.sleep(0.2)  # cursor records are group-committed every 10 ms
    before = (await describe(bs, "kd", "ko"))[0]
    assert (before.backlog, before.retrying, before.waiting, before.consumers) == (3, 1, 2, 0), before
    assert before.next_read == before.high_watermark, before
    broker.stop()
    broker.start()
    after = (await describe(bs, "kd", "ko"))[0]  # the first request after the restart
    assert _view(after) == _view(before), (before, after)
    async with Subscriber(bs, "kd", "ko", create=False) as sub:
        await nothing_more(sub)  # a's redelivery is 5 minutes away; a2, a3 wait for it
    assert _view((await describe(bs, "kd", "ko"))[0]) == _view(before)


async def _ack_one_by_one(bs: str, topic: str, name: str, n: int) -> None:
    """Take ``n`` messages and ack them one at a time, 20 ms apart: a cursor record each."""
    async with Subscriber(bs, topic, name, ack_timeout_ms=NEVER_MS) as sub:
        for m in await take(sub, n):
            m.ack()
            await sub.flush()
            await asyncio.sleep(0.02)
    await settled(bs, topic, name)


async def test_backlog_after_a_seek_back_counts_messages_only(broker):
    """100 messages acked one at a time (about a hundred subscription records after them),
    then a seek to the earliest: the backlog is the 100 messages, which is what comes."""
    bs = broker.bootstrap
    await make_topic(bs, "bk2")
    await produce(bs, "bk2", 100)
    await _ack_one_by_one(bs, "bk2", "s", 100)
    info = (await describe(bs, "bk2", "s"))[0]
    assert info.high_watermark > 180, info  # the records written: more than the list once kept
    async with Admin(bs) as admin:
        assert await admin.seek_subscription("bk2", "s", "earliest") == {0: 0}
    info = (await describe(bs, "bk2", "s"))[0]
    assert (info.confirmed, info.backlog) == (0, 100), info
    async with Subscriber(bs, "bk2", "s", create=False, ack_timeout_ms=NEVER_MS) as sub:
        again = await take(sub, 100)
        await nothing_more(sub)
        assert len({m.offset for m in again}) == 100
        info = (await describe(bs, "bk2", "s"))[0]
        assert (info.backlog, info.in_flight) == (100, 100), info
        for m in again:
            m.ack()
        await sub.flush()
    await settled(bs, "bk2", "s")


async def test_backlog_of_a_subscription_created_at_the_earliest_counts_messages_only(broker):
    """Another subscription has written about a hundred records: one created afterwards at
    the earliest offset has the 100 messages as its backlog, before and after a restart."""
    bs = broker.bootstrap
    await make_topic(bs, "bk3")
    await produce(bs, "bk3", 100)
    await _ack_one_by_one(bs, "bk3", "first", 100)
    async with Admin(bs) as admin:
        await admin.create_subscription("bk3", "late", start="earliest")
    info = (await describe(bs, "bk3", "late"))[0]
    assert (info.confirmed, info.backlog) == (0, 100), info
    broker.stop()
    broker.start()
    info = (await describe(bs, "bk3", "late"))[0]
    assert (info.confirmed, info.backlog) == (0, 100), info
    assert (await describe(bs, "bk3", "first"))[0].backlog == 0
