"""``D1``: one million delayed messages pending, then delivered when due.

``COUNT`` messages of 100 B are stored with ``DelayedProducer.send_delayed`` in batches of
one delivery time (``SLOT_MS`` apart, ``PARTITIONS`` partitions), all due between
``LEAD_S`` and ``LEAD_S + SPREAD_S`` seconds after the start.  Measured: the broker's
resident memory before the first send and once all are pending (its growth is the
figure), and each message's lateness — when a fetch consumer reading from the start got
it, minus its delivery time (in its value) — as p50 / p99 / max.  A message seen before
its time fails the workload.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time

from sluice.bench.workloads import PAGE_CACHE, TOPIC, Row, percentile, reset_topic
from sluice.client import Consumer, DelayedProducer

COUNT = 1_000_000
PARTITIONS = 4
SIZE = 100
SLOT_MS = 10
LEAD_S = 30.0  # the first message falls due this long after the start: all are stored by then
SPREAD_S = 40.0


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    import psutil

    return psutil.Process(pid).memory_info().rss


async def run_d1(
    bootstrap: str, meter, server_pid: int | None, count: int = COUNT, lead_s: float = LEAD_S,
    spread_s: float = SPREAD_S,
) -> Row:
    await reset_topic(bootstrap, PAGE_CACHE, partitions=PARTITIONS)
    rss0 = _rss(server_pid)
    slots = int(spread_s * 1000 / SLOT_MS)
    per_batch = max(1, -(-count // (slots * PARTITIONS)))  # rounded up: all `count` fit
    pad = os.urandom(SIZE - 8)
    start_ms = int(time.time() * 1000)
    first_due = start_ms + int(lead_s * 1000)
    stored = 0
    async with DelayedProducer(bootstrap) as producer:

        batches = 0

        async def store(p: int) -> int:
            nonlocal batches
            n = 0
            for s in range(slots):
                at = first_due + s * SLOT_MS
                k = min(per_batch, count // PARTITIONS - n)
                if k <= 0:
                    break
                value = struct.pack(">q", at) + pad
                await producer.send_delayed(TOPIC, [(None, value, ())] * k, deliver_at_ms=at, partition=p)
                n += k
                batches += 1
            return n

        t0 = time.perf_counter()
        stored = sum(await asyncio.gather(*(store(p) for p in range(PARTITIONS))))
        store_s = time.perf_counter() - t0
    if time.time() * 1000 >= first_due:
        raise RuntimeError(f"storing took {store_s:.1f}s: past the first delivery time")
    rss1 = _rss(server_pid)
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    late: list[float] = []
    early = 0
    consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
    await consumer.start()
    meter.start()
    t1 = time.perf_counter()
    try:
        deadline = time.monotonic() + lead_s + spread_s + 60
        while len(late) < stored and time.monotonic() < deadline:
            records = await consumer.getmany(timeout_ms=100, max_records=50_000)
            now = time.time() * 1000
            for rec in records:
                lateness = now - struct.unpack_from(">q", rec.value)[0]
                early += lateness < 0
                late.append(lateness)
        seconds = time.perf_counter() - t1
        cpu = meter.stop()
    finally:
        await consumer.close()
    if len(late) != stored or early:
        raise RuntimeError(f"D1: {len(late)} of {stored} delivered, {early} before their time")
    late.sort()
    row = Row("D1", stored, stored * SIZE, seconds)
    row.p50_ms, row.p99_ms, row.max_ms = (round(percentile(late, p), 1) for p in (50, 99, 100))
    row.p999_ms = round(percentile(late, 99.9), 1)
    row.notes += [
        f"{stored} pending: broker RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB "
        f"(+{(rss1 - rss0) / 2**20:.0f} MiB)",
        f"stored in {store_s:.1f}s as {batches} batches (up to {per_batch} per delivery time, "
        f"{PARTITIONS} partitions, {SLOT_MS} ms apart over {spread_s:.0f}s)",
        "lateness: fetch consumer receive time - delivery time (p50/p99/p99.9/max)", cpu,
    ]
    return row
