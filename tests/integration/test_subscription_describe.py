"""What describe reports of a subscription: a backlog counting only the messages a
consumer would get (never the subscription records the partition holds), after seeks
back and creations at an earlier position too.  Real broker processes."""

from __future__ import annotations

import asyncio

import pytest

from sluice.client import Admin, Subscriber
from sub_helpers import NEVER_MS, describe, make_topic, nothing_more, produce, settled, take

pytestmark = pytest.mark.timeout(120)


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
