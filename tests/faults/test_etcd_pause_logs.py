"""A broker that started moments before etcd stops answering says so in one-line warnings:
no traceback in its log (three brokers, real etcd paused with SIGSTOP)."""

from __future__ import annotations

import asyncio


async def test_a_broker_started_just_before_an_etcd_outage_logs_no_traceback(three_brokers):
    cluster = await three_brokers.start()
    b = cluster.brokers[3]
    assert b.stop() == 0
    start = len(b.log())
    await cluster.start_broker(3)
    cluster.etcd.pause()  # before its first transaction check-back pass (6 s after start)
    try:
        await asyncio.sleep(14)
    finally:
        cluster.etcd.resume()
    said = b.log()[start:]
    assert "transaction check-back pass failed, retrying: METADATA_UNAVAILABLE" in said, said
    assert "Traceback" not in said, said
