"""A whole broker in this process with no listener (tests/broker/conftest.py ``broker``):
what its subscriptions need of the broker itself they do in-process, never through a
client connecting to the broker's own address — dead letters are written, and a topic's
subscriptions found (a topic with subscriptions is not made compacted)."""

from __future__ import annotations

import asyncio
import time

import pytest
from batches import request
from in_memory import Conn

from sluice.broker.peer import LOCAL
from sluice.broker.subscriptions.session import Session
from sluice.protocol import messages as m
from sluice.protocol import subscriptions as sub
from sluice.protocol.records import decode_records

pytestmark = pytest.mark.timeout(60)


async def create_topic(broker, name: str) -> None:
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name=name, partitions=1)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp


async def test_dead_letters_are_written_in_process(broker):
    await create_topic(broker, "orders")
    await broker.led_partition("orders", 0).append(*request([b"poison"]))
    ps = await broker.subscriptions.partition("orders", 0)
    cfg = sub.SubscriptionConfig(max_attempts=1, ack_timeout_ms=600_000, backoff_initial_ms=0)
    sp = await ps.create("work", cfg, m.Position())
    conn = Conn()
    sp.attach(Session(conn, "orders", "work", 10))
    assert await conn.wait_deliveries(1) == [(0, 1)]
    sp.settle(m.AckPartition(partition=0, nacks=[(0, 1)], reason="bad"))
    deadline = time.monotonic() + 15
    while sp.dead_lettered < 1:
        assert time.monotonic() < deadline, "not dead-lettered"
        await asyncio.sleep(0.02)
    dlq = broker.led_partition("orders.work.dlq", 0)  # created on the way
    [dead] = decode_records(dlq.log.read(0, 1 << 20, dlq.log_end_offset).data, "orders.work.dlq", 0, 0)
    assert dead.value == b"poison" and dict(dead.headers)["sluice.dlq.reason"] == b"bad"


async def test_a_topics_subscriptions_are_found_in_process(broker):
    await create_topic(broker, "orders")
    await create_topic(broker, "plain")
    ps = await broker.subscriptions.partition("orders", 0)
    await ps.create("work", sub.SubscriptionConfig(), m.Position())
    assert await broker.subscriptions.names("orders") == {"work"}
    assert await broker.subscriptions.names("plain") == set()
    change = m.TopicConfigChange(name="orders", config={"cleanup.policy": "compact"}, delete=[])
    resp, _ = await broker.topic_service.alter_topic_configs(m.AlterTopicConfigsRequest(topics=[change]), (), LOCAL)
    assert "has subscriptions (work)" in resp.topics[0].message
