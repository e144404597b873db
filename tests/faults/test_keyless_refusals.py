"""Keyless records avoid partitions that refuse them; keyed records keep their partition
and report its error (3 brokers + etcd, real faults).

- **Too few in-sync replicas**: topic ``kr``, 3 partitions of 2 replicas with
  ``min.insync.replicas=2``; one broker is SIGKILLed, so the two partitions it held answer
  ``NOT_ENOUGH_REPLICAS`` once their ISR shrank, and one partition can take writes.
- **A leader that does not answer**: topic ``kn``, 3 partitions of one replica; the broker
  leading one is SIGKILLed: its connections reset and its port refuses, while metadata
  still names it the leader until its session ends (then the partition has no leader).
  (A leader that hangs is found by the same rule once a request to it times out,
  ``request_timeout_ms``.)

A producer sends keyless records in bursts of 100 (about a batch each), 0.1 s apart.  Each
refusing partition gets at most the one burst sent before its refusal was known, which
waits out its delivery timeout there (its batch has a sequence of that partition and may
not move); every later burst goes to the partitions that take writes, and is acknowledged.
With ``refused_partition_avoid_ms=0`` they are not avoided.
"""

from __future__ import annotations

import asyncio

import pytest
from replicated import NODES, eventually

from sluice import errors
from sluice.client import Admin, Producer
from sluice.client.partitioning import default_partitioner

pytestmark = pytest.mark.timeout(180)

BURSTS = 30
BURST = 100
PAD = b"x" * 150  # a burst about fills a batch of 16 KiB


async def _bursts(producer: Producer, topic: str) -> list:
    futures = []
    for i in range(BURSTS):
        futures += [await producer.send(topic, b"%04d-%03d-" % (i, j) + PAD) for j in range(BURST)]
        await asyncio.sleep(0.1)
    return futures


async def _outcomes(futures: list) -> tuple[list, list]:
    await asyncio.wait(futures)
    acked = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    return acked, failed


def _key_for(partition: int, n: int) -> bytes:
    return next(k for k in (b"key-%d" % i for i in range(1000)) if default_partitioner(k, n) == partition)


async def test_keyless_records_avoid_partitions_with_too_few_in_sync_replicas(three_brokers):
    cluster = three_brokers
    await cluster.start()
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic("kr", 3, {"min.insync.replicas": "2"}, replication_factor=2)

    async def replicated():
        parts = await cluster.partitions("kr")
        return parts if all(p.leader in NODES and len(p.isr) == 2 for p in parts) else None

    parts = await eventually(replicated, 30, "both replicas of every partition of kr in sync")
    victim = parts[0].replicas[0]
    healthy = {p.partition for p in parts if victim not in p.replicas}
    refusing = {p.partition for p in parts} - healthy
    assert healthy and refusing, [p.replicas for p in parts]
    cluster.brokers[victim].kill()
    others = cluster.bootstrap_without(victim)

    async def shrunk():
        now = {p.partition: p for p in await cluster.partitions("kr", others)}
        return all(p in now and now[p].leader not in (victim, -1) and len(now[p].isr) == 1 for p in refusing)

    await eventually(shrunk, 30, f"partitions {refusing} down to one in-sync replica")

    async with Producer(others, batch_size=16384, delivery_timeout_ms=4000, retry_backoff_max_ms=200) as producer:
        stuck = sorted(refusing)[0]
        keyed = await producer.send("kr", b"keyed", key=_key_for(stuck, 3))
        pinned = await producer.send("kr", b"pinned", partition=stuck)
        acked, failed = await _outcomes(await _bursts(producer, "kr"))
        for fut in (keyed, pinned):  # kept their partition, and say why they failed
            with pytest.raises(errors.DeliveryTimeout, match=rf"kr\[{stuck}\].*NOT_ENOUGH_REPLICAS") as caught:
                await fut
            assert caught.value.maybe_stored is False
    assert len(failed) <= BURST * len(refusing), (len(failed), failed[:1])
    assert all(isinstance(e, errors.DeliveryTimeout) and "NOT_ENOUGH_REPLICAS" in str(e) for e in failed), failed[:1]
    assert {m.partition for m in acked} == healthy
    assert len(acked) + len(failed) == BURSTS * BURST

    # refused_partition_avoid_ms=0: keyless bursts take their turns on the refusing ones too
    async with Producer(
        others, batch_size=16384, delivery_timeout_ms=4000, retry_backoff_max_ms=200, refused_partition_avoid_ms=0
    ) as producer:
        acked, failed = await _outcomes(await _bursts(producer, "kr"))
    assert len(failed) > BURST * BURSTS // 2, len(failed)


async def test_keyless_records_avoid_a_partition_whose_leader_does_not_answer(three_brokers):
    cluster = three_brokers
    await cluster.start()
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic("kn", 3, replication_factor=1)

    async def led():
        parts = await cluster.partitions("kn")
        return parts if all(p.leader in NODES for p in parts) and len({p.leader for p in parts}) == 3 else None

    parts = await eventually(led, 30, "a leader for every partition of kn, each on its own broker")
    victim = parts[0].leader
    async with Producer(
        cluster.bootstrap_without(victim), batch_size=16384, delivery_timeout_ms=4000, retry_backoff_max_ms=200,
    ) as producer:
        await producer.flush()
        for p in range(3):  # every partition's leader known and connected
            await (await producer.send("kn", b"warm", partition=p))
        cluster.brokers[victim].kill()
        keyed = await producer.send("kn", b"keyed", key=_key_for(0, 3))
        acked, failed = await _outcomes(await _bursts(producer, "kn"))
        with pytest.raises(errors.DeliveryTimeout, match=r"kn\[0\]"):
            await keyed
    assert len(failed) <= BURST, (len(failed), failed[:1])
    assert {m.partition for m in acked} == {1, 2}
    assert len(acked) + len(failed) == BURSTS * BURST
