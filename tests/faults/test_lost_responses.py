"""A failed send says whether its records may have been stored: responses lost on the way
back (a fault-injecting proxy between producer and a real broker) and brokers that cannot be
reached.  A retried send of the idempotent producer is stored once; without idempotence,
at least once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from proxy import FaultyProxy

from sluice.client import Admin, Consumer, Producer
from sluice.errors import ConnectionClosed, DeliveryTimeout
from sluice.harness import eventually, free_port
from sluice.protocol.messages import Api


async def _stored(bootstrap: str, topic: str, offsets: dict | None = None) -> Counter:
    """How many times each value is in partition 0 (and, into ``offsets``, its offsets)."""
    admin = Admin(bootstrap)
    try:
        end = (await admin.describe_topic(topic)).partitions[0].high_watermark
    finally:
        await admin.close()
    consumer = Consumer(bootstrap, enable_auto_commit=False)
    consumer.assign([(topic, 0)])
    got: Counter = Counter()
    try:
        await consumer.seek_to_beginning()
        while consumer.position((topic, 0)) < end:
            for rec in await consumer.getmany(timeout_ms=2000):
                got[rec.value] += 1
                if offsets is not None:
                    offsets.setdefault(rec.value, []).append(rec.offset)
    finally:
        await consumer.close()
    return got


async def _scenario(broker, proxy_port: int) -> None:
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic("lost", partitions=1)
    proxy = await FaultyProxy("127.0.0.1", broker.port, port=proxy_port).start()
    try:
        # 1. the response to the only attempt is lost: the send fails, maybe stored (it was)
        async with Producer(proxy.address, linger_ms=0, retries=0) as producer:
            proxy.lose_responses(Api.PRODUCE)
            with pytest.raises(ConnectionClosed) as info:
                await (await producer.send("lost", b"one-attempt", partition=0))
            assert proxy.lost == 1
            assert info.value.maybe_stored is True
            assert "may have been stored" in str(info.value)

        # 2. with retries the send succeeds: stored once, at the offset of the first attempt
        async with Producer(proxy.address, linger_ms=0) as producer:
            proxy.lose_responses(Api.PRODUCE)
            meta = await (await producer.send("lost", b"retried", partition=0))
            assert meta.offset >= 0 and proxy.lost == 2

        # 2b. without idempotence the retry stores a second copy
        async with Producer(proxy.address, linger_ms=0, enable_idempotence=False) as producer:
            proxy.lose_responses(Api.PRODUCE)
            await (await producer.send("lost", b"at-least-once", partition=0))
            assert proxy.lost == 3

        # 3. the broker cannot be reached at all: never sent, so certainly not stored
        async with Producer(proxy.address, linger_ms=0, delivery_timeout_ms=1000) as producer:
            await (await producer.send("lost", b"warm-up", partition=0))  # metadata cached
            proxy.refuse = True
            proxy.cut_all()
            conns = list(producer._cluster._conns.values())
            await eventually(lambda: all(c.closed for c in conns), 10, "every connection closed", interval=0.01)
            started = time.monotonic()
            fut = await producer.send("lost", b"never-sent", partition=0)
            with pytest.raises(DeliveryTimeout) as info:
                await fut
            assert time.monotonic() - started < 5
            assert info.value.maybe_stored is False
            assert "not stored" in str(info.value)
            proxy.refuse = False
        offsets: dict = {}
        stored = await _stored(proxy.address, "lost", offsets)  # clients are told the proxy's address
    finally:
        await proxy.close()
    assert stored[b"one-attempt"] == 1
    assert stored[b"retried"] == 1 and offsets[b"retried"] == [meta.offset]
    assert stored[b"at-least-once"] == 2
    assert stored[b"never-sent"] == 0


def test_lost_response_and_unreachable_broker(broker_factory):
    proxy_port = free_port()
    broker = broker_factory(extra_args=["--advertise", f"127.0.0.1:{proxy_port}"])
    broker.start()
    asyncio.run(_scenario(broker, proxy_port))
