"""Transactional sends per second and latency from half message to visible.

    python bench/txn_bench.py HOST:PORT [--seconds 10] [--concurrency 32] [--size 1024]

Against a running broker: re-creates topic ``txnbench`` (1 partition, page-cache flush
policy as P1), then ``concurrency`` tasks of one ``TransactionProducer`` loop on
``send_in_transaction`` with a local transaction that commits at once.  Latency of one send:
from the half message's request to the commit's answer (``acks=all``: the copy is below the
high watermark, so a consumer can read it then).  Prints a JSON row like bench/*.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time

from sluice.client import Admin, TransactionProducer
from sluice.client.transaction import LocalTransactionState
from sluice.errors import UnknownTopic

TOPIC = "txnbench"


def pct(values: list[float], p: float) -> float:
    return values[max(1, math.ceil(p / 100 * len(values))) - 1]


async def main(bootstrap: str, seconds: float, concurrency: int, size: int) -> dict:
    async with Admin(bootstrap) as admin:
        try:
            await admin.delete_topic(TOPIC)
        except UnknownTopic:
            pass
        await admin.create_topic(TOPIC, partitions=1, config={"flush.messages": "0", "flush.ms": "1000"})
    payload = os.urandom(size)
    latencies: list[float] = []
    async with TransactionProducer(bootstrap, group="bench") as p:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await p.send_in_transaction(TOPIC, payload, lambda msg: LocalTransactionState.COMMIT)
                assert r.state == "committed"
                latencies.append((time.perf_counter() - t0) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "system": "sluice", "workload": f"TXN-{size}B-c{concurrency}", "msgs": len(latencies),
        "seconds": round(elapsed, 3), "msgs_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(pct(latencies, 50), 2), "p99_ms": round(pct(latencies, 99), 2),
        "max_ms": round(latencies[-1], 2),
        "notes": "half message (acks=all) + local transaction + commit (acks=all), one producer",
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.bootstrap, a.seconds, a.concurrency, a.size))))
