"""``TX-1KiB``: transactional sends per second, and latency from half message to visible.

One ``TransactionProducer`` and ``CONCURRENCY`` tasks loop on ``send_in_transaction`` with a
local transaction that commits at once, for ``SECONDS``, into a topic of ``PARTITIONS``
partitions (page-cache flush policy, as P1).  Latency of one send: from the half message's
request to the commit's answer; the commit is written ``acks=all``, so the message is below
the high watermark — a consumer can read it — when the answer comes.
"""

from __future__ import annotations

import asyncio
import os
import time

from sluice.bench.workloads import PAGE_CACHE, TOPIC, Row, percentile, reset_topic
from sluice.client import TransactionProducer
from sluice.client.transaction import LocalTransactionState

SECONDS = 10.0
CONCURRENCY = 32
PARTITIONS = 8  # a producer keeps one half in flight per partition


async def run_tx(bootstrap: str, meter, size: int = 1024, seconds: float = SECONDS) -> Row:
    await reset_topic(bootstrap, PAGE_CACHE, partitions=PARTITIONS)
    payload = os.urandom(size)
    latencies: list[float] = []
    commit = LocalTransactionState.COMMIT
    async with TransactionProducer(bootstrap, group="bench") as producer:
        await producer.send_in_transaction(TOPIC, payload, lambda msg: commit)  # warm up
        meter.start()
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                result = await producer.send_in_transaction(TOPIC, payload, lambda msg: commit)
                if result.state != "committed":
                    raise RuntimeError(f"transaction {result.txn_id} ended {result.state}")
                latencies.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        seconds = time.perf_counter() - start
        cpu = meter.stop()
    latencies.sort()
    row = Row("TX-1KiB", len(latencies), len(latencies) * size, seconds)
    row.p50_ms, row.p99_ms = round(percentile(latencies, 50), 2), round(percentile(latencies, 99), 2)
    row.p999_ms, row.max_ms = round(percentile(latencies, 99.9), 2), round(latencies[-1], 2)
    row.notes += [
        f"half message (acks=all) + local transaction + commit (acks=all); {CONCURRENCY} at once, "
        f"{PARTITIONS} partitions; latency: half sent -> commit answered (visible)",
        "page-cache ack (flush.messages=0, flush.ms=1000)", cpu,
    ]
    return row
