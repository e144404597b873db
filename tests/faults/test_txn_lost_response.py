"""A half message whose produce response is lost is retried and stored once: halves are sent
idempotently (a real broker behind a fault-injecting proxy)."""

from __future__ import annotations

import asyncio

from proxy import FaultyProxy

from sluice.client.transaction import LocalTransactionState as S
from sluice.client.transaction import TransactionProducer
from sluice.harness import free_port
from sluice.protocol.messages import Api
from txn_helpers import list_open, make_topic, read_all


async def _scenario(broker, proxy_port: int) -> None:
    await make_topic(broker.bootstrap)
    proxy = await FaultyProxy("127.0.0.1", broker.port, port=proxy_port).start()
    try:
        async with TransactionProducer(proxy.address, group="pay", retry_timeout_ms=20000) as p:
            first = await p.send_in_transaction("orders", b"warm-up", lambda m: S.COMMIT)
            proxy.lose_responses(Api.PRODUCE)
            result = await p.send_in_transaction("orders", b"charge-1", lambda m: S.COMMIT)
            assert proxy.lost == 1, "the half's first response was lost"
            later = await p.send_in_transaction("orders", b"charge-2", lambda m: S.COMMIT)
        assert result.state == later.state == first.state == "committed"
        # the lost attempt was stored: the retry was answered with its offset, not a copy
        assert result.offset > first.offset and later.offset > result.offset
        assert await list_open(broker.bootstrap) == [], "no second half left unresolved"
        seen = [r.value for r in await read_all(broker.bootstrap, "orders", wait=0.5)]
        assert seen == [b"warm-up", b"charge-1", b"charge-2"]
    finally:
        await proxy.close()


def test_a_half_whose_response_is_lost_is_stored_once(broker_factory):
    proxy_port = free_port()
    broker = broker_factory(extra_args=["--advertise", f"127.0.0.1:{proxy_port}"])
    broker.start()
    asyncio.run(_scenario(broker, proxy_port))
