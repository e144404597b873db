"""A broker's graceful shutdown (SIGTERM) in a cluster: it stops promptly, also leading a
partition that has a subscription with ``acks=all`` writes in flight, takes no leadership
while it stops, and the partition's writes go on on the new leader.

An ``acks=all`` write in flight when the leader stops completes only once the followers
fetched it: the followers are frozen for a moment around the SIGTERM so that one surely
is (it used to wait for its request timeout or the server's shutdown grace of 10 s,
because the stopping leader refused and closed the followers' fetches)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from replicated import NODES, ThreeBrokers, Workload, eventually

from sluice.client import Admin
from sluice.harness import freeze

pytestmark = pytest.mark.timeout(120)

STOP_WITHIN_S = 2.0  # generous for a loaded machine: a prompt shutdown takes well under a second


async def test_sigterm_of_a_leader_with_a_subscription_stops_promptly(three_brokers: ThreeBrokers):
    # followers leave the ISR only after 10 s (the default): their fetches alone can
    # complete the leader's writes in flight
    cluster = await three_brokers.start(extra_args=["--replica-lag-time-max-ms", "10000"])
    await cluster.create_topic("gap", partitions=1)
    # one send every 2 ms, each answered before the next; a long request timeout, so that
    # a write held by the shutdown shows as a slow stop, not as a retried send
    work = await Workload(
        cluster.bootstrap, "gap", [0], producers=1, window=1, pause_s=0.002,
        request_timeout_ms=30_000, delivery_timeout_ms=60_000,
    ).start()
    try:
        await work.progress(200, 20, "before the subscription")
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_subscription("gap", "idle")  # a backlog, and no consumer attached
        await work.progress(50, 20, "with the subscription")
        leader, _ = await cluster.leader_of("gap", 0)
        followers = [cluster.brokers[n].proc.pid for n in NODES if n != leader]
        proc = cluster.brokers[leader].proc
        for pid in followers:
            await asyncio.to_thread(freeze, pid, True)
        try:
            await asyncio.sleep(0.1)  # a write is appended on the leader, waiting for the followers
            stopped_at = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.sleep(0.1)
        finally:
            for pid in followers:
                os.killpg(pid, signal.SIGCONT)
        await asyncio.to_thread(proc.wait, 30)
        took = time.monotonic() - stopped_at
        log = cluster.brokers[leader].log()
        stopping = log[log.rindex("shutting down"):]
        assert took < STOP_WITHIN_S, f"broker {leader} took {took:.1f} s to stop:\n{stopping[-3000:]}"
        assert proc.returncode == 0 and "stopped" in stopping
        assert "leading " not in stopping, f"broker {leader} took a leadership while stopping:\n{stopping}"
        await work.progress(100, 20, "on the new leader")
    finally:
        await work.stop()
    new_leader, _ = await eventually(lambda: cluster.leader_of("gap", 0), 10, "a new leader")
    assert new_leader != leader
    assert work.acked >= 350
