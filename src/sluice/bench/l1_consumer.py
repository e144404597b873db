"""L1's consumer process: subscribe at the end, receive N messages, print their latencies.

Usage: ``python -m sluice.bench.l1_consumer BOOTSTRAP TOPIC N``.  Prints ``ready`` once
positioned, then one JSON line ``{"latencies_ms": [...]}``.  Latency is
``time.monotonic_ns()`` at receipt minus the send stamp in bytes 0-7 of the message.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from sluice.client import Consumer


async def main(bootstrap: str, topic: str, total: int) -> None:
    consumer = Consumer(bootstrap, fetch_max_wait_ms=100, enable_auto_commit=False)
    consumer.assign([(topic, 0)])
    await consumer.start()
    await consumer.seek_to_end()
    print("ready", flush=True)
    latencies: list[float] = []
    deadline = time.monotonic() + 120
    try:
        while len(latencies) < total and time.monotonic() < deadline:
            records = await consumer.getmany(timeout_ms=1000)
            now = time.monotonic_ns()
            for rec in records:
                latencies.append((now - int.from_bytes(rec.value[:8], "big")) / 1e6)
    finally:
        await consumer.close()
    print(json.dumps({"latencies_ms": latencies}), flush=True)


if __name__ == "__main__":
    from sluice.server.app import install_uvloop

    install_uvloop()
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
