"""Consumer and OFFSET_NOT_AVAILABLE: a new leader whose high watermark is still catching
up answers it for offsets it has but may not show yet.  The consumer keeps its position
(no reset, nothing skipped or replayed) and backs off before fetching the same offset."""

from __future__ import annotations

import asyncio
import logging
import time

from sluice import errors
from sluice.client import Consumer, Producer
from sluice.harness import eventually
from sluice.protocol import messages

from .fakebroker import FakeBroker


class CatchingUpBroker(FakeBroker):
    """Answers fetches at or above ``visible`` with OFFSET_NOT_AVAILABLE while it is set."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.visible: int | None = None
        self.refused = 0

    async def handle(self, req, attachments):
        if type(req) is messages.FetchRequest and self.visible is not None:
            p = req.partitions[0]
            if p.offset >= self.visible:
                self.refused += 1
                err = errors.OffsetNotAvailable.code
                return messages.FetchResponse(partitions=[messages.FetchPartitionResult(
                    topic=p.topic, partition=p.partition, error=err, message="catching up",
                    high_watermark=self.visible,
                )]), memoryview(b"")
        return await super().handle(req, attachments)


async def _fill(broker, n: int, first: int = 0) -> None:
    async with Producer("fake:1", connection_factory=broker.factory) as p:
        await (await p.send_many("t", [b"%d" % i for i in range(first, first + n)], partition=0))


async def test_offset_not_available_is_retried_at_the_same_offset_with_backoff():
    broker = CatchingUpBroker({"t": 1})
    await _fill(broker, 10)
    consumer = Consumer(
        "fake:1", connection_factory=broker.factory, fetch_max_wait_ms=0,
        auto_offset_reset="earliest",  # a reset would replay from 0: visible if it happened
    )
    async with consumer as c:
        c.assign([("t", 0)])
        got = await c.getmany(timeout_ms=1000)
        assert [r.offset for r in got] == list(range(10))
        broker.visible = 10  # a new leader: offsets from 10 not available yet
        await _fill(broker, 5, first=10)
        started = time.monotonic()
        assert await c.getmany(timeout_ms=500) == []
        assert c.position(("t", 0)) == 10, "no reset while the offset is not available"
        # backed off between fetches (0.1 s at first), not spinning at max_wait_ms=0
        assert 1 <= broker.refused <= 10, broker.refused
        assert time.monotonic() - started >= 0.4
        broker.visible = None  # caught up
        got = []

        async def five() -> bool:
            got.extend(await c.getmany(timeout_ms=200))
            return len(got) >= 5

        await eventually(five, 5, "5 records after the catch-up", interval=0)
        assert [(r.offset, r.value) for r in got] == [(10 + i, b"%d" % (10 + i)) for i in range(5)]


async def test_offset_not_available_does_not_fail_the_consumer():
    """Retriable: a consumer waiting longer than retry_timeout_ms for the high watermark
    does not give up (each answer is a live broker saying 'later')."""
    broker = CatchingUpBroker({"t": 1})
    await _fill(broker, 3)
    broker.visible = 0
    async with Consumer(
        "fake:1", connection_factory=broker.factory, fetch_max_wait_ms=0, retry_timeout_ms=200,
        auto_offset_reset="earliest",
    ) as c:
        c.assign([("t", 0)])
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            assert await c.getmany(timeout_ms=100) == []
        broker.visible = None
        got = []
        for _ in range(20):
            got += await c.getmany(timeout_ms=100)
            if len(got) == 3:
                break
        assert [r.offset for r in got] == [0, 1, 2]
    await asyncio.sleep(0)


def test_broker_unavailable_is_one_warning_while_failures_and_successes_alternate(caplog):
    """With one leader down, the fetches of the others succeed between its failures: each
    failure starts a new episode, but the warning comes once (WARN_EVERY_S), not each time."""
    consumer = Consumer("127.0.0.1:1")
    with caplog.at_level(logging.INFO, logger="sluice.client.consumer"):
        for _ in range(5):
            consumer._retries.failed(errors.NotLeader("no leader known for t-0"))
            consumer._retries.succeeded()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "broker unavailable" in warnings[0].getMessage()
