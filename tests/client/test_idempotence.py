"""The idempotent producer against the in-memory broker (which keeps the broker's contract:
see fakebroker.py): sequences, five batches in flight, order and single copies across
retries, wrap-around, renumbering after a gap, explicit identities and fencing."""

import asyncio

import pytest

from sluice import errors
from sluice.client import Producer
from sluice.client.accumulator import Bulk
from sluice.client.sequences import GAP, LOST, RETRY, SEQUENCE_MOD, PartitionSequences
from sluice.harness import eventually
from sluice.protocol import messages, records

from .fakebroker import FakeBroker

DERIVED = 1 << 62


def make(broker, **kw):
    kw.setdefault("retry_backoff_ms", 5)
    kw.setdefault("retry_backoff_max_ms", 20)
    return Producer("fake:1", connection_factory=broker.factory, **kw)


def headers(broker, tp=("t", 0)):
    return [h for blob in broker.logs.get(tp, []) for h, _ in records.iter_batches(blob)]


def values(broker, tp=("t", 0)):
    return [r.value for r in broker.records(*tp)]


def start_sequence_at(p: Producer, tp, sequence: int) -> None:
    """Test hook: the partition's next sequence (before its first batch is drained)."""
    identity = p._sender.identity
    st = identity.partitions[tp] = PartitionSequences(identity.producer_id, identity.producer_epoch, identity.explicit)
    st.next_sequence = sequence


async def until(cond, timeout=3.0):
    await eventually(cond, timeout, interval=0.002)


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"producer_id": DERIVED - 1, "producer_epoch": 0}, "producer_id"),
        ({"producer_id": 1 << 63, "producer_epoch": 0}, "producer_id"),
        ({"producer_id": True, "producer_epoch": 0}, "producer_id"),
        ({"producer_id": DERIVED, "producer_epoch": -1}, "producer_epoch"),
        ({"producer_id": DERIVED, "producer_epoch": 32768}, "producer_epoch"),
        ({"producer_id": DERIVED}, "together"),
        ({"producer_epoch": 0}, "together"),
        ({"producer_id": DERIVED, "producer_epoch": 0, "enable_idempotence": False}, "idempotence"),
        ({"acks": "none", "enable_idempotence": True}, "acks"),
        ({"max_in_flight_per_partition": 6}, "max_in_flight_per_partition"),
        ({"max_in_flight_per_partition": 0}, "max_in_flight_per_partition"),
        ({"max_in_flight_per_partition": 2, "enable_idempotence": False}, "without idempotence"),
        ({"enable_idempotence": "yes"}, "enable_idempotence"),
    ],
)
def test_identity_and_idempotence_settings(kw, needle):
    with pytest.raises(errors.ConfigError, match=needle):
        Producer("localhost:9092", **kw)


def test_idempotence_defaults():
    assert Producer("localhost:9092").enable_idempotence is True
    assert Producer("localhost:9092").max_in_flight_per_partition == 5
    p = Producer("localhost:9092", acks="none")
    assert p.enable_idempotence is False and p.max_in_flight_per_partition == 1
    p = Producer("localhost:9092", producer_id=(1 << 63) - 1, producer_epoch=32767)
    assert p.producer_identity == ((1 << 63) - 1, 32767)


# ---------------------------------------------------------------- sequences


async def test_sequences_per_partition_from_a_broker_given_id():
    broker = FakeBroker({"t": 2})
    async with make(broker, linger_ms=0, batch_size=200) as p:
        futs = [await p.send("t", b"%02d" % i + b"x" * 50, partition=i % 2) for i in range(20)]
        metas = await asyncio.gather(*futs)
    assert sum(isinstance(r, messages.InitProducerIdRequest) for r in broker.requests) == 1
    for part in (0, 1):
        hs = headers(broker, ("t", part))
        assert {(h.producer_id, h.producer_epoch) for h in hs} == {(1000, 0)}
        expected = 0
        for h in hs:
            assert h.base_sequence == expected
            expected += h.records_count
        assert expected == 10
        assert [m.offset for m in metas if m.partition == part] == list(range(10))


async def test_a_batch_expiring_before_it_is_drained_leaves_no_gap():
    """Sequences are given when a batch is first drained, not when it opens: one that
    expires unsent takes none, and the next batch goes on at the same epoch."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"a"))
        p.linger = 10.0  # the next batch lingers past its deadline
        p._acc.linger = 10.0
        p._acc.delivery_timeout = 0.05
        with pytest.raises(errors.DeliveryTimeout, match="never sent"):
            await (await p.send("t", b"expired"))
        p._acc.linger = 0
        assert (await (await p.send("t", b"b"))).offset == 1
    assert [(h.producer_epoch, h.base_sequence) for h in headers(broker)] == [(0, 0), (0, 1)]


async def test_five_requests_in_flight_per_partition_and_no_more():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"first"))  # the identity's first request goes alone
        broker.hold = True
        futs = []
        for i in range(8):
            futs.append(await p.send("t", b"%d" % i))
            await asyncio.sleep(0.005)  # each batch closes and goes in its own request
        await until(lambda: len(broker.produce_requests) == 6)
        await asyncio.sleep(0.05)
        assert len(broker.produce_requests) == 6  # 1 answered + 5 held
        broker.release()
        await until(lambda: len(broker.produce_requests) == 7 and not broker.hold)
        broker.release()
        metas = await asyncio.wait_for(asyncio.gather(*futs), 3)
    assert [m.offset for m in metas] == list(range(1, 9))
    assert values(broker) == [b"first"] + [b"%d" % i for i in range(8)]


async def test_identity_first_request_goes_alone():
    broker = FakeBroker({"t": 1})
    broker.hold = True
    async with make(broker, linger_ms=0) as p:
        futs = []
        for i in range(4):
            futs.append(await p.send("t", b"%d" % i))
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.03)
        assert len(broker.produce_requests) == 1
        broker.release()
        await until(lambda: len(broker.produce_requests) == 2)
        broker.release()
        await asyncio.wait_for(asyncio.gather(*futs), 3)
    assert values(broker) == [b"0", b"1", b"2", b"3"]


@pytest.mark.parametrize("code", [errors.NotLeader.code, errors.BrokerShuttingDown.code])
async def test_order_and_single_copies_when_one_of_five_requests_is_refused(code):
    """The second of five requests in flight is refused: the three behind it are answered
    OUT_OF_ORDER_SEQUENCE (its sequence is missing), retried behind it, in order."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"first"))
        broker.hold = True
        futs = []
        for i in range(5):
            futs.append(await p.send("t", b"%d" % i))
            await asyncio.sleep(0.005)
        await until(lambda: len(broker.produce_requests) == 6)
        broker.produce_errors = [0, code]
        broker.release()
        metas = await asyncio.wait_for(asyncio.gather(*futs), 3)
    assert values(broker) == [b"first", b"0", b"1", b"2", b"3", b"4"]
    assert [m.offset for m in metas] == [1, 2, 3, 4, 5]
    seqs = [h.base_sequence for h in headers(broker)]
    assert seqs == [0, 1, 2, 3, 4, 5] and {h.producer_epoch for h in headers(broker)} == {0}


async def test_lost_answers_resolve_to_the_first_copy():
    """Answers lost after the broker stored the write: the retries are duplicates, answered
    with the offsets of the copies stored first; nothing is stored twice."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"first"))
        broker.hold = True
        futs = []
        for i in range(5):
            futs.append(await p.send("t", b"%d" % i))
            await asyncio.sleep(0.005)
        await until(lambda: len(broker.produce_requests) == 6)
        broker.lose_responses = 3
        broker.release()
        metas = await asyncio.wait_for(asyncio.gather(*futs), 3)
    assert values(broker) == [b"first", b"0", b"1", b"2", b"3", b"4"]
    assert [m.offset for m in metas] == [1, 2, 3, 4, 5]
    assert len(broker.produce_requests) > 6  # it did resend


async def test_send_many_is_idempotent():
    broker = FakeBroker({"t": 1})
    vals = [b"%05d" % i for i in range(3000)]
    async with make(broker, batch_size=4096) as p:
        await (await p.send("t", b"first"))
        broker.lose_responses = 2
        assert await (await p.send_many("t", vals, partition=0)) == (0, 1)
    assert values(broker) == [b"first"] + vals
    hs = headers(broker)
    assert len(hs) > 5 and {h.producer_id for h in hs} == {1000}
    expected = 0
    for h in hs:
        assert h.base_sequence == expected
        expected += h.records_count


async def test_a_duplicate_stored_too_long_ago_resolves_to_offset_minus_one():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, retry_backoff_ms=100, retry_backoff_max_ms=100) as p:
        await (await p.send("t", b"first"))
        broker.lose_responses = 1
        fut = await p.send("t", b"forgotten")
        await until(lambda: broker.lose_responses == 0)
        broker.producers[(1000, ("t", 0))].batches.clear()  # the broker forgets where
        meta = await asyncio.wait_for(fut, 3)
        bulk_fut = asyncio.get_running_loop().create_future()
        bulk = Bulk(bulk_fut, 0)
        bulk.expect(3)
        for i, base in enumerate((5, -1, 7)):
            bulk.batch_done(i, base, 2 if i < 2 else 1)
    assert meta.offset == -1
    assert values(broker) == [b"first", b"forgotten"]
    assert bulk_fut.result() == [5, 6, -1, -1, 7]


# ---------------------------------------------------------------- wrap-around


@pytest.mark.parametrize("explicit", [False, True])
async def test_sequences_wrap_at_2_31(explicit):
    broker = FakeBroker({"t": 1})
    kw = {"producer_id": DERIVED + 5, "producer_epoch": 2} if explicit else {}
    async with make(broker, linger_ms=0, **kw) as p:
        await until(lambda: p._sender.identity.producer_id is not None)
        start_sequence_at(p, ("t", 0), SEQUENCE_MOD - 3)
        futs = []
        for i in range(4):
            futs.append(await p.send_many("t", [b"%d-a" % i, b"%d-b" % i], partition=0))
            await asyncio.sleep(0.005)
        broker.lose_responses = 2  # retries across the boundary are duplicates
        futs.append(await p.send_many("t", [b"4-a", b"4-b"], partition=0))
        futs.append(await p.send_many("t", [b"5-a", b"5-b"], partition=0))
        results = await asyncio.wait_for(asyncio.gather(*futs), 3)
    assert results == [(0, 2 * i) for i in range(6)]
    assert [h.base_sequence for h in headers(broker)] == [SEQUENCE_MOD - 3, SEQUENCE_MOD - 1, 1, 3, 5, 7]
    assert len(values(broker)) == 12


# ---------------------------------------------------------------- gaps


async def test_a_batch_failing_after_its_sequence_renumbers_the_partition():
    """A batch refused until it expired leaves a gap (it certainly was not stored); the next
    batch is answered OUT_OF_ORDER_SEQUENCE, and the partition goes on at the next epoch
    from sequence 0, the refused send failing honestly as not stored."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, delivery_timeout_ms=300) as p:
        await (await p.send("t", b"first"))
        broker.produce_errors = [errors.NotLeader.code] * 10_000
        expired = await p.send("t", b"expired")
        await until(lambda: len(broker.produce_errors) < 10_000)  # refused once: its sequence taken
        real = p._cluster.connection

        async def unreachable(node):  # its retries wait past its deadline, never in flight then
            await asyncio.sleep(0.5)
            return await real(node)

        p._cluster.connection = unreachable
        p._cluster.connected = lambda node: None  # no open connection: requests connect first
        with pytest.raises(errors.DeliveryTimeout) as info:
            await expired
        assert info.value.maybe_stored is False
        await until(lambda: not p._sender.in_flight.requests)
        p._cluster.connection = real
        del p._cluster.connected
        broker.produce_errors = []
        metas = [await (await p.send("t", b"after-%d" % i)) for i in range(3)]
    assert values(broker) == [b"first", b"after-0", b"after-1", b"after-2"]
    assert [m.offset for m in metas] == [1, 2, 3]
    assert [(h.producer_epoch, h.base_sequence) for h in headers(broker)] == [(0, 0), (1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_batch_expiring_while_its_request_waits_to_go_out_is_never_written(idempotent):
    """A batch whose deadline passes after its request was made but before a byte of it went
    out fails as not stored, and that request is never written: the later sends go on."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, delivery_timeout_ms=200, enable_idempotence=idempotent) as p:
        await (await p.send("t", b"first"))
        real = p._cluster.connection

        async def slow(node):
            await asyncio.sleep(0.4)  # past the batch's deadline
            return await real(node)

        p._cluster.connection = slow
        p._cluster.connected = lambda node: None  # no open connection: requests connect first
        with pytest.raises(errors.DeliveryTimeout) as info:
            await (await p.send("t", b"expired"))
        assert info.value.maybe_stored is False
        await asyncio.sleep(0.5)  # the request would have gone out by now
        p._cluster.connection = real
        del p._cluster.connected
        assert (await (await p.send("t", b"after"))).offset == 1
    assert values(broker) == [b"first", b"after"]


async def test_requests_to_a_broker_go_out_in_the_order_they_were_made():
    """A request whose task waits for its connection holds back the later ones to that
    broker: none is written past it once a connection is open, so no sequence arrives out
    of order (which would cost a retry)."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0) as p:
        await (await p.send("t", b"first"))
        real = p._cluster.connection
        opened = asyncio.Event()

        async def slow(node):
            await opened.wait()
            return await real(node)

        p._cluster.connection = slow
        p._cluster.connected = lambda node: None  # no open connection: requests connect first
        a = await p.send("t", b"a")
        await until(lambda: p._sender.in_flight.unwritten.get(0))  # made; its task waits to write it
        del p._cluster.connected  # a connection is open now
        b = await p.send("t", b"b")
        await asyncio.sleep(0.01)
        opened.set()
        assert len(broker.produce_requests) == 1  # "first" only: b was not written past a
        assert [(await a).offset, (await b).offset] == [1, 2]
        p._cluster.connection = real
    assert values(broker) == [b"first", b"a", b"b"]
    assert len(broker.produce_requests) == 3  # no retry: nothing arrived out of order


async def test_a_batch_that_may_be_stored_is_never_renumbered():
    """A batch that failed at its deadline while in flight may be stored: the next batch
    follows it under the same identity, and its copy stays the only one."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, delivery_timeout_ms=300) as p:
        await (await p.send("t", b"first"))
        broker.hold = True
        with pytest.raises(errors.DeliveryTimeout) as info:
            await (await p.send("t", b"unanswered"))
        assert info.value.maybe_stored is True
        after = await p.send("t", b"after")
        await asyncio.sleep(0.02)
        broker.release()  # the unanswered write is stored now
        assert (await asyncio.wait_for(after, 3)).offset == 2
    assert values(broker) == [b"first", b"unanswered", b"after"]
    assert {h.producer_epoch for h in headers(broker)} == {0}


async def test_a_gap_with_an_explicit_identity_fails_the_later_sends():
    """The expired batch must have been sent (taken its sequence) before its deadline, or it
    leaves no gap: a deadline long enough for a busy machine to send it at least once."""
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, delivery_timeout_ms=1500, producer_id=DERIVED, producer_epoch=0) as p:
        await (await p.send("t", b"first"))
        broker.produce_errors = [errors.NotLeader.code] * 10_000
        with pytest.raises(errors.DeliveryTimeout):
            await (await p.send("t", b"expired"))
        await until(lambda: not p._sender.in_flight.requests)  # a request in flight at the deadline is refused too
        broker.produce_errors = []
        with pytest.raises(errors.OutOfOrderSequence, match="never renumbered") as info:
            await (await p.send("t", b"after"))
        assert info.value.maybe_stored is False
    assert values(broker) == [b"first"]


async def test_past_the_last_epoch_a_partition_takes_a_fresh_producer_id():
    broker = FakeBroker({"t": 1})
    async with make(broker, linger_ms=0, delivery_timeout_ms=300) as p:
        await (await p.send("t", b"first"))
        p._sender.identity.partitions[("t", 0)].epoch = 32767
        broker.producers[(1000, ("t", 0))].epoch = 32767
        broker.produce_errors = [errors.NotLeader.code] * 10_000
        with pytest.raises(errors.DeliveryTimeout):
            await (await p.send("t", b"expired"))
        await until(lambda: not p._sender.in_flight.requests)  # a request in flight at the deadline is refused too
        broker.produce_errors = []
        assert (await (await p.send("t", b"after"))).offset == 1
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in headers(broker)][-1] == (1001, 0, 0)


# ---------------------------------------------------------------- fencing


async def test_an_older_epoch_is_fenced():
    broker = FakeBroker({"t": 2})
    async with make(broker, linger_ms=0, producer_id=DERIVED, producer_epoch=1) as new:
        await (await new.send("t", b"new", partition=0))
    async with make(broker, linger_ms=0, producer_id=DERIVED, producer_epoch=0) as old:
        with pytest.raises(errors.ProducerFenced) as info:
            await (await old.send("t", b"old", partition=0))
        assert info.value.maybe_stored is False
        with pytest.raises(errors.ProducerFenced):
            await old.send("t", b"later", partition=1)  # every later send of it fails
        for partition in (0, 1):  # the compiled path too, whether or not a batch is open
            with pytest.raises(errors.ProducerFenced):
                await old.send("t", b"later", partition=partition)
            with pytest.raises(errors.ProducerFenced):
                await old.send_nowait("t", b"later", partition=partition)
    assert values(broker) == [b"new"] and values(broker, ("t", 1)) == []


# ---------------------------------------------------------------- sequences.py


def _batch(count=1):
    from sluice.client.accumulator import Batch

    b = Batch("t", 0, 0, 1e18)
    b.buf, b.count, b.size = b"x" * count, count, count
    return b


def test_classify_out_of_order_answers():
    st = PartitionSequences(7, 0, explicit=False)
    b0, b1, b2, b3 = (_batch(2) for _ in range(4))
    for b in (b0, b1, b2, b3):
        st.assign(b)
    assert [b.sequence for b in (b0, b1, b2, b3)] == [0, 2, 4, 6]
    assert st.classify(b1) == RETRY  # b0 is outstanding
    st.acknowledged(b0)
    assert st.classify(b1) == LOST  # nothing before it failed: the broker lost b0
    st.failed(b1)
    assert st.classify(b2) == GAP
    st.acknowledged(b3)  # stored after b1: b1 was stored too
    assert st.last_failed == -1
    st.renumber([b2])
    assert (st.epoch, st.next_sequence, b2.sequence, b2.drain_no) == (1, 0, -1, -1)
    st.assign(b2)
    assert (b2.producer_epoch, b2.sequence) == (1, 0)
    assert records.parse_header(b2.build(0)).producer_epoch == 1
