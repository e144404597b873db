"""A broker stalled by SIGSTOP under a producer: no retry storm, a prompt recovery, and a
right ``maybe_stored`` on every failed send (real broker process)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from checker import History, read_logs

from sluice.client import Admin, Producer

STALL_S = 10.0
PARTITIONS = 2
MAX_UNACKED = 1000
RATE = 5000  # records per second: deadlines spread over time, as in a real service


async def _scenario(broker, delivery_timeout_ms: int) -> None:
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic("stall", partitions=PARTITIONS)
    # deliveries time out inside the stall, so sends fail both ways (in flight and queued)
    producer = Producer(broker.bootstrap, linger_ms=2, delivery_timeout_ms=delivery_timeout_ms)
    await producer.start()
    slots = asyncio.Semaphore(MAX_UNACKED)
    history = History()
    acked_at: list[float] = []  # when each ack arrived
    sent = 0
    stop = asyncio.Event()

    def done(value: bytes, fut: asyncio.Future) -> None:
        slots.release()
        if fut.exception() is None:
            acked_at.append(time.monotonic())
            history.ack(value, fut.result())
        else:
            history.fail(value, fut.exception())

    async def send_loop() -> None:
        nonlocal sent
        start = time.monotonic()
        while not stop.is_set():
            if sent % 50 == 0:
                ahead = start + sent / RATE - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)  # pacing, not waiting for a condition
            await slots.acquire()
            value = history.value("p0", sent, 100)
            sent += 1
            fut = await producer.send("stall", value)
            fut.add_done_callback(lambda f, v=value: done(v, f))

    sender = asyncio.ensure_future(send_loop())
    try:
        await asyncio.sleep(2)  # traffic flows
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(STALL_S)
        finally:
            resumed = time.monotonic()
            os.kill(broker.proc.pid, signal.SIGCONT)
        await asyncio.sleep(3)  # traffic flows again
    finally:
        stop.set()
        slots.release()
        await sender
        await producer.close()

    assert sent == len(history.acked) + len(history.failed)
    after = [t for t in acked_at if t >= resumed]
    assert after, "no acknowledgement after the broker resumed"
    assert min(after) - resumed < 1.0, f"first ack {min(after) - resumed:.2f}s after SIGCONT"
    assert history.failed, "the stall was meant to fail some sends"

    report = history.check(await read_logs(broker.bootstrap, "stall"))
    print(f"{report}; first ack {min(after) - resumed:.3f}s after SIGCONT")
    assert report.stored <= 1.1 * sent, report
    assert report.unsure < report.failed, "sends queued behind the stall were never sent"


@pytest.mark.parametrize("delivery_timeout_ms", [1500, 4000])
def test_sigstop_under_a_producer(broker, delivery_timeout_ms):
    asyncio.run(_scenario(broker, delivery_timeout_ms))
    assert broker.alive
