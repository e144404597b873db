"""The README's consumer loop (``async for record in consumer``) rides out a broker restart,
both a clean one (SIGTERM) and a crash (SIGKILL); and it surfaces a clear error once the
broker has been gone for ``retry_timeout_ms`` (real broker processes)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.client import Admin, Consumer, Producer
from sluice.errors import ConnectionClosed
from sluice.harness import eventually


async def _produce(bootstrap: str, values: list[bytes]) -> None:
    async with Producer(bootstrap) as producer:
        for v in values:
            await (await producer.send("orders", v, key=b"customer-42"))


async def _scenario(broker, restart) -> None:
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic("orders", partitions=3)
    before = [b"before-%d" % i for i in range(20)]
    after = [b"after-%d" % i for i in range(20)]
    await _produce(broker.bootstrap, before)

    seen: list[bytes] = []
    consumer = Consumer(broker.bootstrap, group="billing", auto_offset_reset="earliest")
    consumer.subscribe(["orders"])
    await consumer.start()

    async def loop() -> None:  # the README's loop, as written there
        async for record in consumer:
            seen.append(record.value)
            await consumer.commit()

    task = asyncio.ensure_future(loop())
    try:
        await eventually(lambda: len(seen) == len(before) or task.done(), 30, "the first records", interval=0.02)
        await asyncio.to_thread(restart)
        await _produce(broker.bootstrap, after)
        await eventually(
            lambda: len(seen) == len(before) + len(after) or task.done(), 30, "every record", interval=0.02
        )
        assert not task.done(), task.exception()
    finally:
        await consumer.close()
        await task
    assert sorted(seen) == sorted(before + after)  # each once: commits survived too


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_readme_consumer_loop_survives_a_broker_restart(broker, how):
    def restart() -> None:
        if how == "sigterm":
            broker.stop()
        else:
            broker.kill()
        time.sleep(2)  # the broker stays down a while: the loop must wait, not end
        broker.start()

    asyncio.run(_scenario(broker, restart))


async def _gives_up(broker) -> None:
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic("orders", partitions=1)
    consumer = Consumer(broker.bootstrap, retry_timeout_ms=1500)
    consumer.assign([("orders", 0)])
    await consumer.start()
    try:
        assert await consumer.getmany(timeout_ms=100) == []
        broker.kill()
        started = time.monotonic()
        with pytest.raises(ConnectionClosed, match="retry_timeout_ms=1500"):
            while True:  # returns [] on each timeout until the broker has been gone too long
                assert await consumer.getmany(timeout_ms=200) == []
        assert 1.5 <= time.monotonic() - started < 10
    finally:
        await consumer.close()


def test_consumer_surfaces_the_error_after_retry_timeout(broker):
    asyncio.run(_gives_up(broker))
