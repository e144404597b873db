"""SIGKILL under acks=all with flush.messages=1: after a restart the high watermark is
recovered (never below an acknowledged write) and no acknowledged message is lost."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from sluice.client import Admin, Consumer, Producer
from sluice.errors import SluiceError
from sluice.storage.checkpoint import read_offsets

pytestmark = pytest.mark.timeout(180)
TOPIC, PARTITIONS = "acked", 2


async def _produce_until_killed(broker) -> dict[int, list[tuple[int, bytes]]]:
    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=PARTITIONS, config={"flush.messages": "1"})
    producer = Producer(
        broker.bootstrap, acks="all", linger_ms=1, delivery_timeout_ms=3000,
        request_timeout_ms=2000, retry_backoff_ms=50,
    )
    await producer.start()
    stop = asyncio.Event()

    async def sender(worker: int) -> None:
        i = 0
        while not stop.is_set():
            futs = []
            for _ in range(40):
                value = b"w%d-%07d" % (worker, i)
                i += 1
                try:
                    futs.append((value, await producer.send(TOPIC, value, key=value)))
                except SluiceError:
                    return
            for value, fut in futs:
                try:
                    meta = await fut
                except SluiceError:
                    continue
                acked[meta.partition].append((meta.offset, value))

    tasks = [asyncio.create_task(sender(w)) for w in range(3)]
    checkpoint = broker.data_dir / "logs" / "replication-offset-checkpoint"
    deadline = time.monotonic() + 60
    # past a checkpoint write, and still writing: the kill lands mid-stream
    while sum(len(v) for v in acked.values()) < 3000 or not checkpoint.exists():
        assert time.monotonic() < deadline, "producers made no progress"
        await asyncio.sleep(0.01)
    broker.kill()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await producer.close()
    return acked


async def _read_all(bootstrap: str) -> tuple[dict[int, int], dict[int, list]]:
    async with Admin(bootstrap) as admin:
        desc = await admin.describe_topic(TOPIC)
    ends = {p.partition: p.high_watermark for p in desc.partitions}
    out: dict[int, list] = defaultdict(list)
    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while any(consumer.position((TOPIC, p)) < ends[p] for p in ends):
            assert time.monotonic() < deadline, "could not read up to the high watermark"
            for rec in await consumer.getmany(timeout_ms=1000):
                out[rec.partition].append(rec)
    return ends, out


def test_sigkill_under_acks_all_keeps_every_acknowledged_message(broker_factory):
    broker = broker_factory(extra_args=["--hw-checkpoint-ms", "50"]).start()
    acked = asyncio.run(_produce_until_killed(broker))
    before = read_offsets(broker.data_dir / "logs" / "replication-offset-checkpoint")
    assert set(before) <= {(TOPIC, p) for p in range(PARTITIONS)}

    broker.start()
    ends, logged = asyncio.run(_read_all(broker.bootstrap))
    for p in range(PARTITIONS):
        assert ends[p] >= before.get((TOPIC, p), 0), "the high watermark never goes back"
        if acked[p]:
            assert ends[p] > max(o for o, _ in acked[p]), "every acknowledged offset is below the HW"
        by_offset = {r.offset: r.value for r in logged[p]}
        assert [r.offset for r in logged[p]] == list(range(ends[p])), "dense, in order"
        for offset, value in acked[p]:
            assert by_offset.get(offset) == value, f"acknowledged {value!r} at {offset} lost"
        values = [r.value for r in logged[p]]
        assert len(values) == len(set(values)), "no message stored twice"
