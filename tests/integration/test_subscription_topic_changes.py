"""Subscriptions as their topic changes under them, against real broker processes:
partitions added, retention deleting unacked messages, a topic that has none."""

from __future__ import annotations

import asyncio

import pytest

from sluice.client import Admin, Producer
from sluice.client.subscriber import Subscriber
from sluice.protocol.subscriptions import SubscriptionConfig
from sub_helpers import NEVER_MS, describe, make_topic, produce, wait_for

pytestmark = pytest.mark.timeout(120)


async def test_adding_partitions_extends_every_subscription_with_its_settings(broker):
    """``Admin.add_partitions``: each subscription of the topic is created on the new
    partitions, from their start, with the settings it has (not a consumer's defaults)."""
    bs = broker.bootstrap
    await make_topic(bs, "orders")
    cfg = SubscriptionConfig(mode="key-ordered", max_attempts=5, ack_timeout_ms=7000)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", cfg, start="latest")
        await admin.create_subscription("orders", "audit")
        assert await admin.add_partitions("orders", total=3) == 3
    await produce(bs, "orders", 5, partitions=3)
    for name, want in (("work", cfg), ("audit", SubscriptionConfig())):
        infos = await describe(bs, "orders", name)
        assert [(i.partition, i.config, i.backlog) for i in infos] == [
            (0, want, 5), (1, want, 5), (2, want, 5)
        ]


async def test_a_running_subscriber_extends_its_subscription_to_partitions_added_under_it(broker, monkeypatch):
    """A topic grown without extending its subscriptions (another client): the running
    Subscriber, which started at "latest", creates it on the new partitions from their
    start with the subscription's settings, and misses none of their messages."""
    from sluice.client import subscriber as subscriber_module
    from sluice.protocol import messages

    monkeypatch.setattr(subscriber_module, "METADATA_S", 0.2)
    bs = broker.bootstrap
    await make_topic(bs, "orders")
    cfg = SubscriptionConfig(mode="key-ordered", max_attempts=5, ack_timeout_ms=NEVER_MS)
    async with Admin(bs) as admin:
        await admin.create_subscription("orders", "work", cfg, start="latest")
    async with Subscriber(bs, "orders", "work", start="latest") as sub:
        async with Admin(bs) as admin:  # a bare CREATE_PARTITIONS, as a client of another kind sends it
            resp = await admin._request(messages.CreatePartitionsRequest(
                topics=[messages.PartitionsIncrease(name="orders", total=3)]
            ))
            assert [t.error for t in resp.topics] == [0]
        values = await produce(bs, "orders", 10, partitions=3)
        got = []
        while len(got) < 30:  # key-ordered: the next message of a key comes once this one is acked
            msg = await sub.get(timeout=30)
            assert msg is not None, f"got {len(got)} of 30 messages: {got}"
            msg.ack()
            got.append(msg.value)
        assert sorted(got) == sorted(values)
    infos = await describe(bs, "orders", "work")
    assert [(i.partition, i.config.mode, i.config.max_attempts) for i in infos] == [
        (0, "key-ordered", 5), (1, "key-ordered", 5), (2, "key-ordered", 5)
    ]


async def test_asking_about_subscriptions_writes_nothing_into_a_topic_without_any(broker):
    """``sub list`` / ``describe`` load a partition's subscriptions; a (small) log with none
    gets no record for it, so its log end and every group's lag stay as they were."""
    bs = broker.bootstrap
    await make_topic(bs, "plain", 2)
    await produce(bs, "plain", 3, partitions=2)
    async with Admin(bs) as admin:
        assert await admin.list_subscriptions("plain") == {"plain": []}
        await asyncio.sleep(1.5)  # past a snapshot check (SNAPSHOT_CHECK_S)
        desc = await admin.describe_topic("plain")
    assert [p.high_watermark for p in desc.partitions] == [3, 3]


async def test_messages_retention_deleted_count_as_expired_without_a_consumer(broker_factory):
    """Retention deletes unacked messages of a subscription no consumer reads: ``describe``
    counts them expired (and out of the backlog) at once, not when a consumer comes."""
    broker = broker_factory(extra_args=["--retention-check-ms", "100"]).start()
    bs = broker.bootstrap
    async with Admin(bs) as admin:
        await admin.create_topic("orders", config={"segment.bytes": "1024"})
        await admin.create_subscription("orders", "work")
        async with Producer(bs, linger_ms=0) as p:
            for i in range(4):  # a segment each
                await (await p.send_many("orders", [b"%d-%d" % (i, j) + b"x" * 200 for j in range(5)]))
        await admin.alter_topic_config("orders", {"retention.ms": "1"})

        async def expired():
            [info] = await admin.describe_subscription("orders", "work")
            return info if info.expired else None

        info = await wait_for(expired, "retention to expire messages of the subscription", 20)
    assert info.expired >= 5 and info.backlog + info.expired >= 15, info
