"""Durability under SIGKILL and recovery of damaged tails, with real broker processes."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest
from checker import History, read_logs

from sluice.client import Admin, Producer
from sluice.errors import SluiceError
from sluice.storage.checkpoint import read_offsets

PARTITIONS = 3


async def _create(bootstrap: str, name: str, partitions: int, config: dict | None = None) -> None:
    admin = Admin(bootstrap)
    try:
        await admin.create_topic(name, partitions=partitions, config=config or {})
    finally:
        await admin.close()


async def _produce_until_killed(broker, topic: str, acks: str) -> History:
    """Several concurrent senders; the broker is SIGKILLed mid-stream, after it has written
    a high-watermark checkpoint. Returns the history."""
    history = History()
    producer = Producer(
        broker.bootstrap,
        acks=acks,
        linger_ms=1,
        delivery_timeout_ms=3000,
        request_timeout_ms=2000,
        retry_backoff_ms=50,
    )
    await producer.start()
    stop = asyncio.Event()

    async def sender(worker: int) -> None:
        i = 0
        while not stop.is_set():
            futs = []
            for _ in range(50):
                value = history.value(f"w{worker}", i)
                i += 1
                try:
                    futs.append((value, await producer.send(topic, value, key=value)))
                except SluiceError:
                    del history.sent[value]  # refused before it was buffered: never sent
                    return
            for value, fut in futs:
                try:
                    history.ack(value, await fut)
                except SluiceError as exc:
                    history.fail(value, exc)

    tasks = [asyncio.create_task(sender(w)) for w in range(4)]
    checkpoint = broker.data_dir / "logs" / "replication-offset-checkpoint"
    deadline = time.monotonic() + 60
    while len(history.acked) < 3000 or not checkpoint.exists():
        assert time.monotonic() < deadline, "producers made no progress"
        await asyncio.sleep(0.01)
    broker.kill()  # SIGKILL while every sender has requests in flight
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await producer.close()
    return history


@pytest.mark.parametrize("acks", ["leader", "all"])
def test_sigkill_loses_no_acknowledged_message(broker_factory, acks):
    """flush always: every acked message is read back once, in order, below the recovered
    high watermark (which never goes back); every failed send is where its
    ``maybe_stored`` says."""
    broker = broker_factory(extra_args=["--hw-checkpoint-ms", "50"]).start()
    topic = "durable"
    asyncio.run(_create(broker.bootstrap, topic, PARTITIONS, {"flush.messages": "1"}))
    history = asyncio.run(_produce_until_killed(broker, topic, acks))
    assert len(history.acked) >= 3000
    before = read_offsets(broker.data_dir / "logs" / "replication-offset-checkpoint")

    broker.start()
    logs = asyncio.run(read_logs(broker.bootstrap, topic))
    report = history.check(logs)
    assert report.duplicates == 0, report  # nothing was retried after the kill
    for p, records in logs.items():
        end = records[-1].offset + 1 if records else 0
        assert end >= before.get((topic, p), 0), "the high watermark never goes back"


def _last_segment(data_dir, topic: str, partition: int = 0):
    logs = sorted((data_dir / "logs" / f"{topic}-{partition}").glob("*.log"))
    return logs[-1]


async def _produce_values(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer(bootstrap, linger_ms=0)
    await producer.start()
    try:
        for i in range(n):
            await producer.send(topic, f"m{i:05d}".encode(), partition=0)
            if i % 50 == 49:
                await producer.flush()  # many small batches, so the tail is several batches
        await producer.flush()
    finally:
        await producer.close()


def test_torn_tail_is_cut_reported_and_broker_starts(broker):
    topic = "torn"
    asyncio.run(_create(broker.bootstrap, topic, 1))
    asyncio.run(_produce_values(broker.bootstrap, topic, 500))
    assert broker.stop() == 0
    seg = _last_segment(broker.data_dir, topic)
    size = seg.stat().st_size
    os.truncate(seg, size - 25)  # the last batch is now cut mid-way

    broker.start()
    log = broker.log()
    assert re.search(r"recovered: cut \d+ bytes", log), log
    records = asyncio.run(read_logs(broker.bootstrap, topic))[0]
    values = [r.value for r in records]
    assert 400 <= len(values) < 500
    assert values == [f"m{i:05d}".encode() for i in range(len(values))]
    assert list(seg.parent.glob("*.bad")), "the cut bytes are kept aside"
    # the log goes on at the cut
    asyncio.run(_produce_values(broker.bootstrap, topic, 1))
    after = asyncio.run(read_logs(broker.bootstrap, topic))[0]
    assert after[-1].offset == len(values) and after[-1].value == b"m00000"


def test_corrupted_byte_in_tail_is_detected_and_cut(broker):
    topic = "corrupt"
    asyncio.run(_create(broker.bootstrap, topic, 1))
    asyncio.run(_produce_values(broker.bootstrap, topic, 500))
    assert broker.stop() == 0
    seg = _last_segment(broker.data_dir, topic)
    data = bytearray(seg.read_bytes())
    data[len(data) - 120] ^= 0x5A  # inside one of the last batches' CRC-covered bytes
    seg.write_bytes(bytes(data))

    broker.start()
    assert "CRC-32C mismatch" in broker.log()
    records = asyncio.run(read_logs(broker.bootstrap, topic))[0]
    values = [r.value for r in records]
    assert 400 <= len(values) < 500
    assert values == [f"m{i:05d}".encode() for i in range(len(values))]


def test_sigterm_is_a_clean_shutdown(broker):
    topic = "clean"
    asyncio.run(_create(broker.bootstrap, topic, 1, {"flush.messages": "0", "flush.ms": "60000"}))
    asyncio.run(_produce_values(broker.bootstrap, topic, 200))
    assert broker.stop() == 0
    seg = _last_segment(broker.data_dir, topic)
    assert seg.with_suffix(".index").exists() and seg.with_suffix(".timeindex").exists()
    broker.start()
    assert "recovered: cut" not in broker.log()
    assert len(asyncio.run(read_logs(broker.bootstrap, topic))[0]) == 200
