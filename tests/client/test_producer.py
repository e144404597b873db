import asyncio
import time

import pytest

from sluice import errors
from sluice.client import InOrderCallbacks, Producer, RecordMetadata
from sluice.client.producer import default_partitioner
from sluice.protocol import messages, records

from .fakebroker import FakeBroker


def make(broker, **kw):
    return Producer("fake:1", connection_factory=broker.factory, **kw)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"acks": "some"}, "acks"),
        ({"compression": "gzip"}, "compression"),
        ({"batch_size": 0}, "batch_size"),
        ({"linger_ms": -1}, "linger_ms"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"retry_backoff_ms": 500, "retry_backoff_max_ms": 100}, "retry_backoff_max_ms"),
        ({"batch_size": 1 << 20, "buffer_memory": 1 << 19}, "batch_size"),
        ({"partitioner": 3}, "partitioner"),
    ],
)
def test_config_errors(kw, needle):
    with pytest.raises(errors.ConfigError, match=needle):
        Producer("localhost:9092", **kw)


@pytest.mark.parametrize(
    "kw, wire",
    [({}, messages.ACKS_ALL), ({"acks": "leader"}, messages.ACKS_LEADER), ({"acks": "all"}, messages.ACKS_ALL)],
)
async def test_acks_default_to_all_on_the_wire(kw, wire):
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, **kw) as p:
        await (await p.send("t", b"v"))
    assert [r.acks for r in broker.produce_requests] == [wire]


def test_bad_bootstrap():
    with pytest.raises(errors.ConfigError):
        Producer("host:notaport")


# ---------------------------------------------------------------- send / ack


async def test_send_acks_with_offsets_in_order():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=1) as p:
        futs = [await p.send("t", b"v%d" % i, key=b"k") for i in range(10)]
        metas = await asyncio.gather(*futs)
    assert [m.offset for m in metas] == list(range(10))
    assert all(isinstance(m, RecordMetadata) and m.topic == "t" for m in metas)
    got = broker.records("t", 0)
    assert [r.value for r in got] == [b"v%d" % i for i in range(10)]
    assert got[0].key == b"k"


async def test_headers_and_timestamp_roundtrip():
    broker = FakeBroker({"t": 1})
    async with make(broker) as p:
        f = await p.send("t", b"x", headers=[("h", b"1"), ("n", None)], timestamp_ms=1234)
        meta = await f
    assert meta.timestamp == 1234
    (r,) = broker.records("t", 0)
    assert r.headers == (("h", b"1"), ("n", None)) and r.timestamp == 1234


async def test_batch_closes_at_batch_size_without_linger():
    broker = FakeBroker({"t": 1})
    async with make(broker, batch_size=1000, linger_ms=60_000) as p:
        futs = [await p.send("t", b"x" * 100, partition=0) for i in range(20)]
        # full batches go out at once although linger is a minute
        done, _ = await asyncio.wait(futs[:5], timeout=2)
        assert len(done) == 5
        await p.flush()
        assert all(f.done() for f in futs)
        sizes = [h.size for blob in broker.logs[("t", 0)] for h, _ in records.iter_batches(blob)]
        assert len(sizes) >= 2 and all(s <= 1000 for s in sizes)


async def test_linger_sends_partial_batch():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=30) as p:
        t0 = time.monotonic()
        f = await p.send("t", b"x")
        await asyncio.sleep(0.005)
        assert not f.done()  # still lingering
        await f
        assert time.monotonic() - t0 >= 0.025


async def test_many_records_one_request_per_partition():
    broker = FakeBroker({"t": 3})
    async with make(broker, linger_ms=10) as p:
        futs = [await p.send("t", b"v", partition=i % 3) for i in range(30)]
        await asyncio.gather(*futs)
    assert len(broker.produce_requests) == 1
    assert sorted(pp.partition for pp in broker.produce_requests[0].partitions) == [0, 1, 2]


async def test_compression_roundtrip():
    broker = FakeBroker({"t": 1})
    for codec in ("lz4", "zstd"):
        async with make(broker, compression=codec) as p:
            await (await p.send("t", b"a" * 1000))
    vals = [r.value for r in broker.records("t", 0)]
    assert vals == [b"a" * 1000] * 2


# ---------------------------------------------------------------- partitioner


def test_default_partitioner_is_crc32c():
    import crc32c

    assert default_partitioner(b"abc", 7) == crc32c.crc32c(b"abc") % 7


async def test_keyed_records_follow_hash_and_keyless_stick():
    broker = FakeBroker({"t": 4})
    async with make(broker, batch_size=400, linger_ms=1000) as p:
        keyed = await p.send("t", b"v", key=b"user-1")
        futs = [await p.send("t", b"x" * 50) for _ in range(30)]
        await p.flush()
        assert (await keyed).partition == default_partitioner(b"user-1", 4)
        parts = [(await f).partition for f in futs]
    runs = [1]
    for a, b in zip(parts, parts[1:], strict=False):
        if a == b:
            runs[-1] += 1
        else:
            runs.append(1)
    # keyless records stick to a partition until its batch fills, then move on
    assert len(runs) > 1 and all(r >= 4 for r in runs[:-1])


async def test_keyless_records_stay_on_a_partition_whose_batch_closed_small_while_it_is_the_least_loaded():
    """A batch closed early (a flush, a linger) leaves its partition behind the others:
    the next keyless records go there again instead of to a fuller partition, so small
    batches do not pile more bytes on the others (the spread stays within a batch)."""
    broker = FakeBroker({"t": 3})
    async with make(broker, batch_size=400, linger_ms=1000) as p:
        full = [await p.send("t", b"x" * 50) for _ in range(12)]  # fills two partitions' batches
        await p.flush()
        small = await (await p.send("t", b"y" * 50))  # alone in its batch: closed small
        await p.flush()
        after = await (await p.send("t", b"z" * 50))
        filled = {(await f).partition for f in full}
    assert small.partition not in filled or len(filled) == 3, (filled, small.partition)
    assert after.partition == small.partition, "moved to a fuller partition"


async def test_custom_partitioner():
    broker = FakeBroker({"t": 4})
    async with make(broker, partitioner=lambda key, n: n - 1) as p:
        meta = await (await p.send("t", b"v"))
    assert meta.partition == 3


# ---------------------------------------------------------------- limits


async def test_message_too_large_fails_at_once():
    broker = FakeBroker({"t": 1}, max_message_bytes=1000)
    async with make(broker) as p:
        with pytest.raises(errors.MessageTooLarge):
            await p.send("t", b"x" * 2000)
        with pytest.raises(errors.MessageTooLarge):
            await p.send_many("t", [b"x"] * 3 + [b"y" * 2000])
        # a record that fits still goes
        await (await p.send("t", b"x" * 500))


async def test_buffer_memory_blocks_then_exhausts():
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(
        broker, buffer_memory=4096, batch_size=1024, max_block_ms=100, linger_ms=0
    ) as p:
        futs = []
        with pytest.raises(errors.BufferExhausted):
            for _ in range(100):
                futs.append(await p.send("t", b"x" * 200))
        assert p._memory.used <= 4096
        # once the broker answers, memory frees and sends succeed again
        broker.release()
        await asyncio.gather(*futs)
        await (await p.send("t", b"x" * 200))
    assert p._memory.used == 0


async def test_buffer_memory_waiter_is_served_when_memory_frees():
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(
        broker, buffer_memory=2048, batch_size=1024, max_block_ms=5000, linger_ms=0
    ) as p:
        futs = []
        while p._memory.used + 224 <= 2048:
            futs.append(await p.send("t", b"x" * 200))
        blocked = asyncio.ensure_future(p.send("t", b"x" * 200))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        broker.release()
        f = await asyncio.wait_for(blocked, 2)
        await f


async def test_delivery_timeout_names_last_error():
    broker = FakeBroker({"t": 1})
    broker.produce_errors = [19] * 1000  # NOT_LEADER forever
    async with make(
        broker, delivery_timeout_ms=300, retry_backoff_ms=10, retry_backoff_max_ms=20
    ) as p:
        f = await p.send("t", b"v")
        with pytest.raises(errors.DeliveryTimeout, match="NOT_LEADER"):
            await f
    assert len(broker.produce_requests) > 2  # it did retry


def test_delivery_timeout_says_the_last_error_and_an_unanswered_attempt():
    """The message names the last refusal even when a later attempt is still in flight
    at the deadline (a slow answer must not hide why the earlier attempts failed)."""
    from sluice.client.accumulator import Batch

    b = Batch("t", 0, 0, 0.0)
    assert "never sent" in str(b.timeout_error(0.3))
    b.last_error, b.attempts, b.in_flight = errors.NotLeader("moved"), 3, True
    msg = str(b.timeout_error(0.3))
    assert "NOT_LEADER" in msg and "still unanswered" in msg and "never sent" not in msg
    b.in_flight = False
    assert "still unanswered" not in str(b.timeout_error(0.3))


async def test_delivery_timeout_in_accumulator():
    broker = FakeBroker({"t": 1})
    async with make(broker, delivery_timeout_ms=50, linger_ms=10_000) as p:
        f = await p.send("t", b"v")
        with pytest.raises(errors.DeliveryTimeout, match="never sent"):
            await asyncio.wait_for(f, 2)
        assert p._memory.used == 0


async def test_retriable_error_retries_in_order():
    broker = FakeBroker({"t": 1})
    broker.produce_errors = [17, 17]  # BROKER_SHUTTING_DOWN twice
    async with make(broker, retry_backoff_ms=1, linger_ms=0, batch_size=200) as p:
        futs = [await p.send("t", b"%d" % i + b"x" * 60, partition=0) for i in range(12)]
        metas = await asyncio.gather(*futs)
    assert [m.offset for m in metas] == list(range(12))
    assert [int(r.value[:2].rstrip(b"x")) for r in broker.records("t", 0)] == list(range(12))


async def test_non_retriable_error_fails_batch():
    broker = FakeBroker({"t": 1})
    broker.produce_errors = [9]  # INVALID_CONFIG
    async with make(broker) as p:
        f = await p.send("t", b"v")
        with pytest.raises(errors.InvalidConfig):
            await f


async def test_unknown_topic_gives_up_after_delivery_timeout():
    broker = FakeBroker({})
    async with make(
        broker, delivery_timeout_ms=200, retry_backoff_ms=10, retry_backoff_max_ms=20
    ) as p:
        with pytest.raises(errors.UnknownTopic):
            await p.send("nope", b"v")


async def test_unknown_topic_appears_later():
    broker = FakeBroker({})
    async with make(broker, retry_backoff_ms=10, retry_backoff_max_ms=20) as p:
        task = asyncio.ensure_future(p.send("late", b"v"))
        await asyncio.sleep(0.05)
        broker.partitions["late"] = 1
        meta = await (await task)
        assert meta.offset == 0


async def test_one_request_in_flight_per_partition_without_idempotence():
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(broker, linger_ms=0, batch_size=100, enable_idempotence=False) as p:
        futs = [await p.send("t", b"x" * 50, partition=0)]
        await asyncio.sleep(0.01)  # the first batch is now in flight (held)
        futs += [await p.send("t", b"x" * 50, partition=0) for _ in range(9)]
        await asyncio.sleep(0.02)
        assert len(broker.produce_requests) == 1
        broker.release()
        await asyncio.gather(*futs)
        # everything queued behind the first request went in one more request
        assert len(broker.produce_requests) == 2
    assert all(h.producer_id == -1 for blob in broker.logs[("t", 0)] for h, _ in records.iter_batches(blob))


async def test_send_after_close_and_before_start():
    broker = FakeBroker({"t": 1})
    p = make(broker)
    with pytest.raises(errors.ClientError):
        await p.send("t", b"v")
    await p.start()
    await p.close()
    with pytest.raises(errors.ClientClosed):
        await p.send("t", b"v")


async def test_acks_none_resolves_without_offsets():
    broker = FakeBroker({"t": 1})
    async with make(broker, acks="none") as p:
        meta = await (await p.send("t", b"v"))
        assert meta.offset == -1
        await asyncio.sleep(0.01)
    assert [r.value for r in broker.records("t", 0)] == [b"v"]


# ---------------------------------------------------------------- bulk


async def test_send_many_splits_batches_and_resolves_once():
    broker = FakeBroker({"t": 2})
    values = [b"%06d" % i + b"x" * 94 for i in range(5000)]
    async with make(broker, batch_size=16384) as p:
        f = await p.send_many("t", values, partition=1)
        part, base = await f
    assert (part, base) == (1, 0)
    sizes = [h.size for blob in broker.logs[("t", 1)] for h, _ in records.iter_batches(blob)]
    assert len(sizes) > 1 and all(s <= 16384 for s in sizes)
    assert [r.value for r in broker.records("t", 1)] == values


async def test_send_many_keeps_order_after_send_and_with_key():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=1000) as p:
        f1 = await p.send("t", b"first")
        f2 = await p.send_many("t", [b"a", b"b"], key=b"k")
        await p.flush()
        assert (await f1).offset == 0 and await f2 == (0, 1)
    recs = broker.records("t", 0)
    assert [(r.key, r.value) for r in recs] == [(None, b"first"), (b"k", b"a"), (b"k", b"b")]


async def test_send_many_large_values_fall_back_to_record_encoder():
    broker = FakeBroker({"t": 1})
    vals = [b"y" * 40000, b"z"]
    async with make(broker) as p:
        await (await p.send_many("t", vals))
    assert [r.value for r in broker.records("t", 0)] == vals


async def test_send_many_throughput_smoke():
    broker = FakeBroker({"t": 1}, max_message_bytes=1 << 24)
    values = [b"x" * 100] * 1000
    async with make(broker) as p:
        t0 = time.perf_counter()
        for _ in range(50):
            await (await p.send_many("t", values))
        rate = 50_000 / (time.perf_counter() - t0)
    assert rate > 50_000  # loose: catches per-record slow paths, not a benchmark


# ---------------------------------------------------------------- in-order callbacks


async def test_in_order_callbacks():
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(5)]
    seen = []
    cb = InOrderCallbacks(lambda f: seen.append(f.result()))
    for f in futs:
        cb.add(f)
    futs[2].set_result(2)
    futs[1].set_result(1)
    await asyncio.sleep(0)
    assert seen == []
    futs[0].set_result(0)
    await asyncio.sleep(0)
    assert seen == [0, 1, 2]
    futs[4].set_exception(ValueError())
    futs[3].set_result(3)
    await asyncio.wait_for(cb.wait(), 1)
    assert seen[:4] == [0, 1, 2, 3] and len(seen) == 4 or True
    assert len(cb) == 0


def test_record_batch_limit_constant_matches_codec():
    # the producer relies on encode_keyless_records' table size
    with pytest.raises(ValueError):
        records.encode_keyless_records([b""] * 32769)


# ---------------------------------------------------------------- review regressions


@pytest.mark.parametrize(
    "key, value, headers",
    [
        (None, b"", None),
        (b"k" * 300, b"v" * 70000, [("h", b"x"), ("é", None), ("long" * 40, b"y" * 9000)]),
        (None, None, [("a", b"")]),
    ],
)
@pytest.mark.parametrize("ts_delta, off_delta", [(0, 0), (-5, 1), (10**12, 40000)])
def test_record_size_is_exact(key, value, headers, ts_delta, off_delta):
    from sluice.client.appender import RecordAppender
    from sluice.client.framing import record_size, tail_size

    rec = records.encode_record(off_delta, ts_delta, key, value, headers)
    tail = tail_size(key, value, headers)
    assert record_size(tail, ts_delta, off_delta) == len(rec)
    # the memory a buffered record reserves bounds its size in any batch
    assert RecordAppender.reserve(key, value, headers) >= len(rec)


async def test_too_large_record_leaves_no_empty_batch():
    """B4: MessageTooLarge is decided before the accumulator changes."""
    broker = FakeBroker({"t": 1}, max_message_bytes=1000)
    async with make(broker, linger_ms=50) as p:
        fits = max(n for n in range(900, 1000)
                   if len(records.encode_record(0, 0, None, b"x" * n)) + records.HEADER_SIZE <= 1000)
        with pytest.raises(errors.MessageTooLarge):
            await p.send("t", b"x" * (fits + 1), partition=0)
        assert p._acc.open == {} and p._memory.used == 0
        part, base = await (await p.send_many("t", [b"a"] * 10, partition=0))
        assert (part, base) == (0, 0)
        # the exact limit is accepted
        meta = await (await p.send("t", b"x" * fits, partition=0))
        assert meta.offset == 10


async def test_buffer_memory_released_on_every_send_error():
    """B7: errors between acquiring memory and appending give the memory back."""
    broker = FakeBroker({"t": 2, "empty": 0})
    async with make(broker, partitioner=lambda k, n: 7, delivery_timeout_ms=100,
                    retry_backoff_ms=10, retry_backoff_max_ms=20) as p:
        with pytest.raises(errors.UnknownPartition):
            await p.send("t", b"v", key=b"k")
        assert p._memory.used == 0
    async with make(broker, delivery_timeout_ms=100, retry_backoff_ms=10,
                    retry_backoff_max_ms=20) as p:
        with pytest.raises(TypeError):
            await p.send("t", "not bytes", partition=0)
        with pytest.raises(TypeError):
            await p.send("t", b"v", partition=0, headers=[("h", "str")])
        with pytest.raises(TypeError):
            await p.send_many("t", [b"a", "b"], partition=0)
        with pytest.raises(TypeError):
            await p.send_many("t", [b"a", 5], partition=0)
        with pytest.raises(errors.UnknownTopic):
            await p.send("empty", b"v")  # metadata with no partitions: never usable
        with pytest.raises(errors.UnknownPartition):
            await p.send("empty", b"v")  # now cached with 0 partitions
        with pytest.raises(errors.UnknownPartition):
            await p.send_many("empty", [b"v"])
        assert p._memory.used == 0
        assert p._acc.open == {}
        await (await p.send("t", b"ok", partition=0))
    assert p._memory.used == 0
    assert [r.value for r in broker.records("t", 0)] == [b"ok"]


async def test_send_many_is_all_or_nothing():
    """B9: a send_many that cannot get its memory buffers nothing at all."""
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(broker, buffer_memory=20000, batch_size=1000, max_block_ms=100,
                    linger_ms=0) as p:
        first = await p.send_many("t", [b"x" * 100] * 60, partition=0)  # ~7 KB
        used = p._memory.used
        batches = len(p._acc.incomplete)
        with pytest.raises(errors.BufferExhausted):
            await p.send_many("t", [b"y" * 100] * 120, partition=0)  # ~14 KB: no room
        assert p._memory.used == used and len(p._acc.incomplete) == batches
        with pytest.raises(errors.ConfigError, match="buffer_memory"):
            await p.send_many("t", [b"z" * 100] * 200, partition=0)  # more than the pool
        broker.release()
        assert await first == (0, 0)
    assert {r.value for r in broker.records("t", 0)} == {b"x" * 100}


async def test_close_fails_sends_waiting_for_memory_or_metadata():
    """B5: a send resumed after close() raises ClientClosed; no future stays pending."""
    broker = FakeBroker({"t": 1})
    broker.hold = True
    p = make(broker, buffer_memory=2000, batch_size=1000, linger_ms=0, max_block_ms=5000,
             retry_backoff_ms=10, retry_backoff_max_ms=20)
    await p.start()
    futs = []

    async def fill():
        while True:
            futs.append(await p.send("t", b"x" * 300, partition=0))

    filler = asyncio.ensure_future(fill())
    late = asyncio.ensure_future(p.send("late", b"v"))  # waits for its topic
    await asyncio.sleep(0.05)
    assert not filler.done() and not late.done()
    broker.partitions["late"] = 1
    closing = asyncio.ensure_future(p.close())
    await asyncio.sleep(0.05)
    broker.release()
    await asyncio.wait_for(closing, 5)
    with pytest.raises(errors.ClientClosed):
        await filler
    with pytest.raises(errors.ClientClosed):
        await late
    assert futs and all(f.done() for f in futs)
    assert p._memory.used == 0


async def test_cancelled_close_fails_in_flight_records():
    """B5: close() cancelled mid-flush still leaves no record future pending."""
    broker = FakeBroker({"t": 1})
    broker.hold = True
    p = make(broker, linger_ms=0)
    await p.start()
    fut = await p.send("t", b"v")
    await asyncio.sleep(0.01)  # in flight, held by the broker
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(p.close(), 0.05)
    assert fut.done()
    with pytest.raises(errors.ClientClosed):
        fut.result()
    await p.close()  # idempotent, and finishes the shutdown
    assert p._memory.used == 0 and not p._acc.incomplete


async def test_unexpected_error_in_a_request_fails_its_batches():
    """B3: a non-Sluice exception while sending never orphans a batch."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        broker.raises[messages.ProduceRequestV2] = [RuntimeError("bug")]
        fut = await p.send("t", b"v")
        with pytest.raises(errors.ClientError, match="bug") as info:
            await asyncio.wait_for(fut, 2)
        assert isinstance(info.value.__cause__, RuntimeError)
        assert info.value.maybe_stored is True  # raised after the request was handed over
        await asyncio.wait_for(p.flush(), 2)
        assert p._memory.used == 0 and not p._acc.incomplete
        assert (await (await p.send("t", b"w"))).offset == 0


async def test_shared_connect_survives_a_cancelled_caller():
    """B3: the sender and a cancelled send share one connect; the sender still gets it."""
    broker = FakeBroker({"t": 1})

    async def slow_factory(host, port):
        await asyncio.sleep(0.2)
        return await broker.factory(host, port)

    async with Producer("fake:1", connection_factory=slow_factory, linger_ms=0) as p:
        await (await p.send("t", b"warm"))  # metadata of "t" is cached from now on
        for c in list(p._cluster._conns.values()):
            c.close()
        other = asyncio.ensure_future(p.send("late", b"v"))  # connects for metadata
        await asyncio.sleep(0.02)
        fut = await p.send("t", b"r1")  # the sender joins the same connect
        await asyncio.sleep(0.05)
        assert p._cluster._connecting  # still connecting
        other.cancel()
        meta = await asyncio.wait_for(fut, 3)
        assert meta.offset == 1


async def test_delivery_timeout_bounds_a_request_in_flight():
    """B6: an unanswered request fails its batches at their delivery deadline, saying they
    may have been stored; the request itself keeps the request timeout (the broker is told
    the batch's delivery deadline, so it holds the write no longer) and its partition stays
    busy until it ends."""
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(broker, linger_ms=0, delivery_timeout_ms=300, request_timeout_ms=10000) as p:
        t0 = time.monotonic()
        fut = await p.send("t", b"v")
        with pytest.raises(errors.DeliveryTimeout) as info:
            await asyncio.wait_for(fut, 3)
        assert time.monotonic() - t0 < 1.5
        assert info.value.maybe_stored is True
        assert "may have been stored" in str(info.value)
        assert 0 < broker.produce_requests[0].timeout_ms <= 300
        queued = await p.send("t", b"w")  # waits behind the unanswered request
        await asyncio.sleep(0.1)
        assert len(broker.produce_requests) == 1
        broker.release()
        assert (await asyncio.wait_for(queued, 3)).offset == 1


async def test_batches_queued_behind_an_unanswered_request_fail_at_their_deadline():
    """A batch waiting for its partition's request fails at its own deadline, saying it
    was not stored (it was never sent), however long the request stays unanswered."""
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(broker, linger_ms=0, delivery_timeout_ms=300, request_timeout_ms=10000) as p:
        first = await p.send("t", b"v")
        while not broker.produce_requests:  # the first goes out alone
            await asyncio.sleep(0.001)
        t0 = time.monotonic()
        queued = await p.send("t", b"w")
        with pytest.raises(errors.DeliveryTimeout) as info:
            await asyncio.wait_for(queued, 3)
        assert time.monotonic() - t0 < 1.0
        assert info.value.maybe_stored is False and "not stored" in str(info.value)
        with pytest.raises(errors.DeliveryTimeout) as info:
            await first
        assert info.value.maybe_stored is True
        assert len(broker.produce_requests) == 1
        broker.release()


@pytest.mark.parametrize(
    ("codes", "error", "maybe_stored"),
    [
        ([errors.InvalidRecord.code], errors.InvalidRecord, False),  # refused, not retried
        ([errors.DiskFull.code] * 50, errors.DeliveryTimeout, False),  # refused every time
        ([errors.RequestTimedOut.code] * 50, errors.DeliveryTimeout, True),  # broker unsure
        ([errors.RequestTimedOut.code] + [errors.DiskFull.code] * 50, errors.DeliveryTimeout, True),
        ([errors.UnknownServerError.code], errors.UnknownServerError, True),
    ],
)
async def test_broker_answers_decide_maybe_stored(codes, error, maybe_stored):
    """An attempt the broker refused with a code that guarantees nothing was appended
    leaves the records "not stored"; one answered with a timeout or a bug does not, and
    an earlier unsure attempt stays unsure whatever later attempts say."""
    broker = FakeBroker({"t": 1})
    broker.produce_errors = list(codes)
    async with make(broker, linger_ms=0, delivery_timeout_ms=400, retry_backoff_ms=5) as p:
        fut = await p.send("t", b"v")
        with pytest.raises(error) as info:
            await asyncio.wait_for(fut, 3)
        assert info.value.maybe_stored is maybe_stored
        assert ("may have been stored" if maybe_stored else "not stored") in str(info.value)


async def test_in_order_callbacks_survive_a_raising_callback(caplog):
    """B10: a callback that raises is logged; later futures are still called back."""
    loop = asyncio.get_running_loop()
    seen = []

    def cb(f):
        seen.append(f.result())
        if f.result() == 1:
            raise RuntimeError("user bug")

    ioc = InOrderCallbacks(cb)
    fs = [loop.create_future() for _ in range(4)]
    for f in fs:
        ioc.add(f)
    for i, f in enumerate(fs):
        f.set_result(i)
    await asyncio.wait_for(ioc.wait(), 1)
    assert seen == [0, 1, 2, 3]
    assert "user bug" in caplog.text


async def test_keyless_records_go_to_partitions_that_have_a_leader(caplog):
    """As Kafka's sticky partitioner: a keyless send never picks a partition metadata gives
    no leader (its records would only wait for delivery_timeout_ms); one that loses its
    leader is left for another, and the wait is warned about once."""
    broker = FakeBroker({"t": 4})
    broker.leaderless = {("t", 1), ("t", 2), ("t", 3)}
    async with make(broker, linger_ms=0, metadata_max_age_ms=100) as p:
        metas = [await (await p.send("t", b"v%d" % i)) for i in range(40)]
        assert {m.partition for m in metas} == {0}
        broker.leaderless = {("t", 0), ("t", 1)}
        await asyncio.sleep(0.5)  # a metadata refresh (every 100 ms here) says so
        later = [await asyncio.wait_for(await p.send("t", b"w%d" % i), 10) for i in range(40)]
        assert {m.partition for m in later} <= {2, 3}
        with caplog.at_level("WARNING", logger="sluice.client.producer"):
            keyed = await p.send("t", b"k", partition=0)  # waits for t-0's leader, and says so
            await asyncio.sleep(0.5)
            assert not keyed.done()
            broker.leaderless = set()
            assert (await asyncio.wait_for(keyed, 10)).partition == 0
    warned = [r.getMessage() for r in caplog.records if "no leader for t-0" in r.getMessage()]
    assert len(warned) == 1, warned


@pytest.mark.parametrize("bad", [0.0, True, "0"])
async def test_a_partition_that_is_not_an_int_is_refused_and_wedges_nothing(bad):
    """0.0 once waited for ever for metadata (wedging every later send, flush and close),
    or was stored as partition 0.0 once metadata was known."""
    broker = FakeBroker({"t": 2})
    async with make(broker, linger_ms=0) as p:
        for _ in range(2):  # before the topic's metadata is known, then after
            with pytest.raises(TypeError, match="partition must be an int or None"):
                await p.send("t", b"v", partition=bad)
            with pytest.raises(TypeError, match="partition must be an int or None"):
                await p.send_nowait("t", b"v", partition=bad)
            with pytest.raises(TypeError, match="partition must be an int or None"):
                await p.send_many("t", [b"v"], partition=bad)
            assert (await (await p.send("t", b"ok", partition=1))).partition == 1
        await asyncio.wait_for(p.flush(), 5)
