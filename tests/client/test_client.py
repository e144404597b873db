"""The Python clients (asyncio and blocking) against a real broker process."""

from __future__ import annotations

import asyncio
import time

import crc32c
import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, SyncAdmin, SyncConsumer, SyncProducer
from sluice.config import ServerConfig
from sluice.protocol import messages

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------- helpers


async def create(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(name, partitions=partitions, config=config or {})


async def describe(bootstrap: str, name: str):
    async with Admin(bootstrap) as admin:
        return await admin.describe_topic(name)


async def read_partition(bootstrap: str, topic: str, partition: int = 0, start: int | None = None) -> list:
    """Every record of one partition from ``start`` (default: log start) to the high watermark."""
    desc = await describe(bootstrap, topic)
    end = next(p.high_watermark for p in desc.partitions if p.partition == partition)
    consumer = Consumer(bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    consumer.assign([(topic, partition)])
    await consumer.start()
    try:
        if start is None:
            await consumer.seek_to_beginning()
        else:
            consumer.seek(topic, partition, start)
        out = []
        deadline = time.monotonic() + 10
        while consumer.position((topic, partition)) < end:
            assert time.monotonic() < deadline, f"read {len(out)} records, stuck before {end}"
            out += await consumer.getmany(timeout_ms=500)
        return out
    finally:
        await consumer.close()


async def poll_n(consumer: Consumer, n: int, timeout: float = 10) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n} records"
        out += await consumer.getmany(timeout_ms=300, max_records=n - len(out))
    return out


async def produce_values(bootstrap: str, topic: str, values, partition: int = 0, **kw) -> list:
    async with Producer(bootstrap, linger_ms=0, **kw) as producer:
        futs = [await producer.send(topic, v, partition=partition) for v in values]
        return [await f for f in futs]


def check_error(exc_info, cls, code: int) -> None:
    exc = exc_info.value
    assert type(exc) is cls
    assert exc.code == code
    assert exc.message and exc.message != exc.name
    assert str(exc).startswith(f"{exc.name} ({code}): ")


# ---------------------------------------------------------------------- bad input: Admin / Producer


@pytest.mark.parametrize("name", ["bad name", "x" * 300, "__reserved", "", "a/b"])
def test_admin_invalid_topic_name(broker, name):
    with pytest.raises(errors.InvalidTopicName) as ei:
        asyncio.run(create(broker.bootstrap, name))
    check_error(ei, errors.InvalidTopicName, 7)


def test_admin_errors(broker):
    b = broker.bootstrap

    async def main():
        async with Admin(b) as admin:
            await admin.create_topic("t", partitions=2)
            with pytest.raises(errors.TopicAlreadyExists) as ei:
                await admin.create_topic("t", partitions=5)
            check_error(ei, errors.TopicAlreadyExists, 6)
            with pytest.raises(errors.InvalidPartitions) as ei:
                await admin.create_topic("many", partitions=10001)
            check_error(ei, errors.InvalidPartitions, 8)
            for call in (admin.describe_topic, admin.delete_topic):
                with pytest.raises(errors.UnknownTopic) as ei:
                    await call("nope")
                check_error(ei, errors.UnknownTopic, 4)
                assert "nope" in ei.value.message
            with pytest.raises(errors.UnknownTopic):
                await admin.list_offsets("nope")
            for cfg, needle in [
                ({"no.such.key": "1"}, "no.such.key"),
                ({"retention.ms": "abc"}, "retention.ms"),
                ({"flush.messages": "-5"}, "flush.messages"),
                ({"max.message.bytes": "1"}, "max.message.bytes"),
            ]:
                with pytest.raises(errors.InvalidConfig) as ei:
                    await admin.create_topic("c", config=cfg)
                check_error(ei, errors.InvalidConfig, 9)
                assert needle in ei.value.message
            assert [t.name for t in await admin.list_topics()] == ["t"]
            assert len((await admin.describe_topic("t")).partitions) == 2

    asyncio.run(main())


@pytest.mark.parametrize("n", [0, -3])
def test_admin_invalid_partitions(broker, n):
    with pytest.raises(errors.InvalidPartitions):
        asyncio.run(create(broker.bootstrap, "p", n))


def test_keyed_records_land_on_crc32c_partition(broker):
    b = broker.bootstrap
    n = 4
    asyncio.run(create(b, "keyed", n))
    keys = [f"customer-{i}".encode() for i in range(24)]

    async def main():
        async with Producer(b, linger_ms=2) as producer:
            futs = [(k, r, await producer.send("keyed", b"%s-%d" % (k, r), key=k)) for r in range(2) for k in keys]
            metas = [(k, r, await f) for k, r, f in futs]
        for k, _, meta in metas:
            assert meta.partition == crc32c.crc32c(k) % n
        used = {m.partition for _, _, m in metas}
        assert len(used) > 1  # 24 keys spread over more than one partition
        for p in range(n):
            recs = await read_partition(b, "keyed", p)
            for rec in recs:
                assert crc32c.crc32c(rec.key) % n == p
                assert rec.value.startswith(rec.key + b"-")
            # per key, round 0 comes before round 1
            for k in {r.key for r in recs}:
                assert [r.value for r in recs if r.key == k] == [k + b"-0", k + b"-1"]

    asyncio.run(main())


def test_headers_round_trip(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "h"))
    headers = [("trace", b"abc"), ("empty", b""), ("none", None), ("trace", b"second"), ("bin", bytes(range(256)))]

    async def main():
        async with Producer(b, linger_ms=0) as producer:
            await (await producer.send("h", b"v1", key=b"k", headers=headers))
            await (await producer.send("h", b"v2"))
        recs = await read_partition(b, "h")
        assert [r.value for r in recs] == [b"v1", b"v2"]
        assert list(recs[0].headers) == headers
        assert recs[0].key == b"k"
        assert list(recs[1].headers) == [] and recs[1].key is None

    asyncio.run(main())


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_compression_round_trip(broker, compression):
    b = broker.bootstrap
    asyncio.run(create(b, "z"))
    values = [(b"payload %05d " % i) * (1 + i % 7) for i in range(300)]
    bulk = [b"bulk-%05d" % i for i in range(2000)]

    async def main():
        async with Producer(b, linger_ms=5, compression=compression) as producer:
            futs = [await producer.send("z", v, partition=0, key=b"k%d" % (i % 3)) for i, v in enumerate(values)]
            done = await producer.send_many("z", bulk, partition=0)
            metas = [await f for f in futs]
            assert await done == (0, len(values))
        assert [m.offset for m in metas] == list(range(len(values)))
        recs = await read_partition(b, "z")
        assert [r.value for r in recs] == values + bulk
        assert [r.offset for r in recs] == list(range(len(values) + len(bulk)))

    asyncio.run(main())


def test_send_many_returns_offsets_in_order(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "bulk", 2))
    values = [b"m%06d" % i for i in range(5000)]

    async def main():
        # a small batch_size splits the call into many batches
        async with Producer(b, batch_size=4096, linger_ms=0) as producer:
            first = await (await producer.send("bulk", b"before", partition=1))
            done = await producer.send_many("bulk", values, partition=1)
            part, base = await done
            keyed = await (await producer.send_many("bulk", [b"k1", b"k2"], key=b"same"))
        assert first.offset == 0
        assert (part, base) == (1, 1)
        recs = await read_partition(b, "bulk", 1)
        assert [r.value for r in recs[1 : 1 + len(values)]] == values
        assert [r.offset for r in recs] == list(range(len(recs)))
        kp = crc32c.crc32c(b"same") % 2
        assert keyed[0] == kp
        krecs = [r for r in await read_partition(b, "bulk", kp) if r.key == b"same"]
        assert [r.value for r in krecs] == [b"k1", b"k2"]

    asyncio.run(main())


def test_flush_sends_everything_despite_long_linger(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "f"))

    async def main():
        async with Producer(b, linger_ms=30_000) as producer:
            futs = [await producer.send("f", b"x%d" % i) for i in range(100)]
            await asyncio.sleep(0.2)
            assert not any(f.done() for f in futs), "lingering: nothing is sent yet"
            t0 = time.monotonic()
            await producer.flush()
            assert time.monotonic() - t0 < 5
            assert all(f.done() and f.exception() is None for f in futs)
            assert [f.result().offset for f in futs] == list(range(100))

    asyncio.run(main())


def test_delivery_timeout_when_broker_is_down(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "dt"))

    async def main():
        async with Producer(
            b, linger_ms=0, delivery_timeout_ms=1500, request_timeout_ms=500, retry_backoff_ms=50,
            connect_timeout_ms=300,
        ) as producer:
            await (await producer.send("dt", b"warm-up"))
            broker.kill()
            t0 = time.monotonic()
            fut = await producer.send("dt", b"lost")
            with pytest.raises(errors.DeliveryTimeout) as ei:
                await fut
            elapsed = time.monotonic() - t0
            assert 1.0 <= elapsed < 5, elapsed
            assert "delivery_timeout_ms=1500" in str(ei.value)

    asyncio.run(main())


def test_send_retries_across_a_broker_restart(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "rs"))

    async def main():
        async with Producer(
            b, linger_ms=0, delivery_timeout_ms=15_000, request_timeout_ms=1000, retry_backoff_ms=50,
            retry_backoff_max_ms=200, connect_timeout_ms=300,
        ) as producer:
            await (await producer.send("rs", b"before"))
            broker.kill()
            futs = [await producer.send("rs", b"during-%d" % i) for i in range(5)]
            await asyncio.sleep(0.5)
            assert not any(f.done() for f in futs)
            await asyncio.to_thread(broker.start)
            metas = await asyncio.wait_for(asyncio.gather(*futs), 10)
        assert [m.offset for m in metas] == [1, 2, 3, 4, 5]
        recs = await read_partition(b, "rs")
        assert [r.value for r in recs] == [b"before"] + [b"during-%d" % i for i in range(5)]

    asyncio.run(main())


# ---------------------------------------------------------------------- consumer


def test_assign_seek_and_seek_to_beginning_end(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "s", 2))
    asyncio.run(produce_values(b, "s", [b"v%d" % i for i in range(10)], partition=1))

    async def main():
        consumer = Consumer(b, enable_auto_commit=False, fetch_max_wait_ms=100)
        consumer.assign([("s", 1)])
        await consumer.start()
        try:
            assert consumer.assignment() == [("s", 1)]
            consumer.seek("s", 1, 5)
            recs = await poll_n(consumer, 5)
            assert [(r.partition, r.offset, r.value) for r in recs] == [(1, i, b"v%d" % i) for i in range(5, 10)]
            assert consumer.position(("s", 1)) == 10

            await consumer.seek_to_beginning()
            assert consumer.position(("s", 1)) == 0
            assert [r.offset for r in await poll_n(consumer, 3)] == [0, 1, 2]

            await consumer.seek_to_end()
            assert consumer.position(("s", 1)) == 10
            assert await consumer.getmany(timeout_ms=300) == []
            await produce_values(b, "s", [b"new"], partition=1)
            [rec] = await poll_n(consumer, 1)
            assert (rec.offset, rec.value) == (10, b"new")
            with pytest.raises(errors.ConfigError):
                consumer.seek("s", 0, 0)  # not assigned
        finally:
            await consumer.close()

    asyncio.run(main())


def test_seek_to_time_uses_broker_timestamps(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "ts"))

    async def main():
        metas = []
        async with Producer(b, linger_ms=0) as producer:
            for i in range(6):
                metas.append(await (await producer.send("ts", b"t%d" % i)))
                await asyncio.sleep(0.02)
        stamps = [m.timestamp for m in metas]
        assert stamps == sorted(stamps) and len(set(stamps)) == 6
        consumer = Consumer(b, enable_auto_commit=False, fetch_max_wait_ms=100)
        consumer.assign([("ts", 0)])
        await consumer.start()
        try:
            await consumer.seek_to_time(stamps[3])
            assert consumer.position(("ts", 0)) == 3
            recs = await poll_n(consumer, 3)
            assert [r.value for r in recs] == [b"t3", b"t4", b"t5"]
            assert [r.timestamp for r in recs] == stamps[3:]
            await consumer.seek_to_time(stamps[3] - 1)  # between t2 and t3
            assert consumer.position(("ts", 0)) == 3
            await consumer.seek_to_time(0)
            assert consumer.position(("ts", 0)) == 0
            await consumer.seek_to_time(stamps[-1] + 60_000)  # after everything: the end
            assert consumer.position(("ts", 0)) == 6
        finally:
            await consumer.close()

    asyncio.run(main())


def test_group_commit_close_and_resume(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "grp", 2))
    for p in range(2):
        asyncio.run(produce_values(b, "grp", [b"p%d-%d" % (p, i) for i in range(6)], partition=p))

    async def main():
        c1 = Consumer(b, group="billing", enable_auto_commit=False, fetch_max_wait_ms=100)
        c1.subscribe(["grp"])
        await c1.start()
        first = await poll_n(c1, 5)
        await c1.commit()
        committed = {p: await c1.committed(("grp", p)) for p in range(2)}
        await c1.close()
        seen = {(r.partition, r.offset) for r in first}
        for p in range(2):
            assert committed[p] == max((o + 1 for q, o in seen if q == p), default=0)

        c2 = Consumer(b, group="billing", enable_auto_commit=False, fetch_max_wait_ms=100)
        c2.subscribe(["grp"])
        await c2.start()
        rest = await poll_n(c2, 12 - len(first))
        assert await c2.getmany(timeout_ms=300) == []
        await c2.close()
        got = seen | {(r.partition, r.offset) for r in rest}
        assert len(got) == len(first) + len(rest) == 12  # nothing twice, nothing missing
        for p in range(2):
            first_of_c2 = min(r.offset for r in rest if r.partition == p) if any(r.partition == p for r in rest) else 6
            assert first_of_c2 == committed[p]

    asyncio.run(main())


def test_auto_commit_on_close(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "ac"))
    asyncio.run(produce_values(b, "ac", [b"%d" % i for i in range(8)]))

    async def main():
        c1 = Consumer(b, group="g", auto_commit_interval_ms=60_000, fetch_max_wait_ms=100)
        c1.assign([("ac", 0)])
        await c1.start()
        await poll_n(c1, 3)
        await c1.close()  # commits with auto commit on
        c2 = Consumer(b, group="g", enable_auto_commit=False)
        c2.assign([("ac", 0)])
        await c2.start()
        assert await c2.committed(("ac", 0)) == 3
        assert [r.offset for r in await poll_n(c2, 5)] == [3, 4, 5, 6, 7]
        await c2.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_committed_offsets_survive_broker_restart(broker, how):
    b = broker.bootstrap
    asyncio.run(create(b, "dur", 2))
    asyncio.run(produce_values(b, "dur", [b"%d" % i for i in range(10)], partition=0))

    async def commit():
        c = Consumer(b, group="durable", enable_auto_commit=False)
        c.assign([("dur", 0), ("dur", 1)])
        await c.start()
        await c.commit({("dur", 0): 7, ("dur", 1): 0})
        await c.close()

    asyncio.run(commit())
    if how == "stop":
        assert broker.stop() == 0
    else:
        broker.kill()
    broker.start()

    async def resume():
        c = Consumer(b, group="durable", enable_auto_commit=False, fetch_max_wait_ms=100)
        c.assign([("dur", 0), ("dur", 1)])
        await c.start()
        try:
            assert await c.committed(("dur", 0)) == 7
            assert await c.committed(("dur", 1)) == 0
            recs = await poll_n(c, 3)
            assert [(r.partition, r.offset) for r in recs] == [(0, 7), (0, 8), (0, 9)]
        finally:
            await c.close()

    asyncio.run(resume())


def test_async_for_iteration(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "it"))
    asyncio.run(produce_values(b, "it", [b"i%d" % i for i in range(7)]))

    async def main():
        consumer = Consumer(b, group="iter", enable_auto_commit=False, fetch_max_wait_ms=100)
        consumer.subscribe(["it"])
        await consumer.start()
        got = []
        try:
            async with asyncio.timeout(10):
                async for rec in consumer:
                    got.append(rec)
                    if len(got) == 4:
                        await consumer.commit()
                        break
            assert [r.value for r in got] == [b"i%d" % i for i in range(4)]
            assert consumer.position(("it", 0)) == 4
            assert await consumer.committed(("it", 0)) == 4
        finally:
            await consumer.close()

    asyncio.run(main())


@pytest.mark.parametrize("reset", ["earliest", "latest", "error"])
def test_offset_out_of_range(broker, reset):
    b = broker.bootstrap
    asyncio.run(create(b, "oor"))
    asyncio.run(produce_values(b, "oor", [b"%d" % i for i in range(5)]))

    async def main():
        consumer = Consumer(b, enable_auto_commit=False, auto_offset_reset=reset, fetch_max_wait_ms=100)
        consumer.assign([("oor", 0)])
        await consumer.start()
        try:
            consumer.seek("oor", 0, 100)  # past the high watermark (5)
            if reset == "error":
                with pytest.raises(errors.OffsetOutOfRange) as ei:
                    for _ in range(20):
                        await consumer.getmany(timeout_ms=200)
                assert ei.value.code == 11
            elif reset == "earliest":
                assert [r.offset for r in await poll_n(consumer, 5)] == [0, 1, 2, 3, 4]
            else:
                deadline = time.monotonic() + 5
                while consumer.position(("oor", 0)) != 5:
                    assert time.monotonic() < deadline, consumer.position(("oor", 0))
                    assert await consumer.getmany(timeout_ms=200) == []
                await produce_values(b, "oor", [b"after"])
                [rec] = await poll_n(consumer, 1)
                assert (rec.offset, rec.value) == (5, b"after")
        finally:
            await consumer.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- durability


def test_sigterm_with_unflushed_data_loses_nothing_acknowledged(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "lazy", 2, {"flush.messages": "0", "flush.ms": "60000"}))

    async def main():
        async with Producer(b, linger_ms=1) as producer:
            futs = [await producer.send("lazy", b"m%04d" % i, key=b"%d" % (i % 5)) for i in range(600)]
            return [(await f, i) for i, f in enumerate(futs)]

    acked = asyncio.run(main())
    assert broker.stop() == 0
    broker.start()

    async def check():
        for p in range(2):
            recs = {r.offset: r.value for r in await read_partition(b, "lazy", p)}
            mine = [(m.offset, b"m%04d" % i) for m, i in acked if m.partition == p]
            assert len(recs) == len(mine)
            for offset, value in mine:
                assert recs.get(offset) == value

    asyncio.run(check())


# ---------------------------------------------------------------------- retention


async def _in_process_server(tmp_path, retention_check_ms: int):
    from sluice.server.app import Server

    server = Server(ServerConfig(data_dir=tmp_path / "data", port=0, retention_check_ms=retention_check_ms))
    await server.start()
    host, port = server.address
    return server, f"{host}:{port}"


async def _fill(bootstrap: str, topic: str, n: int) -> None:
    """``n`` records of ~100 bytes, each acknowledged before the next is sent: one small
    batch per write (the broker puts one group-committed write in one segment)."""
    async with Producer(bootstrap, linger_ms=0) as producer:
        for i in range(n):
            await (await producer.send(topic, b"r%05d-" % i + b"x" * 90, partition=0))


async def test_retention_bytes_moves_log_start(tmp_path):
    server, b = await _in_process_server(tmp_path, retention_check_ms=3_600_000)  # loop never fires
    try:
        await create(b, "ret", config={"segment.bytes": "2048", "retention.bytes": "4096"})
        await _fill(b, "ret", 400)
        before = (await describe(b, "ret")).partitions[0]
        assert before.log_start_offset == 0
        assert before.high_watermark == 400
        assert before.segments >= 10
        deleted = await server.broker.enforce_retention()
        assert deleted > 0
        after = (await describe(b, "ret")).partitions[0]
        assert after.segments == before.segments - deleted
        assert after.log_start_offset > 0
        assert after.high_watermark == 400
        assert 4096 <= after.size_bytes < 4096 + 2048 + 1024
        # what is left reads back from the new log start, in order
        recs = await read_partition(b, "ret", 0)
        assert recs[0].offset == after.log_start_offset
        assert [r.offset for r in recs] == list(range(after.log_start_offset, 400))
        assert recs[-1].value.startswith(b"r00399-")
        async with Admin(b) as admin:
            assert await admin.list_offsets("ret", timestamp=messages.EARLIEST) == {0: after.log_start_offset}
        # a consumer still at offset 0 is reset to the new log start
        consumer = Consumer(b, enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        consumer.assign([("ret", 0)])
        await consumer.start()
        try:
            consumer.seek("ret", 0, 0)
            [rec] = await poll_n(consumer, 1)
            assert rec.offset == after.log_start_offset
        finally:
            await consumer.close()
        assert await server.broker.enforce_retention() == 0  # nothing more to delete
    finally:
        await server.stop()


async def test_retention_loop_applies_retention_on_its_own(tmp_path):
    server, b = await _in_process_server(tmp_path, retention_check_ms=100)
    try:
        await create(b, "ret", config={"segment.bytes": "2048", "retention.bytes": "4096"})
        await _fill(b, "ret", 400)
        deadline = time.monotonic() + 5
        while (await describe(b, "ret")).partitions[0].log_start_offset == 0:
            assert time.monotonic() < deadline, "retention never ran"
            await asyncio.sleep(0.1)
        # a topic without size retention keeps everything
        await create(b, "keep", config={"segment.bytes": "2048"})
        await _fill(b, "keep", 400)
        await asyncio.sleep(0.4)
        assert (await describe(b, "keep")).partitions[0].log_start_offset == 0
    finally:
        await server.stop()


# ---------------------------------------------------------------------- blocking facades


def test_sync_facades(broker):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("sync", partitions=2, config={"retention.ms": "60000"})
        assert [(t.name, len(t.partitions)) for t in admin.list_topics()] == [("sync", 2)]
        assert admin.describe_topic("sync").config["retention.ms"] == "60000"

    with SyncProducer(b, linger_ms=0) as producer:
        futs = [producer.send("sync", b"s%d" % i, partition=0, headers=[("h", b"%d" % i)]) for i in range(5)]
        producer.flush()
        metas = [f.result(timeout=5) for f in futs]
        assert [m.offset for m in metas] == list(range(5))
        part, base = producer.send_many("sync", [b"b%d" % i for i in range(100)], partition=1).result(timeout=5)
        assert (part, base) == (1, 0)
        keyed = producer.send("sync", b"kv", key=b"key").result(timeout=5)
        assert keyed.partition == crc32c.crc32c(b"key") % 2

    with SyncAdmin(b) as admin:
        assert admin.list_offsets("sync") == {0: 5 + (keyed.partition == 0), 1: 100 + (keyed.partition == 1)}

    consumer = SyncConsumer(b, group="sg", enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        consumer.subscribe(["sync"])
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 106:
            assert time.monotonic() < deadline, len(got)
            got += consumer.getmany(timeout_ms=300)
        p0 = [r for r in got if r.partition == 0]
        assert [r.value for r in p0[:5]] == [b"s%d" % i for i in range(5)]
        assert [list(r.headers) for r in p0[:5]] == [[("h", b"%d" % i)] for i in range(5)]
        consumer.commit()
        assert consumer.committed(("sync", 1)) == 100 + (keyed.partition == 1)
        consumer.seek_to_end()
        assert consumer.getmany(timeout_ms=200) == []
    finally:
        consumer.close()
    consumer.close()  # idempotent


def test_sync_consumer_assign(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "sa"))
    asyncio.run(produce_values(b, "sa", [b"a", b"b", b"c"]))
    consumer = SyncConsumer(b, enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        consumer.assign([("sa", 0)])
        consumer.seek("sa", 0, 1)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.getmany(timeout_ms=300)
        assert [r.value for r in got] == [b"b", b"c"]
    finally:
        consumer.close()


def test_sync_errors(broker):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("small", config={"max.message.bytes": "1024"})
        with pytest.raises(errors.InvalidTopicName) as ei:
            admin.create_topic("bad name")
        check_error(ei, errors.InvalidTopicName, 7)
        with pytest.raises(errors.TopicAlreadyExists) as ei:
            admin.create_topic("small")
        check_error(ei, errors.TopicAlreadyExists, 6)
        with pytest.raises(errors.InvalidConfig) as ei:
            admin.create_topic("c", config={"retention.ms": "abc"})
        check_error(ei, errors.InvalidConfig, 9)
        with pytest.raises(errors.InvalidPartitions) as ei:
            admin.create_topic("c", partitions=10001)
        check_error(ei, errors.InvalidPartitions, 8)
        with pytest.raises(errors.UnknownTopic) as ei:
            admin.describe_topic("nope")
        check_error(ei, errors.UnknownTopic, 4)
        with pytest.raises(errors.UnknownTopic):
            admin.delete_topic("nope")
    with SyncProducer(b, delivery_timeout_ms=800, linger_ms=0) as producer:
        with pytest.raises(errors.MessageTooLarge) as ei:
            producer.send("small", b"a" * 5000)
        check_error(ei, errors.MessageTooLarge, 10)
        with pytest.raises(errors.UnknownTopic):
            producer.send("nope", b"x")
        assert producer.send("small", b"ok").result(timeout=5).offset == 0


def test_sync_clients_against_a_dead_broker(broker):
    broker.kill()
    for client in (SyncAdmin(broker.bootstrap, connect_timeout_ms=500), SyncProducer(broker.bootstrap)):
        try:
            with pytest.raises(errors.ConnectionClosed) as ei:
                client.list_topics() if isinstance(client, SyncAdmin) else client.send("t", b"x")
            assert broker.bootstrap in str(ei.value)
        finally:
            client.close()


def test_assign_after_start(broker):
    """An assignment made after start() still finds its leader and reads."""
    b = broker.bootstrap
    asyncio.run(create(b, "late", 2))
    asyncio.run(produce_values(b, "late", [b"x", b"y"], partition=1))

    async def main():
        consumer = Consumer(b, enable_auto_commit=False, fetch_max_wait_ms=100)
        await consumer.start()
        try:
            consumer.assign([("late", 1)])
            consumer.seek("late", 1, 0)
            assert [(r.partition, r.value) for r in await poll_n(consumer, 2)] == [(1, b"x"), (1, b"y")]
        finally:
            await consumer.close()

    asyncio.run(main())
