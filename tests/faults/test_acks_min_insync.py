"""acks=all keeps its word when the ISR shrinks under a waiting write: a follower is
SIGSTOPped while an ``acks=all`` write waits for it; the ISR shrinks (the follower's session
ends, or it lags past ``replica.lag.time.max.ms``) and the high watermark passes the write
with the leader alone in the ISR.  With ``min.insync.replicas`` equal to the replication
factor that write must not be acknowledged: it fails with
``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (retriable, maybe stored), and an idempotent producer
that retries it is answered once the follower is back and in sync, its record stored once.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from checker import read_logs
from replicated import eventually

from sluice.client import Admin, Producer
from sluice.errors import NotEnoughReplicas, NotEnoughReplicasAfterAppend, SluiceError
from sluice.harness import freeze

pytestmark = pytest.mark.timeout(180)

TOPIC = "promised"


@pytest.mark.parametrize("rf", [2, 3])
async def test_acks_all_is_never_acknowledged_by_an_isr_below_min_insync_replicas(three_brokers, rf):
    cluster = await three_brokers.start()
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, 1, {"min.insync.replicas": str(rf)}, replication_factor=rf)

    async def in_sync():
        [p] = await cluster.partitions(TOPIC)
        return p if p.leader >= 0 and sorted(p.isr) == sorted(p.replicas) else None

    part = await eventually(in_sync, 30, f"all {rf} replicas of {TOPIC}-0 in sync")
    leader = part.leader
    follower = next(r for r in part.replicas if r != leader)
    others = cluster.bootstrap_without(follower)
    options = dict(acks="all", linger_ms=0, retry_backoff_ms=100, metadata_max_age_ms=1000)
    patient = Producer(others, delivery_timeout_ms=120_000, **options)  # retries until the end
    once = Producer(others, retries=0, delivery_timeout_ms=60_000, **options)  # says what it got
    await patient.start()
    await once.start()
    try:
        await (await patient.send(TOPIC, b"warm-up", partition=0))  # both know the leader
        await (await once.send(TOPIC, b"warm-up-2", partition=0))
        freeze(cluster.brokers[follower].proc.pid, group=True)
        frozen_at = asyncio.get_running_loop().time()
        try:
            waiting = await patient.send(TOPIC, b"patient", partition=0)
            failed = await once.send(TOPIC, b"once", partition=0)
            # the ISR shrinks within the session (1 s) or the lag time (2 s): the high
            # watermark passes both writes with the leader alone in the ISR
            with pytest.raises((NotEnoughReplicasAfterAppend, NotEnoughReplicas)) as info:
                await asyncio.wait_for(failed, 30)
            assert isinstance(info.value, NotEnoughReplicasAfterAppend), info.value
            print(f"RF {rf}: NOT_ENOUGH_REPLICAS_AFTER_APPEND {asyncio.get_running_loop().time() - frozen_at:.2f} s after SIGSTOP")
            assert info.value.maybe_stored is True and info.value.retriable

            async def shrunk():
                [p] = await cluster.partitions(TOPIC, others)
                return p.leader == leader and follower not in p.isr

            await eventually(shrunk, 30, f"broker {follower} out of the ISR of {TOPIC}-0")
            await asyncio.sleep(1.0)  # the retries meet the small ISR for a while
            assert not waiting.done(), f"acknowledged with fewer than {rf} copies: {waiting.result()}"
        finally:
            os.killpg(cluster.brokers[follower].proc.pid, signal.SIGCONT)
        meta = await asyncio.wait_for(waiting, 60)  # the follower caught up and rejoined
        assert meta.offset >= 1
        logs = await read_logs(cluster.bootstrap, TOPIC)
        values = [r.value for r in logs[0]]
        assert values.count(b"patient") == 1, values  # the retry was a duplicate: stored once
        assert values.count(b"once") == 1, values  # appended before the ISR shrank: it stays
    finally:
        await patient.close()
        await once.close()


async def test_timed_out_acks_all_writes_give_back_their_purgatory_slots(three_brokers):
    """A follower stalls (and stays in the ISR: long session and lag time), so the high
    watermark is stuck.  Each acks=all write times out after the request's ``timeout_ms``;
    the partition holds at most ``replica.wait.max.requests`` (2) waiting writes.  Writes
    that timed out must leave: later ones are admitted (and time out too), not refused
    ``BROKER_BUSY`` for as long as the follower stalls."""
    cluster = await three_brokers.start(
        extra_args=["--session-timeout-ms", "60000", "--replica-lag-time-max-ms", "60000"]
    )
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic(
            TOPIC, 1, {"min.insync.replicas": "2", "replica.wait.max.requests": "2"}, replication_factor=2
        )

    async def in_sync():
        [p] = await cluster.partitions(TOPIC)
        return p if p.leader >= 0 and sorted(p.isr) == sorted(p.replicas) else None

    part = await eventually(in_sync, 30, f"both replicas of {TOPIC}-0 in sync")
    follower = next(r for r in part.replicas if r != part.leader)
    producer = Producer(
        cluster.bootstrap_without(follower), acks="all", linger_ms=0, retries=0, enable_idempotence=False,
        request_timeout_ms=1000, delivery_timeout_ms=5000,
    )
    await producer.start()
    try:
        await (await producer.send(TOPIC, b"warm-up", partition=0))
        freeze(cluster.brokers[follower].proc.pid, group=True)
        try:
            outcomes = []
            for i in range(8):  # four times the bound, one after the other
                fut = await producer.send(TOPIC, b"late-%d" % i, partition=0)
                try:
                    await asyncio.wait_for(fut, 30)
                    outcomes.append("acknowledged")
                except SluiceError as exc:
                    outcomes.append(exc.name)
        finally:
            os.killpg(cluster.brokers[follower].proc.pid, signal.SIGCONT)
        # each timed out (on the broker, or, the client's clock being first, in the client),
        # and none was refused for slots held by writes that had timed out already
        assert set(outcomes) <= {"REQUEST_TIMED_OUT", "DELIVERY_TIMEOUT"}, outcomes
        assert outcomes.count("REQUEST_TIMED_OUT") >= 5, outcomes
    finally:
        await producer.close()
