"""What the Python clients say when a send or a read cannot be done (real broker
processes): a missing or deleted topic or partition, a request refused whole, a broker
gone, a send refused before anything was buffered."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, SyncProducer
from sluice.client.subscriber import Subscriber
from sluice.client.transport import Connection
from sluice.protocol import messages
from sub_helpers import make_topic

from .test_client import check_error, create

pytestmark = pytest.mark.timeout(60)


def test_producer_errors(broker):
    b = broker.bootstrap
    asyncio.run(create(b, "small", config={"max.message.bytes": "1024"}))

    async def main():
        async with Producer(b, delivery_timeout_ms=1000, linger_ms=0) as producer:
            t0 = time.monotonic()
            with pytest.raises(errors.UnknownTopic) as ei:
                await producer.send("nope", b"x")
            assert time.monotonic() - t0 < 5
            check_error(ei, errors.UnknownTopic, 4)
            with pytest.raises(errors.MessageTooLarge) as ei:
                await producer.send("small", b"a" * 5000)
            check_error(ei, errors.MessageTooLarge, 10)
            with pytest.raises(errors.MessageTooLarge):
                await producer.send_many("small", [b"ok", b"a" * 5000])
            with pytest.raises(errors.UnknownPartition):
                await producer.send("small", b"x", partition=3)
            # the producer is still usable
            meta = await (await producer.send("small", b"fine"))
            assert (meta.partition, meta.offset) == (0, 0)

    asyncio.run(main())


def test_a_send_to_a_topic_deleted_under_the_producer_fails_after_the_wait(broker):
    """Not retried until delivery_timeout_ms (2 minutes) with metadata asked back to back:
    UNKNOWN_TOPIC once fresh metadata has said so for unknown_topic_wait_ms, nothing stored,
    and at most one metadata request per retry_backoff_ms meanwhile."""
    b = broker.bootstrap
    asyncio.run(create(b, "gone"))

    async def main():
        async with Producer(b, linger_ms=0) as producer:
            await (await producer.send("gone", b"kept"))
            async with Admin(b) as admin:
                await admin.delete_topic("gone")
            refreshes = 0
            refresh = producer._cluster.refresh

            async def counted(*args, **kwargs):
                nonlocal refreshes
                refreshes += 1
                return await refresh(*args, **kwargs)

            producer._cluster.refresh = counted
            t0 = time.monotonic()
            with pytest.raises(errors.UnknownTopic) as ei:
                await asyncio.wait_for(await producer.send("gone", b"late"), 15)
            took = time.monotonic() - t0
            assert ei.value.maybe_stored is False
            assert "unknown_topic_wait_ms" in ei.value.message
            assert 0.9 < took < 5, took
            assert refreshes <= took / 0.1 + 3, (refreshes, took)

    asyncio.run(main())


def test_a_request_the_broker_refuses_whole_was_not_stored(broker_factory):
    """A produce frame past the broker's cap is answered INVALID_REQUEST before any of it
    is read: its records were not stored (maybe_stored False), not "may have been"."""
    broker = broker_factory(extra_args=["--max-frame-bytes", "2048"]).start()
    asyncio.run(create(broker.bootstrap, "capped"))

    async def main():
        async with Producer(broker.bootstrap, linger_ms=0, retries=0) as producer:
            with pytest.raises(errors.InvalidRequest) as ei:
                await (await producer.send("capped", b"x" * 10_000))
            assert "exceeds the 2048-byte cap" in ei.value.message
            assert ei.value.maybe_stored is False

    asyncio.run(main())


def test_a_producer_says_once_that_the_broker_is_unavailable(broker_factory, caplog):
    """Sends retried while the broker is down are not silent: one warning (not one per
    retry) names the failure and how long each send is retried."""
    broker = broker_factory().start()
    asyncio.run(create(broker.bootstrap, "down"))

    async def main():
        async with Producer(broker.bootstrap, linger_ms=0, delivery_timeout_ms=3000) as producer:
            await (await producer.send("down", b"before"))
            broker.kill()
            with caplog.at_level(logging.WARNING, logger="sluice.client.producer"):
                with pytest.raises(errors.DeliveryTimeout):
                    await (await producer.send("down", b"during"))
        warned = [r.getMessage() for r in caplog.records if "broker unavailable" in r.getMessage()]
        assert len(warned) == 1, warned
        assert "delivery_timeout_ms=3000" in warned[0]

    asyncio.run(main())


def test_a_consumer_of_a_missing_topic_or_partition_says_so_at_once(broker):
    """Not ``NOT_LEADER`` retried for retry_timeout_ms as if a broker were down."""
    b = broker.bootstrap
    asyncio.run(create(b, "two", partitions=2))

    async def main():
        for tp, exc, code in ((("nope", 0), errors.UnknownTopic, 4), (("two", 5), errors.UnknownPartition, 5)):
            consumer = Consumer(b)
            consumer.assign([tp])
            try:
                t0 = time.monotonic()
                with pytest.raises(exc) as ei:
                    await consumer.getmany(timeout_ms=10_000)
                assert time.monotonic() - t0 < 5
                check_error(ei, exc, code)
                assert tp[0] in str(ei.value)
            finally:
                await consumer.close()

    asyncio.run(main())


def test_a_missing_partition_is_worded_alike_everywhere(broker):
    """Producer, consumer, admin and the broker's own answer (a raw fetch) say it the same
    way, and a one-partition topic reads as such, not "partitions 0-0"."""
    b = broker.bootstrap
    asyncio.run(create(b, "one"))
    asyncio.run(create(b, "three", partitions=3))

    async def main():
        said = []
        async with Producer(b, linger_ms=0) as producer:
            for topic in ("one", "three"):
                with pytest.raises(errors.UnknownPartition) as ei:
                    await producer.send(topic, b"x", partition=7)
                said.append(ei.value.message)
        consumer = Consumer(b)
        consumer.assign([("three", 7)])
        try:
            with pytest.raises(errors.UnknownPartition) as ei:
                await consumer.getmany(timeout_ms=10_000)
            said.append(ei.value.message)
        finally:
            await consumer.close()
        async with Admin(b) as admin:
            with pytest.raises(errors.UnknownPartition) as ei:
                await admin.list_offsets("three", [7])
            said.append(ei.value.message)
        conn = await Connection.open("127.0.0.1", broker.port)
        try:
            fetch = messages.FetchRequest(partitions=[messages.FetchPartition(topic="three", partition=7, offset=0)])
            resp, _ = await conn.request(fetch, ())
            said.append(resp.partitions[0].message)
        finally:
            conn.close()
        return said

    said = asyncio.run(main())
    assert said[0] == "topic 'one' has partition 0 only, not 7"
    assert said[1:] == ["topic 'three' has partitions 0-2, not 7"] * 4


def test_a_consumer_learns_of_new_partitions_and_created_and_deleted_topics(broker):
    """Judged on fresh metadata, after unknown_topic_wait_ms: a partition added after the
    consumer last asked is read, not UNKNOWN_PARTITION; a topic created within the wait is
    read; a topic deleted under a running consumer is UNKNOWN_TOPIC, not silence."""
    b = broker.bootstrap
    asyncio.run(create(b, "grow"))

    async def main():
        async with Producer(b, linger_ms=0) as producer:
            await (await producer.send("grow", b"p0", partition=0))
            consumer = Consumer(b, fetch_max_wait_ms=100, unknown_topic_wait_ms=3000)
            try:
                consumer.assign([("grow", 0)])
                assert [r.value for r in await consumer.getmany(timeout_ms=5000)] == [b"p0"]
                async with Admin(b) as admin:
                    await admin.add_partitions("grow", total=3)
                await (await producer.send("grow", b"p2", partition=2))
                consumer.assign([("grow", 0), ("grow", 2)])
                got = await consumer.getmany(timeout_ms=5000)
                assert [(r.partition, r.value) for r in got] == [(2, b"p2")]

                consumer.assign([("later", 0)])  # created while the consumer waits for it
                waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=5000))
                await asyncio.sleep(0.5)
                await create(b, "later")
                await (await producer.send("later", b"hello", partition=0))
                got = await waiting
                while not got:
                    got = await consumer.getmany(timeout_ms=5000)
                assert [r.value for r in got] == [b"hello"]

                async with Admin(b) as admin:
                    await admin.delete_topic("later")
                t0 = time.monotonic()
                with pytest.raises(errors.UnknownTopic):
                    for _ in range(20):
                        await consumer.getmany(timeout_ms=1000)
                assert time.monotonic() - t0 < 10
            finally:
                await consumer.close()

    asyncio.run(main())


def test_a_send_refused_before_anything_was_buffered_is_not_stored(broker):
    """``maybe_stored`` is False, not None, on errors that kept records out of the buffer."""
    b = broker.bootstrap
    asyncio.run(create(b, "small", config={"max.message.bytes": "1024"}))

    async def main():
        producer = Producer(b, linger_ms=0, delivery_timeout_ms=1000, unknown_topic_wait_ms=200)
        await producer.start()
        failures = []
        try:
            for call in (
                lambda: producer.send("nope", b"x"),
                lambda: producer.send("small", b"a" * 5000),
                lambda: producer.send_many("small", [b"a" * 5000]),
                lambda: producer.send_many("small", [b"x"], partition=9),
                lambda: producer.send_nowait("small", b"b" * 5000),
            ):
                with pytest.raises(errors.SluiceError) as ei:
                    await call()
                failures.append(ei.value)
        finally:
            await producer.close()
        with pytest.raises(errors.ClientClosed) as ei:
            await producer.send("small", b"x")
        failures.append(ei.value)
        assert [(type(e).__name__, e.maybe_stored) for e in failures] == [
            ("UnknownTopic", False), ("MessageTooLarge", False), ("MessageTooLarge", False),
            ("UnknownPartition", False), ("MessageTooLarge", False), ("ClientClosed", False),
        ]

    asyncio.run(main())
    sync = SyncProducer(b)
    sync.close()
    for call in (lambda: sync.send("small", b"x"), lambda: sync.send_many("small", [b"x"]),
                 lambda: sync.send_batch([b"x"], topic="small")):
        with pytest.raises(errors.ClientClosed) as ei:
            call()
        assert ei.value.maybe_stored is False


# ---------------------------------------------------------------------- producer


async def test_a_subscriber_of_a_missing_or_deleted_topic_fails_after_the_wait(broker):
    """UNKNOWN_TOPIC once the topic has been missing for unknown_topic_wait_ms, at start and
    when the topic is deleted under a running subscriber; not None from every get."""
    bs = broker.bootstrap
    t0 = time.monotonic()
    with pytest.raises(errors.UnknownTopic, match="unknown_topic_wait_ms"):
        async with Subscriber(bs, "nosuch", "s") as sub:
            await sub.get(timeout=10)
    assert 0.9 < time.monotonic() - t0 < 5
    await make_topic(bs, "short-lived")
    async with Subscriber(bs, "short-lived", "s") as sub:
        assert await sub.get(timeout=0.2) is None
        async with Admin(bs) as admin:
            await admin.delete_topic("short-lived")
        t0 = time.monotonic()
        with pytest.raises((errors.UnknownTopic, errors.UnknownSubscription), match="short-lived"):
            await sub.get(timeout=30)  # its partitions' leader says so, else metadata does
        assert time.monotonic() - t0 < 15


async def test_a_raised_size_limit_applies_to_a_running_producer_at_once(broker):
    """A record over the limit the producer knows makes it ask the limit again before it
    refuses: one that ``max.message.bytes`` now allows goes through at once (not after the
    metadata's 30 s age), one that it still does not is refused."""
    b = broker.bootstrap
    await create(b, "grows", config={"max.message.bytes": "65536"})
    async with Producer(b, linger_ms=0) as producer, Admin(b) as admin:
        await (await producer.send("grows", b"small"))
        with pytest.raises(errors.MessageTooLarge):
            await producer.send("grows", b"a" * 100_000)
        await admin.alter_topic_config("grows", {"max.message.bytes": "1048576"})
        await asyncio.sleep(1.1)  # past the once-a-second limit on asking again
        t0 = time.monotonic()
        meta = await (await producer.send("grows", b"b" * 100_000))
        done = await producer.send_many("grows", [b"c" * 200_000])
        await done
        assert meta.offset == 1 and time.monotonic() - t0 < 10
        with pytest.raises(errors.MessageTooLarge):
            await producer.send("grows", b"d" * 2_000_000)
