"""Helpers of the transaction tests (``from txn_helpers import ...``): a topic, what a reader
sees, the unresolved half messages."""

from __future__ import annotations

import time

from sluice.client import Admin, Consumer
from sluice.protocol import messages as m

FAST_CHECKS = ["--txn-check-timeout-ms", "300", "--txn-check-interval-ms", "200"]


async def make_topic(bootstrap: str, name: str = "orders", partitions: int = 1) -> None:
    admin = Admin(bootstrap)
    await admin.start()
    try:
        await admin.create_topic(name, partitions=partitions)
    finally:
        await admin.close()


async def read_all(bootstrap: str, topic: str, partitions: int = 1, wait: float = 1.0) -> list:
    """Every record a reader sees in ``topic`` (until nothing new for ``wait`` seconds)."""
    c = Consumer(bootstrap, fetch_max_wait_ms=50)
    await c.start()
    try:
        c.assign([(topic, p) for p in range(partitions)])
        for p in range(partitions):
            c.seek(topic, p, 0)
        out = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < wait:
            batch = await c.getmany(timeout_ms=100)
            if batch:
                out += batch
                quiet_since = time.monotonic()
        return out
    finally:
        await c.close()


async def list_open(bootstrap: str) -> list[m.TransactionInfo]:
    """The unresolved half messages, as every broker's answer has them (Admin)."""
    async with Admin(bootstrap) as admin:
        return await admin.list_transactions()
