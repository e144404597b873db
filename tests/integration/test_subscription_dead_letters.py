"""Dead letters and re-drive against real broker processes: a message failing
``max_attempts`` times goes to ``<topic>.<subscription>.dlq`` with its reason, and
``sub redrive`` copies a subscription's own dead letters back (broker/subscriptions/,
client/redrive.py)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from sluice.client.subscriber import Subscriber
from sluice.protocol.subscriptions import DLQ_HEADERS, SubscriptionConfig
from sub_helpers import FAST, NEVER_MS, describe, make_topic, nothing_more, produce, take, wait_for
from txn_helpers import read_all

pytestmark = pytest.mark.timeout(120)


async def test_dead_letter_after_max_attempts_and_redrive(broker, cli):
    bs = broker.bootstrap
    await make_topic(bs, "orders", 2)
    async with Producer(bs) as p:
        keep = await (await p.send("orders", b"fine", partition=0))
        bad = await (await p.send("orders", b"poison", key=b"k1", headers=[("trace", b"t-1")], partition=1))
    cfg = SubscriptionConfig(max_attempts=2, ack_timeout_ms=NEVER_MS, **FAST)
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        attempts = []
        fine = 0
        while len(attempts) < 2 or not fine:  # the partitions' messages come in any order
            [msg] = await take(sub, 1)
            if msg.value == b"fine":
                fine += 1
                msg.ack()
                continue
            attempts.append(msg.attempt)
            msg.nack(reason="cannot parse")
        assert attempts == [1, 2] and fine == 1
        await nothing_more(sub, 0.5)  # not a third time: dead-lettered

        async def dead_lettered():
            infos = await describe(bs, "orders", "work")
            return infos if infos[1].dead_lettered == 1 and infos[1].backlog == 0 else None

        infos = await wait_for(dead_lettered, "the dead letter to be acked in the source")
    assert [(i.dead_lettered, i.backlog, i.in_flight, i.retrying) for i in infos] == [(0, 0, 0, 0), (1, 0, 0, 0)]

    [dead] = await read_all(bs, "orders.work.dlq")
    assert (dead.value, dead.key) == (b"poison", b"k1")
    headers = dict(dead.headers)
    assert headers["trace"] == b"t-1"
    assert {k: headers[k] for k in DLQ_HEADERS} == {
        "sluice.dlq.topic": b"orders", "sluice.dlq.partition": b"1",
        "sluice.dlq.offset": str(bad.offset).encode(), "sluice.dlq.subscription": b"work",
        "sluice.dlq.attempts": b"2", "sluice.dlq.reason": b"cannot parse",
    }

    res = cli("sub", "redrive", "orders", "work", bootstrap=bs)
    assert res.returncode == 0, res.stderr.decode()
    assert b"re-drove 1 message(s) from orders.work.dlq into orders" in res.stdout
    records = await read_all(bs, "orders", partitions=2)
    assert sorted(r.value for r in records) == [b"fine", b"poison", b"poison"]
    [copy] = [r for r in records if r.value == b"poison" and r.offset != bad.offset]
    assert copy.partition == 1 and copy.key == b"k1"
    assert list(copy.headers) == [("trace", b"t-1")]  # without the dead-letter headers
    assert keep.partition == 0
    # the re-driven copy is a new message to the subscription
    async with Subscriber(bs, "orders", "work", config=cfg) as sub:
        [msg] = await take(sub, 1)
        assert (msg.value, msg.attempt, msg.offset) == (b"poison", 1, copy.offset)
        msg.ack()
    # re-driving again copies nothing more
    res = cli("sub", "redrive", "orders", "work", bootstrap=bs)
    assert res.returncode == 0 and b"re-drove 0 message(s)" in res.stdout, res


async def test_each_dead_letter_carries_its_own_messages_reason(broker):
    """``run`` at concurrency 10: three messages fail twice at once, each with its own
    exception; each dead letter names the exception of its own message."""
    bs = broker.bootstrap
    await make_topic(bs)
    await produce(bs, "orders", 3)
    failed: Counter = Counter()

    async def handler(msg):
        failed[msg.value] += 1
        await asyncio.sleep(0.05)  # the three fail together: their nacks go in one request
        raise ValueError(f"bad {msg.value}")

    cfg = SubscriptionConfig(max_attempts=2, ack_timeout_ms=NEVER_MS, **FAST)
    async with Subscriber(bs, "orders", "work", config=cfg, ack_interval_ms=50) as sub:
        task = asyncio.ensure_future(sub.run(handler))

        async def dead_lettered():
            return (await describe(bs, "orders", "work"))[0].dead_lettered == 3

        await wait_for(dead_lettered, "three dead letters")
    await asyncio.wait_for(task, 10)
    dead = await read_all(bs, "orders.work.dlq")
    assert len(dead) == 3 and set(failed.values()) == {2}
    for d in dead:
        assert dict(d.headers)["sluice.dlq.reason"] == f"ValueError: bad {d.value}".encode()


async def test_redrive_copies_only_the_dead_letters_of_its_own_subscription(broker, cli):
    """``col`` + ``x.y`` and ``col.x`` + ``y`` share ``col.x.y.dlq`` (dead letters from
    before sharing was refused): each re-drive copies its own, into its own topic, and
    leaves the other's for the other."""
    bs = broker.bootstrap
    await make_topic(bs, "col")
    await make_topic(bs, "col.x")
    await make_topic(bs, "col.x.y.dlq")

    def dead(topic: str, sub: str) -> list[tuple[str, bytes]]:
        return [("sluice.dlq.topic", topic.encode()), ("sluice.dlq.partition", b"0"),
                ("sluice.dlq.subscription", sub.encode()), ("sluice.dlq.offset", b"0")]

    async with Producer(bs, acks="all") as p:
        for value, headers in [(b"of-col", dead("col", "x.y")), (b"of-col.x", dead("col.x", "y")),
                               (b"col-again", dead("col", "x.y"))]:
            await (await p.send("col.x.y.dlq", value, headers=headers))
    res = cli("sub", "redrive", "col", "x.y", bootstrap=bs)
    assert res.returncode == 0 and b"re-drove 2 message(s)" in res.stdout, res
    assert sorted(r.value for r in await read_all(bs, "col")) == [b"col-again", b"of-col"]
    res = cli("sub", "redrive", "col.x", "y", bootstrap=bs)
    assert res.returncode == 0 and b"re-drove 1 message(s)" in res.stdout, res
    assert [r.value for r in await read_all(bs, "col.x")] == [b"of-col.x"]
    for topic, sub in (("col", "x.y"), ("col.x", "y")):  # each where it stopped
        res = cli("sub", "redrive", topic, sub, bootstrap=bs)
        assert res.returncode == 0 and b"re-drove 0 message(s)" in res.stdout, res


async def test_a_dead_letter_topic_of_its_own_with_a_legal_name(broker):
    """A subscription that can dead-letter is refused, through the admin client and on
    first use by a subscriber, when its dead-letter topic name is too long or another
    subscription's; one that never dead-letters is not."""
    bs = broker.bootstrap
    long_topic = "t" * 240
    for name in ("col", "col.x", long_topic):
        await make_topic(bs, name)
    async with Admin(bs) as admin:
        await admin.create_subscription("col", "x.y", SubscriptionConfig(max_attempts=3))
        with pytest.raises(errors.InvalidSubscription, match="subscription 'x.y' of topic 'col'"):
            await admin.create_subscription("col.x", "y", SubscriptionConfig(max_attempts=3))
        with pytest.raises(errors.InvalidSubscription, match="252 characters, too long"):
            await admin.create_subscription(long_topic, "billing", SubscriptionConfig(max_attempts=3))
        for topic, name, match in (("col.x", "y", "'col.x.y.dlq'"), (long_topic, "billing", "too long")):
            with pytest.raises(errors.InvalidSubscription, match=match):
                async with Subscriber(bs, topic, name, max_attempts=1):
                    pass
            async with Subscriber(bs, topic, name):  # max_attempts 0: no dead-letter topic
                pass
        assert await admin.list_subscriptions() == {"col": ["x.y"], "col.x": ["y"], long_topic: ["billing"]}
