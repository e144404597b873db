"""Subscriptions in a three-broker cluster, their partitions led by different brokers:
dead letters of every partition reach the one dead-letter partition whichever broker leads
it (written in-process by its leader, through the leader by the others), and every broker
finds the topic's subscriptions on the partitions it leads and on the others' (a topic with
subscriptions is not made compacted, whichever broker is asked)."""

from __future__ import annotations

import pytest
from replicated import NODES

from sluice.client import Admin, Producer
from sluice.client.subscriber import Subscriber
from sluice.errors import InvalidConfig
from sluice.protocol.subscriptions import SubscriptionConfig
from sub_helpers import NEVER_MS, describe, take, wait_for
from txn_helpers import read_all

pytestmark = pytest.mark.timeout(180)

TOPIC = "orders"


async def test_dead_letters_and_subscription_names_across_brokers(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC, partitions=3)
    leaders = {(await cluster.leader_of(TOPIC, i))[0] for i in range(3)}
    async with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(3):
            await (await p.send(TOPIC, b"poison-%d" % i, partition=i))
    cfg = SubscriptionConfig(max_attempts=1, ack_timeout_ms=NEVER_MS, backoff_initial_ms=0)
    async with Subscriber(cluster.bootstrap, TOPIC, "work", config=cfg) as sub:
        for msg in await take(sub, 3):
            msg.nack(reason=f"bad {msg.partition}")

        async def dead_lettered():
            infos = await describe(cluster.bootstrap, TOPIC, "work")
            return infos if [(i.dead_lettered, i.backlog) for i in infos] == [(1, 0)] * 3 else None

        await wait_for(dead_lettered, "three dead letters acked in their partitions", 60)
    dead = await read_all(cluster.bootstrap, f"{TOPIC}.work.dlq", wait=0.3)
    assert sorted((r.value, dict(r.headers)["sluice.dlq.reason"]) for r in dead) == [
        (b"poison-%d" % i, b"bad %d" % i) for i in range(3)
    ]
    for n in NODES:
        async with Admin(cluster.address(n)) as admin:
            with pytest.raises(InvalidConfig, match=r"has subscriptions \(work\)"):
                await admin.alter_topic_config(TOPIC, {"cleanup.policy": "compact"})
    assert len(leaders) > 1, "the partitions' leaders were not spread: the test proved less"
