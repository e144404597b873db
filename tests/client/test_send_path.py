"""The per-record send path: send() buffering at once, send_nowait, the waiting line, and
SyncProducer.send from a plain loop (fake broker; no timing assertions)."""

import asyncio
import concurrent.futures
import gc
import random
import threading
import time
import weakref

import pytest

from sluice import errors
from sluice.client import Producer, RecordMetadata, SyncProducer
from sluice.client.accumulator import _RecordBuffer
from sluice.client.appender import TURN_BYTES, TURN_RECORDS
from sluice.client.outbox import Outbox as PyOutbox
from sluice.client.producer import _python_path
from sluice.client.record_future import FutureGroup, RecordFuture
from sluice.client.sync import producer as sync_producer
from sluice.protocol import records

from .fakebroker import FakeBroker


def make(broker, **kw):
    return Producer("fake:1", connection_factory=broker.factory, **kw)


async def test_send_returns_a_done_future_and_offsets_follow_send_order():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"v0", partition=0))  # the topic's metadata: then no wait
        buffered = [p.send("t", b"v%d" % i, partition=0) for i in range(1, 300)]
        assert all(b.done() for b in buffered)  # buffered before send() returned
        metas = await asyncio.gather(*[await b for b in buffered])
    assert [m.offset for m in metas] == list(range(1, 300))
    assert all(isinstance(m, RecordMetadata) and m.topic == "t" and m.partition == 0 for m in metas)
    assert [r.value for r in broker.records("t", 0)] == [b"v%d" % i for i in range(300)]


async def test_inline_encoding_matches_the_record_encoder():
    """Keyed, keyless, empty, tombstone and headed records round-trip in one batch."""
    broker = FakeBroker({"t": 1})
    sent = [(None, b"a"), (b"k", b"b" * 300), (None, b""), (b"k2", None), (b"", b"c")]
    async with make(broker, linger_ms=0) as p:
        futs = [await p.send("t", v, key=k, partition=0, timestamp_ms=1000 + i) for i, (k, v) in enumerate(sent)]
        futs.append(await p.send("t", b"h", headers=[("x", b"1")], partition=0, timestamp_ms=999))
        metas = await asyncio.gather(*futs)
    got = broker.records("t", 0)
    assert [(r.key, r.value) for r in got] == [*sent, (None, b"h")]
    assert [r.timestamp for r in got] == [1000, 1001, 1002, 1003, 1004, 999]
    assert [m.offset for m in metas] == list(range(6))


async def test_errors_are_per_record_and_nothing_is_buffered():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, max_request_size=2000) as p:
        ok1 = await p.send("t", b"a", partition=0)
        with pytest.raises(errors.MessageTooLarge):
            await p.send("t", b"x" * 5000, partition=0)
        with pytest.raises(TypeError):
            await p.send("t", "not bytes", partition=0)
        ok2 = await p.send("t", b"b", partition=0)
        assert [m.offset for m in await asyncio.gather(ok1, ok2)] == [0, 1]
    assert [r.value for r in broker.records("t", 0)] == [b"a", b"b"]


async def test_send_nowait_callback_and_future_forms():
    broker = FakeBroker({"t": 1})
    seen = []
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"", partition=0))
        assert p.send_nowait("t", b"a", partition=0, callback=lambda m, e: seen.append((m, e))) is None
        fut = p.send_nowait("t", b"b", partition=0)
        p.send_nowait("t", b"x" * (1 << 25), partition=0, callback=lambda m, e: seen.append((m, e)))
        await p.flush()
        assert (await fut).offset == 2
    # the record too large is refused at once, before the first one is acknowledged
    assert seen[0][0] is None and isinstance(seen[0][1], errors.MessageTooLarge)
    assert seen[1][0].offset == 1 and seen[1][1] is None
    assert len(seen) == 2


async def test_sends_to_a_new_topic_wait_in_line_in_order_without_holding_others():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, unknown_topic_wait_ms=5000, retry_backoff_ms=5,
                    retry_backoff_max_ms=10) as p:
        late = [p.send_nowait("late", b"%d" % i, partition=0) for i in range(50)]
        other = await (await p.send("t", b"x", partition=0))  # not held up by "late"
        assert other.offset == 0 and not any(f.done() for f in late)
        broker.partitions["late"] = 1
        metas = await asyncio.gather(*late)
    assert [m.offset for m in metas] == list(range(50))
    assert [r.value for r in broker.records("late", 0)] == [b"%d" % i for i in range(50)]


async def test_full_buffer_makes_send_wait_then_exhaust_and_send_nowait_fail():
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(broker, buffer_memory=2048, batch_size=1024, max_block_ms=50, linger_ms=0) as p:
        futs = []
        while p._memory.used + 224 <= 2048:
            futs.append(await p.send("t", b"x" * 200, partition=0))
        waiting = p.send("t", b"x" * 200, partition=0)
        assert not waiting.done()  # waits for memory
        dropped = p.send_nowait("t", b"y" * 200, partition=0)
        with pytest.raises(errors.BufferExhausted):
            await waiting
        with pytest.raises(errors.BufferExhausted):
            await dropped
        broker.release()
        await asyncio.gather(*futs)
    assert p._memory.used == 0


async def test_close_fails_sends_waiting_in_line():
    broker = FakeBroker({"t": 1})
    async with make(broker, unknown_topic_wait_ms=5000, retry_backoff_ms=5, retry_backoff_max_ms=10) as p:
        waiting = p.send("late", b"v")
        nowait = p.send_nowait("late", b"w")
    with pytest.raises(errors.ClientClosed):
        await waiting
    with pytest.raises(errors.ClientClosed):
        await nowait


@pytest.fixture(params=["compiled", "reference"])
def outbox(request, monkeypatch):
    """SyncProducer.send with the compiled Outbox (its ``send`` in C), and with the
    pure-Python reference (``SyncProducer.send`` alone)."""
    if request.param == "compiled":
        if records._C is None:
            pytest.skip("the compiled codec is not built")
    else:
        monkeypatch.setattr(sync_producer, "_Outbox", PyOutbox)
    return request.param


def test_sync_send_loop_then_flush(outbox):
    broker = FakeBroker({"t": 1})
    with SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=0) as p:
        futs = [p.send("t", b"%d" % i, partition=0) for i in range(2000)]  # the first one waits
        p.flush()
        assert all(f.done() for f in futs)  # flush waited for every record
        assert [f.result().offset for f in futs] == list(range(2000))
    assert [r.value for r in broker.records("t", 0)] == [b"%d" % i for i in range(2000)]


def test_sync_send_errors_fail_the_future_and_surface_in_flush(outbox):
    broker = FakeBroker({"t": 1})
    with SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=0, max_request_size=2000) as p:
        with pytest.raises(errors.UnknownTopic):  # a topic not seen yet: send raises, as before
            p.send("nope", b"x", partition=0)
        good = p.send("t", b"a", partition=0)
        with pytest.raises(errors.MessageTooLarge):  # near the limit: send raises, as before
            p.send("t", b"x" * 5000, partition=0)
        bad = p.send("t", "not bytes", partition=0)  # found on the loop: its future, then flush
        with pytest.raises(TypeError):
            p.flush()
        p.flush()  # raised once
        assert good.result().offset == 0
        with pytest.raises(TypeError):
            bad.result()


def test_sync_send_blocks_while_buffer_memory_is_full(outbox):
    broker = FakeBroker({"t": 1})
    broker.hold = True
    p = SyncProducer("fake:1", connection_factory=broker.factory, buffer_memory=2048, batch_size=1024,
                     max_block_ms=50, linger_ms=0)
    try:
        futs = [p.send("t", b"x" * 200, partition=0) for _ in range(30)]
        p_errors = [f.exception() for f in futs if f.done() and f.exception() is not None]
        assert p_errors and all(isinstance(e, errors.BufferExhausted) for e in p_errors)
        broker.release()
        with pytest.raises(errors.BufferExhausted):
            p.flush()
        assert all(f.done() for f in futs)
    finally:
        p.close()


def test_sync_close_buffers_and_sends_records_sent_before(outbox):
    broker = FakeBroker({"t": 1})
    p = SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=50)
    futs = [p.send("t", b"%d" % i, partition=0) for i in range(500)]
    p.close()
    assert [f.result(0).offset for f in futs] == list(range(500))


def test_sync_sends_from_many_threads_keep_each_threads_order(outbox):
    """Senders append to the outbox without a lock while the loop hands records over:
    every record is buffered once, each thread's records in its send order."""
    broker = FakeBroker({"t": 1})
    with SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=0) as p:
        p.send("t", b"first", partition=0).result()

        def sender(n: int) -> list:
            return [p.send("t", b"%d-%d" % (n, i), partition=0) for i in range(3000)]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            per_thread = list(pool.map(sender, range(4)))
        p.flush()
    for futs in per_thread:
        offsets = [f.result(0).offset for f in futs]
        assert offsets == sorted(offsets)
    values = [r.value for r in broker.records("t", 0)][1:]
    assert sorted(values) == sorted(b"%d-%d" % (n, i) for n in range(4) for i in range(3000))
    for n in range(4):
        mine = [v for v in values if v.startswith(b"%d-" % n)]
        assert mine == [b"%d-%d" % (n, i) for i in range(3000)]


def test_sync_sends_of_both_paths_keep_their_order(outbox):
    """Records the compiled send queues and records it hands to SyncProducer.send (headers,
    a str value, a topic not seen yet, a near-limit value) keep their send order; an error
    of one fails only its own future."""
    broker = FakeBroker({"t": 1, "u": 1})
    with SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=0, max_request_size=20_000) as p:
        assert (outbox == "compiled") == (getattr(p.send, "__self__", None) is p._outbox)
        p.send("t", b"first", partition=0).result()
        futs, sent = [], []
        for i in range(600):
            kind = i % 6
            if kind == 1:
                sent.append(b"h%d" % i)
                futs.append(p.send("t", sent[-1], headers=[("k", b"v")], partition=0))
            elif kind == 3:
                sent.append(b"k%d" % i)
                futs.append(p.send("t", sent[-1], key=b"key", partition=0, timestamp_ms=5))
            elif i % 60 == 5:
                sent.append(b"x" * 19_900)  # past the margin of a sure fit: the blocking way
                futs.append(p.send("t", sent[-1], partition=0))
            else:
                sent.append(b"v%d" % i)
                futs.append(p.send("t", sent[-1], partition=0))
        with pytest.raises(errors.MessageTooLarge):
            p.send("t", b"x" * 30_000, partition=0)  # raised at once, nothing buffered
        assert isinstance(p.send("u", b"new topic").result(5).offset, int)
        bad = p.send("t", "not bytes", partition=0)
        with pytest.raises(TypeError):
            p.flush()
        assert isinstance(bad.exception(0), TypeError)
    offsets = [f.result(0).offset for f in futs]
    assert offsets == list(range(1, 601))
    assert [r.value for r in broker.records("t", 0)] == [b"first", *sent]


def test_record_futures_share_a_condition_and_still_wait_for_their_own_outcome():
    """A RecordFuture woken by another future's outcome goes on waiting for its own; the
    futures work with concurrent.futures.wait, as_completed and done callbacks."""
    group = FutureGroup()
    a, b = RecordFuture(group), RecordFuture(group)
    seen = []
    a.add_done_callback(lambda f: seen.append(f.result()))
    threading.Timer(0.05, b.set_result, ("b",)).start()  # wakes a's waiter too
    threading.Timer(0.3, a.set_result, ("a",)).start()
    assert a.result(timeout=5) == "a" and seen == ["a"]
    assert b.result(0) == "b"
    with pytest.raises(concurrent.futures.TimeoutError):
        RecordFuture(group).result(timeout=0.01)
    c, d = RecordFuture(group), RecordFuture(group)
    threading.Timer(0.05, d.set_exception, (ValueError("d"),)).start()
    done, pending = concurrent.futures.wait([c, d], timeout=5, return_when=concurrent.futures.FIRST_COMPLETED)
    assert done == {d} and pending == {c}
    assert isinstance(d.exception(0), ValueError)
    assert c.cancel() and c.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        c.result()
    assert list(concurrent.futures.as_completed([a, b, d], timeout=1)) != []



@pytest.mark.parametrize("buffer_type", [records._C.RecordBuffer if records._C else None, _RecordBuffer], ids=["C", "reference"])
def test_a_batch_resolves_record_futures_of_any_group_with_waiters_callbacks_and_cancelled(buffer_type):
    """A batch's acknowledgement tells its RecordFutures in one ``set_results`` call (C) or
    one by one (reference), with the same outcome: a waiting thread wakes, callbacks run, a
    cancelled future stays cancelled, a future of another group is told too."""
    if buffer_type is None:
        pytest.skip("the compiled codec is not built")
    group, other = FutureGroup(), FutureGroup()
    futs = [RecordFuture(group) for _ in range(4)] + [RecordFuture(other)]
    seen = []
    futs[1].add_done_callback(lambda f: seen.append(f.result().offset))
    futs[2].cancel()
    waiter = threading.Thread(target=lambda: seen.append(("waited", futs[3].result(timeout=5).offset)))
    waiter.start()
    watcher = concurrent.futures.ThreadPoolExecutor(1)
    waited = watcher.submit(concurrent.futures.wait, [futs[0]], 5)
    time.sleep(0.05)  # the waiter sleeps on the condition
    buf = buffer_type()
    buf.futures, buf.timestamps = futs, [7] * len(futs)
    buf.resolve_records(RecordMetadata, "t", 0, 10, -1)
    waiter.join(5)
    assert waited.result(5).done == {futs[0]}
    watcher.shutdown()
    assert [f.result().offset for i, f in enumerate(futs) if i != 2] == [10, 11, 13, 14]
    assert futs[2].cancelled()
    assert sorted(seen, key=str) == [("waited", 13), 11]


class _CountedFuture(RecordFuture):
    calls: list = []

    @staticmethod
    def set_results(futures, results) -> None:
        _CountedFuture.calls.append(len(futures))
        RecordFuture.set_results(futures, results)


@pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")
def test_the_compiled_batch_tells_record_futures_through_their_public_set_results():
    """``RecordBuffer.resolve_records`` in C finds the futures' static ``set_results`` by its
    public name and calls it once for the batch's futures of that type."""
    _CountedFuture.calls = []
    group = FutureGroup()
    futs = [_CountedFuture(group) for _ in range(3)]
    buf = records._C.RecordBuffer()
    buf.futures, buf.timestamps = futs, [7, 8, 9]
    buf.resolve_records(RecordMetadata, "t", 0, 10, -1)
    assert _CountedFuture.calls == [3]
    assert [(f.result(0).offset, f.result(0).timestamp) for f in futs] == [(10, 7), (11, 8), (12, 9)]


@pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")
@pytest.mark.parametrize("flush_every", [0, 37])
@pytest.mark.parametrize("seed", range(4))
async def test_compiled_and_python_paths_build_the_same_batches(seed, flush_every):
    """The common record takes the compiled path (``Producer._append_common``), the others
    ``RecordAppender.append``; records of both kinds mixed, with full batches, sticky and keyed
    partitions, give byte-identical batches to the Python path alone — also when flushes
    close batches before they fill (the sticky partition then moves on at the next
    keyless record)."""
    rng = random.Random(seed)
    sends = [
        (
            rng.choice([None, None, b"k%d" % rng.randrange(7)]),  # key
            rng.choice([b"", b"v" * rng.randrange(400), b"w" * rng.randrange(40), None]),  # value
            [("h", b"x")] if rng.random() < 0.1 else None,  # headers
            rng.choice([None, None, rng.randrange(3)]),  # partition
            1_700_000_000_000 + rng.randrange(-5000, 5000),  # timestamp
        )
        for _ in range(800)
    ]

    async def run(compiled: bool):
        random.seed(seed)  # the same sticky partitions
        broker = FakeBroker({"t": 3})
        async with make(broker, linger_ms=60_000, batch_size=4096) as p:
            if not compiled:
                p._append_common = _python_path
            await p.send("t", b"first", partition=0, timestamp_ms=1_700_000_000_000)
            await p.flush()
            futs = []
            for i, (k, v, h, pt, ts) in enumerate(sends, 1):
                futs.append(await p.send("t", v, key=k, headers=h, partition=pt, timestamp_ms=ts))
                if flush_every and i % flush_every == 0:
                    await p.flush()
            await p.flush()
            metas = [f.result() for f in futs]
        return metas, broker.logs

    compiled, python = await run(True), await run(False)
    assert compiled[0] == python[0]
    assert compiled[1] == python[1]
    assert sum(len(batches) for batches in python[1].values()) > 10  # batches filled up


@pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")
async def test_record_buffer_compiled_and_reference_agree():
    """``RecordBuffer`` (C) and ``_RecordBuffer`` (its reference): the same bytes, counts,
    verdicts when full, and the same metadata told to the sinks not done yet."""

    loop = asyncio.get_running_loop()
    outcomes = []
    for kind in (records._C.RecordBuffer, _RecordBuffer):
        b = kind()
        b.buf, b.futures, b.timestamps = bytearray(), [], []
        b.count = b.size = b.reserved = 0
        b.base_ts = b.max_ts = 1000
        sinks = [loop.create_future() for _ in range(6)]
        added = [
            b.add(300, None, b"a" * 50, None, 1000 + i, sinks[i], 70) for i in range(3)
        ] + [b.add(300, b"k", b"b" * 150, [("h", None)], 990, sinks[3], 200), b.add(300, b"k", None, None, 1010, sinks[4], 40)]
        with pytest.raises(TypeError):
            b.add(300, None, "text", None, 1000, sinks[5], 1)
        sinks[1].cancel()
        b.resolve_records(RecordMetadata, "t", 2, 40, -1)
        metas = [s.result() if s.done() and not s.cancelled() else None for s in sinks[:5]]
        outcomes.append((added, bytes(b.buf), b.count, b.size, b.reserved, b.max_ts, metas))
    assert outcomes[0] == outcomes[1]
    added, _, count, *_ , metas = outcomes[0]
    assert added == [True, True, True, False, True] and count == 4
    assert metas[0] == RecordMetadata("t", 2, 40, 1000) and metas[1] is None and metas[4].offset == 43


@pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")
async def test_compiled_send_answers_every_call_as_the_python_send():
    """``Producer.send`` in C hands what it does not take itself (a call not started,
    closed, with other arguments) to the Python ``send``: same results, same errors."""
    broker = FakeBroker({"t": 1})
    p = make(broker, linger_ms=0)
    assert p.send != Producer.send.__get__(p)  # the compiled send is in place
    with pytest.raises(errors.ClientError, match="not started"):
        p.send("t", b"x")
    await p.start()
    await (await p.send("t", b"first", partition=0))
    with pytest.raises(TypeError):
        p.send("t", b"x", 0)  # partition is keyword-only
    with pytest.raises(TypeError):
        p.send("t", b"x", bogus=1)
    kw = {"".join(["part", "ition"]): 0}  # a keyword name that is not interned
    metas = [await (await p.send("t", b"a", **kw)), await (await p.send("t", value=b"b", partition=0))]
    bad = p.send("t", "text", partition=0)  # found by the encoder: the future says so
    with pytest.raises(TypeError):
        await bad
    assert [m.offset for m in metas] == [1, 2]
    await p.close()
    with pytest.raises(errors.ClientClosed):
        await p.send("t", b"x")


async def test_a_closed_producer_is_garbage_collected():
    """The compiled send path refers back to its producer: the cycle must be collectable."""
    broker = FakeBroker({"t": 1})
    p = make(broker, linger_ms=0)
    await p.start()
    await (await p.send("t", b"x", partition=0))
    await p.close()
    gone = weakref.ref(p)
    del p
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("size", [1000, 10])  # a turn per TURN_BYTES, per TURN_RECORDS
@pytest.mark.parametrize("compiled", [True, False] if records._C is not None else [False])
async def test_a_loop_of_awaited_sends_lets_the_loop_turn(compiled, size):
    """Awaiting each ``send`` never yields while its future is done already; once per
    ``TURN_BYTES`` or ``TURN_RECORDS`` of records (and when a batch fills) it is done on the
    loop's next turn, so other tasks and the sender run while the loop goes on: batches go
    out before it ends."""
    broker = FakeBroker({"t": 1})
    turns = 0
    per_turn = min(TURN_BYTES // size, TURN_RECORDS)
    n = 5 * per_turn + per_turn // 2

    async def ticker():
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async with make(broker, linger_ms=0, batch_size=8 << 20, buffer_memory=64 << 20) as p:
        if not compiled:
            p._append_common = _python_path
            p.send = Producer.send.__get__(p)
        await (await p.send("t", b"first", partition=0))
        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = turns
        buffered = [p.send("t", b"x" * size, partition=0) for _ in range(n)]  # no await
        assert all(b.done() for b in buffered[: per_turn - 10])  # the first turn's worth: done at once
        assert not all(b.done() for b in buffered)
        stored_during = []
        for _ in range(n):
            f = await p.send("t", b"y" * size, partition=0)
            stored_during.append(len(broker.logs.get(("t", 0), [])))
        tick.cancel()
        assert turns - before >= 5  # about one turn per turn's worth
        assert stored_during[-1] > 1  # batches went out while the loop went on
        await f
    assert [r.value[:1] for r in broker.records("t", 0)].count(b"y") == n
