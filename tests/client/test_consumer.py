import asyncio

import pytest

from sluice import errors
from sluice.client import Consumer, Producer
from sluice.protocol import messages, records

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
    # No isolation levels: half messages and control batches are never shown to anyone.
    with pytest.raises(TypeError, match="isolation"):
        Consumer("h:1", isolation="read_committed")


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


async def test_not_coordinator_refreshes_metadata_and_retries():
    broker = FakeBroker({"t": 1})
    async with make(broker, group="g", enable_auto_commit=False) as c:
        c.assign([("t", 0)])
        await c.start()
        broker.raises[messages.OffsetCommitRequest] = [errors.NotCoordinator("the coordinator moved")]
        broker.raises[messages.OffsetFetchRequest] = [errors.NotCoordinator("loading")]
        broker.requests.clear()
        await c.commit({("t", 0): 3})
        assert await c.committed(("t", 0)) == 3
    kinds = [type(r) for r in broker.requests]
    commit, fetch, meta = messages.OffsetCommitRequest, messages.OffsetFetchRequest, messages.MetadataRequest
    # the coordinator is looked up, asked, forgotten after NOT_COORDINATOR, looked up again
    assert kinds == [meta, commit, meta, commit, fetch, meta, fetch]
    assert all(r.topics == ["__groups"] for r in broker.requests if type(r) is meta)


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


# ---------------------------------------------------------------- review regressions


async def test_out_of_range_commit_resets_instead_of_looping():
    """B1: a committed offset past the end is reset per auto_offset_reset, not reused."""
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 10)
    broker.committed[("g", "t", 0)] = 1000  # stale commit (retention, topic recreated)
    async with make(broker, group="g", enable_auto_commit=False) as c:
        c.assign([("t", 0)])
        got = []
        for _ in range(20):
            got += await c.getmany(timeout_ms=50)
            if len(got) >= 10:
                break
        assert [r.offset for r in got] == list(range(10))
        assert c.position(("t", 0)) == 10
    async with make(broker, group="g", enable_auto_commit=False, auto_offset_reset="latest") as c:
        c.assign([("t", 0)])
        assert await c.getmany(timeout_ms=100) == []
        assert c.position(("t", 0)) == 10
    async with make(broker, group="g", enable_auto_commit=False, auto_offset_reset="error") as c:
        c.assign([("t", 0)])
        with pytest.raises(errors.OffsetOutOfRange):
            for _ in range(20):
                await c.getmany(timeout_ms=50)


async def test_cancelled_commit_does_not_fail_a_coalesced_one():
    """B3: cancelling one commit() never puts CancelledError into another caller."""
    broker = FakeBroker({"t": 1})
    broker.delays[messages.OffsetCommitRequest] = 0.1
    async with make(broker, group="g", enable_auto_commit=False) as c:
        c.assign([("t", 0)])
        a = asyncio.ensure_future(c.commit({("t", 0): 1}))
        await asyncio.sleep(0.02)
        b = asyncio.ensure_future(c.commit({("t", 0): 2}))
        await asyncio.sleep(0.02)
        a.cancel()
        await asyncio.wait_for(b, 2)
        assert await c.committed(("t", 0)) == 2


async def test_auto_commit_loop_survives_a_failed_commit():
    """B3: one failed auto commit (whatever it raised) does not stop later ones."""
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 3)
    broker.raises[messages.OffsetCommitRequest] = [RuntimeError("boom")]
    async with make(broker, group="g", auto_commit_interval_ms=20) as c:
        c.assign([("t", 0)])
        while len(await c.getmany(timeout_ms=100)) == 0:
            pass
        for _ in range(100):
            await asyncio.sleep(0.02)
            if broker.committed.get(("g", "t", 0)) == 3:
                break
        assert c._auto_task is not None and not c._auto_task.done()
        assert broker.committed.get(("g", "t", 0)) == 3


async def test_take_keeps_chunks_whole_and_in_order():
    """Partial takes move a head index instead of re-slicing the chunk (not quadratic)."""
    c = Consumer("h:1")
    recs = [records.Record("t", 0, i, 0, None, b"v") for i in range(50_000)]
    c._buffer.append(recs)
    c._positions.at[("t", 0)] = 0
    out = []
    while c._buffer:
        part = c._take(100, True)
        assert not c._buffer or c._buffer[0] is recs  # never copied
        out += part
        assert c._positions.at[("t", 0)] == out[-1].offset + 1
    assert [r.offset for r in out] == list(range(50_000))


async def test_getmany_after_abandoned_iteration_skips_nothing():
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 10)
    async with make(broker) as c:
        c.assign([("t", 0)])
        seen = []
        async for rec in c:
            seen.append(rec.offset)
            if len(seen) == 3:
                break
        assert c.position(("t", 0)) == 3
        rest = await c.getmany(timeout_ms=100)
        assert [r.offset for r in rest] == list(range(3, 10))


async def test_close_wakes_a_waiting_getmany():
    broker = FakeBroker({"t": 1})
    c = make(broker, fetch_max_wait_ms=50)
    c.assign([("t", 0)])
    waiting = asyncio.ensure_future(c.getmany(timeout_ms=10_000))
    await asyncio.sleep(0.1)
    await c.close()
    with pytest.raises(errors.ClientClosed):
        await asyncio.wait_for(waiting, 2)


@pytest.mark.timeout(10)  # the bug was a busy loop: it blocks the event loop, so no wait_for fires
async def test_commit_started_while_the_previous_commit_finishes_does_not_spin():
    """Regression: a commit whose first step runs after the running commit task finished, but
    before that task's done-callback ran, used to see the finished task and spin forever."""
    broker = FakeBroker({"t": 1})
    await fill(broker, "t", 100)
    async with make(broker, group="g", enable_auto_commit=False) as c:
        c.assign([("t", 0)])
        burst = []
        for i in range(50):  # the bench's pattern: many un-awaited commits in a row
            burst.append(asyncio.ensure_future(c.commit({("t", 0): i})))
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*burst), 5)
        await asyncio.wait_for(c.commit({("t", 0): 99}), 5)
        assert await c.committed(("t", 0)) == 99


async def test_compacted_batches_are_skipped_by_their_end_not_their_last_record():
    """A batch that lost its last records to compaction (and one that lost them all): the
    next fetch starts after the batch, not after its last surviving record."""
    from sluice.storage.compaction import rewrite_batch

    broker = FakeBroker({"t": 1})
    body = b"".join(records.encode_record(i, 0, b"k%d" % i, b"v%d" % i) for i in range(3))
    data = bytearray(records.build_batch(body, 3, 1_000, 1_000))
    records.assign_offsets(data, records.validate_batches(data, 1 << 20), 0, 0, None)
    first, _ = rewrite_batch(bytes(data), lambda r: r.offset == 0)
    records.assign_offsets(data, records.validate_batches(data, 1 << 20), 3, 0, None)
    emptied, _ = rewrite_batch(bytes(data), lambda r: False)
    broker.logs[("t", 0)] = [first, emptied]
    broker.next_offset[("t", 0)] = 6
    assert records.end_of_batches(first + emptied[:-1]) == 3  # a partial batch does not count
    async with make(broker) as c:
        c.assign([("t", 0)])
        got = await c.getmany(timeout_ms=500)
        assert [(r.offset, r.value) for r in got] == [(0, b"v0")]
        await fill(broker, "t", 1)  # offset 6
        got = []
        while not got:
            got = await c.getmany(timeout_ms=500)
        assert [r.offset for r in got] == [6]
    fetched = [p.offset for req in broker.requests if isinstance(req, messages.FetchRequest) for p in req.partitions]
    assert not {1, 2, 3, 4, 5} & set(fetched), fetched
