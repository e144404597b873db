import asyncio

import pytest

from sluice import errors
from sluice.client import Consumer, Producer

from .fakebroker import FakeBroker


async def fill(broker, topic, n, partition=0):
    async with Producer("fake:1", connection_factory=broker.factory) as p:
        await (await p.send_many(topic, [b"%d" % i for i in range(n)], partition=partition))


def make(broker, **kw):
    kw.setdefault("fetch_max_wait_ms", 10)
    return Consumer("fake:1", connection_factory=broker.factory, **kw)


def test_config_errors():
    with pytest.raises(errors.ConfigError, match="auto_offset_reset"):
        Consumer("h:1", auto_offset_reset="middle")
    with pytest.raises(errors.ConfigError, match="isolation"):
        Consumer("h:1", isolation="serializable")


async def test_assign_getmany_and_positions():
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 100)
    async with make(broker) as c:
        c.assign([("t", 0)])
        got = []
        while len(got) < 100:
            got += await c.getmany(timeout_ms=500, max_records=30)
        assert [int(r.value) for r in got] == list(range(100))
        assert c.position(("t", 0)) == 100
        c.seek("t", 0, 95)
        got = await c.getmany(timeout_ms=500)
        assert [r.offset for r in got] == [95, 96, 97, 98, 99]


async def test_subscribe_latest_and_seek_to_beginning():
    broker = FakeBroker({"t": 2})
    await fill(broker, "t", 10, partition=1)
    async with make(broker, auto_offset_reset="latest") as c:
        c.subscribe(["t"])
        assert await c.getmany(timeout_ms=50) == []
        assert c.position(("t", 1)) == 10
        await c.seek_to_beginning()
        got = await c.getmany(timeout_ms=500)
        assert len(got) == 10 and c.assignment() == [("t", 0), ("t", 1)]


async def test_group_commit_and_resume():
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 20)
    async with make(broker, group="g", enable_auto_commit=False) as c:
        c.assign([("t", 0)])
        got = await c.getmany(timeout_ms=500, max_records=7)
        assert len(got) == 7
        await asyncio.gather(*(c.commit() for _ in range(5)))  # coalesced
        assert await c.committed(("t", 0)) == 7
    async with make(broker, group="g") as c:
        c.assign([("t", 0)])
        got = await c.getmany(timeout_ms=500)
        assert got[0].offset == 7


async def test_async_iteration_advances_per_record():
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 5)
    async with make(broker) as c:
        c.assign([("t", 0)])
        it = aiter(c)
        r = await anext(it)
        assert r.offset == 0 and c.position(("t", 0)) == 1
        r = await anext(it)
        assert c.position(("t", 0)) == 2


async def test_commit_needs_group():
    async with make(FakeBroker({"t": 1})) as c:
        with pytest.raises(errors.ConfigError):
            await c.commit()


def test_sync_facades_roundtrip():
    import pickle

    from sluice.client import SyncAdmin, SyncConsumer, SyncProducer

    broker = FakeBroker({})
    with SyncAdmin("fake:1", connection_factory=broker.factory) as admin:
        admin.create_topic("s", partitions=1)
        with pytest.raises(errors.TopicAlreadyExists):
            admin.create_topic("s")
    with SyncProducer("fake:1", connection_factory=broker.factory) as p:
        meta = p.send("s", b"hello").result(5)
        assert meta.offset == 0
        assert p.send_many("s", [b"a", b"b"]).result(5) == (0, 1)
    with SyncConsumer("fake:1", connection_factory=broker.factory, fetch_max_wait_ms=10) as c:
        c.assign([("s", 0)])
        assert [r.value for r in c.getmany(timeout_ms=1000)] == [b"hello", b"a", b"b"]
    clone = pickle.loads(pickle.dumps(SyncProducer("h:1", acks="all")))
    assert clone._config == {"acks": "all"} and clone._client is None
