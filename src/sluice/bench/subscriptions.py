"""``C2``: drain a topic through one subscription, acking every message on its own.

200,000 × 1 KiB messages are published first (page-cache flush policy, as C1), then one
``Subscriber`` (one process, default prefetch) takes them one by one and calls ``ack()``
on each; the clock stops once every ack is answered by the broker (``flush``).  Checked:
every message arrived once, and the subscription's backlog is 0 at the end.
"""

from __future__ import annotations

import time

from sluice.bench.workloads import TOPIC, Row, fill_backlog
from sluice.client import Admin
from sluice.client.subscriber import Subscriber

SUBSCRIPTION = "bench-c2"


async def run_c2(bootstrap: str, meter, count: int = 200_000, size: int = 1024) -> Row:
    fill = await fill_backlog(bootstrap, count, size)
    received = nbytes = redelivered = 0
    sub = Subscriber(bootstrap, TOPIC, SUBSCRIPTION, start="earliest", prefetch=10_000)
    meter.start()
    t0 = time.perf_counter()
    try:
        await sub.start()
        while received < count:
            batch = await sub.getmany(10_000, timeout=5.0)
            if not batch:
                raise RuntimeError(f"C2 stalled after {received} messages")
            for msg in batch:
                if msg.attempt > 1:
                    redelivered += 1
                    continue
                nbytes += len(msg.value)
                received += 1
                msg.ack()
        await sub.flush()
        seconds = time.perf_counter() - t0
        cpu = meter.stop()
    finally:
        await sub.close()
    async with Admin(bootstrap) as admin:
        backlog = sum(i.backlog for i in await admin.describe_subscription(TOPIC, SUBSCRIPTION))
    if received != count or nbytes != count * size or backlog:
        raise RuntimeError(f"C2 received {received} messages / {nbytes} bytes, backlog {backlog}")
    row = Row("C2", received, nbytes, seconds)
    row.notes += [
        f"fill {fill:.2f}s", "page-cache ack",
        "client: Subscriber(prefetch=10,000).getmany, Message.ack() per message (acks sent as ranges every 5 ms)",
        f"redelivered {redelivered}", cpu,
    ]
    return row
