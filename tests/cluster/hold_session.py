"""A process holding an etcd session: ``hold_session.py URL NODE_ID PORT [--campaign]``.

Registers NODE_ID (at 127.0.0.1:PORT), campaigns for controller if asked, prints ``ready``
and waits to be killed; its lease then lapses on its own, as a crashed broker's does.
"""

from __future__ import annotations

import asyncio
import sys

from sluice.cluster.etcd import EtcdStore
from sluice.cluster.store import BrokerRegistration


async def main(url: str, node_id: int, port: int, campaign: bool) -> None:
    # a short session (its lapse is what tests watch); calls get room on a loaded machine
    store = EtcdStore(url, session_timeout_ms=1000, request_timeout_ms=5000)
    await store.start()
    await store.register_broker(BrokerRegistration(node_id, "127.0.0.1", port))
    if campaign:
        await asyncio.wait_for(store.campaign(node_id), 10)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "--campaign" in sys.argv))
