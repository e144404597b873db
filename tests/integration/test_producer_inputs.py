"""What a new user of the Python producer hits: a missing topic fails fast, and
``SyncProducer.send_batch`` takes the shapes a user writes first (real broker processes)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.client import Producer
from sluice.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from sluice.errors import ConfigError, InvalidTopicName, UnknownTopic


def _values(bootstrap: str, topic: str, count: int) -> list[tuple[bytes | None, bytes]]:
    with SyncConsumer(bootstrap, enable_auto_commit=False) as consumer:
        consumer.assign([(topic, 0)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < count and time.monotonic() < deadline:
            got += [(r.key, r.value) for r in consumer.getmany(timeout_ms=500)]
    return got


def _create(bootstrap: str, topic: str) -> None:
    with SyncAdmin(bootstrap) as admin:
        admin.create_topic(topic)


def test_send_to_a_missing_topic_fails_fast(broker):
    async def scenario() -> None:
        async with Producer(broker.bootstrap) as producer:
            started = time.monotonic()
            with pytest.raises(UnknownTopic, match="does not exist"):
                await producer.send("no-such-topic", b"v")
            # unknown_topic_wait_ms (1 s), not max_block_ms, and all of it
            assert 1 <= time.monotonic() - started < 5
        async with Producer(broker.bootstrap, unknown_topic_wait_ms=0) as producer:
            started = time.monotonic()
            with pytest.raises(UnknownTopic):
                await producer.send("no-such-topic", b"v")
            assert time.monotonic() - started < 1

    asyncio.run(scenario())


def test_a_topic_created_meanwhile_is_waited_for(broker):
    """The short wait is there for a topic being created right now."""

    async def scenario() -> None:
        async with Producer(broker.bootstrap, unknown_topic_wait_ms=10_000) as producer:
            send = asyncio.ensure_future(producer.send("late", b"v"))
            await asyncio.to_thread(_create, broker.bootstrap, "late")
            meta = await (await send)
            assert meta.topic == "late" and meta.offset == 0

    asyncio.run(scenario())


def test_send_batch_shapes(broker):
    _create(broker.bootstrap, "shapes")
    with SyncProducer(broker.bootstrap) as producer:
        assert producer.send_batch([b"a", b"b"], topic="shapes").result(10) == 2
        assert producer.send_batch([(b"k", b"c")], topic="shapes").result(10) == 1
        assert producer.send_batch([("shapes", b"d"), ("shapes", b"e", b"k2")]).result(10) == 2
        assert producer.send_batch([("shapes", b"f", None, [("h", b"1")], 0)]).result(10) == 1
        with pytest.raises(ConfigError, match="message 1 is"):
            producer.send_batch([("shapes", b"g"), (b"k", b"v")])  # pairs need topic=
        with pytest.raises(ConfigError, match="values or \\(key, value\\) pairs"):
            producer.send_batch([(b"k", b"v", b"extra")], topic="shapes")
        with pytest.raises(ConfigError):
            producer.send_batch(["a string, not bytes"])
    assert _values(broker.bootstrap, "shapes", 6) == [
        (None, b"a"), (None, b"b"), (b"k", b"c"), (None, b"d"), (b"k2", b"e"), (None, b"f")
    ]


@pytest.mark.parametrize(
    ("args", "kw", "said"),
    [
        (("payments", 42), {}, "record value must be bytes or None, not int"),
        (("payments", b"v"), {"key": "k"}, "record key must be bytes or None, not str"),
        (("payments", b"v"), {"partition": "1"}, "partition must be an int or None, not str"),
        ((b"payments", b"v"), {}, "topic must be a str, not bytes"),
        ((None, b"v"), {}, "topic must be a str, not NoneType"),
        (("payments", b"v"), {"headers": {"a": "b"}}, "headers must be a list of (name, value) pairs"),
        (("fresh", 42), {}, "record value must be bytes or None, not int"),  # one that waited for metadata
    ],
)
def test_an_argument_of_the_wrong_type_is_named(broker, args, kw, said):
    """Not what the encoding tripped over ("object of type 'int' has no len()"); nothing
    is buffered, and the producer goes on."""
    _create(broker.bootstrap, "payments")
    _create(broker.bootstrap, "fresh")

    async def scenario() -> None:
        async with Producer(broker.bootstrap, linger_ms=0) as producer:
            with pytest.raises(TypeError) as ei:
                await producer.send(*args, **kw)
            assert str(ei.value).startswith(said), ei.value
            with pytest.raises(TypeError) as ei:  # the fire-and-forget form says the same
                await producer.send_nowait(*args, **kw)
            assert str(ei.value).startswith(said), ei.value
            assert (await (await producer.send("payments", b"fine"))).partition == 0

    asyncio.run(scenario())


def test_bulk_and_name_mistakes_are_named(broker):
    _create(broker.bootstrap, "payments")

    async def scenario() -> None:
        async with Producer(broker.bootstrap, linger_ms=0) as producer:
            with pytest.raises(TypeError, match=r"values\[1\] must be bytes, not int"):
                await producer.send_many("payments", [b"a", 5])
            t0 = time.monotonic()
            with pytest.raises(InvalidTopicName, match="'a b'"):  # at once: no topic has that name
                await producer.send("a b", b"v")
            assert time.monotonic() - t0 < 0.5

    asyncio.run(scenario())
