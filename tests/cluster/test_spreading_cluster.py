"""Spreading replicas onto a broker that joined, on real brokers and a real etcd: ``sluice
cluster rebalance`` records two-phase moves, broker 4 catches up and joins the ISRs, the
controller drops the old replicas, and every acknowledged message (also those produced
while the moves run) is read back."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from cluster_helpers import eventually
from test_reassignment import live_brokers
from test_replication import bootstrap_of, cluster_args, partitions_of, read_all

from sluice.client import Admin, Producer

TOPIC = "orders"
PARTITIONS = 6


async def test_a_joined_broker_takes_its_share_of_replicas(etcd, cluster_name, broker_factory, cli):
    brokers = [broker_factory(extra_args=cluster_args(etcd, cluster_name, n)).start() for n in (1, 2, 3)]
    boot = bootstrap_of(brokers)
    await eventually(lambda: _live_are(boot, [1, 2, 3]), 10, "three live brokers")
    async with Admin(boot) as admin:
        await admin.create_topic(TOPIC, PARTITIONS, replication_factor=2)
    await eventually(lambda: _settled(boot, None), 10, "full ISRs")

    acked: list[bytes] = []
    async with Producer(boot, acks="all", linger_ms=1) as producer:
        async def produce(prefix: str, n: int, pause: float = 0) -> None:
            for i in range(n):
                value = f"{prefix}{i}".encode()
                await (await producer.send(TOPIC, value, partition=i % PARTITIONS))
                acked.append(value)
                await asyncio.sleep(pause)

        await produce("m", 300)
        brokers.append(broker_factory(extra_args=cluster_args(etcd, cluster_name, 4)).start())
        await eventually(lambda: _live_are(boot, [1, 2, 3, 4]), 10, "broker 4 registered")

        during = asyncio.create_task(produce("n", 400, 0.005))  # acks=all while replicas move
        try:
            done = await asyncio.to_thread(cli, "cluster", "rebalance", "--json", bootstrap=boot)
            assert done.returncode == 0, done.stderr.decode()
            shown = json.loads(done.stdout)["replicas"]
            assert shown["replaced"] == [] and shown["not_replaced"] == []
            moving = [r for r in shown["moving"] if r["topic"] == TOPIC]
            assert len(moving) == 3, shown  # 12 replicas over 4 brokers: 3 each
            for r in moving:
                assert 4 in r["new"] and 4 not in r["old"] and len(r["new"]) == 2
                assert sum(a != b for a, b in zip(r["old"], r["new"], strict=True)) == 1
            final = await eventually(lambda: _settled(boot, 4), 60, "broker 4 in sync, old replicas dropped")
        finally:
            await during
    load = Counter(r for p in final for r in p.replicas)
    assert load == {1: 3, 2: 3, 3: 3, 4: 3}
    for r in moving:  # the planned lists, in their order
        assert list(final[r["partition"]].replicas) == r["new"]

    async with Producer(boot, acks="all", linger_ms=1) as producer:
        for i in range(60):
            await (await producer.send(TOPIC, f"o{i}".encode(), partition=i % PARTITIONS))
            acked.append(f"o{i}".encode())
    records = await read_all(boot, TOPIC, PARTITIONS, len(acked))
    assert sorted(r.value for r in records) == sorted(acked)
    for r in moving:  # the brokers that left trashed their copies
        [left] = set(r["old"]) - set(r["new"])
        assert not (brokers[left - 1].data_dir / "logs" / f"{TOPIC}-{r['partition']}").exists()
        assert (brokers[3].data_dir / "logs" / f"{TOPIC}-{r['partition']}").is_dir()


async def _live_are(boot: str, nodes: list[int]) -> bool:
    return await live_brokers(boot) == nodes


async def _settled(boot: str, node: int | None):
    """The partitions once each has 2 replicas, all in sync and led (and ``node`` holds
    3 replicas), else None."""
    parts = await partitions_of(boot, TOPIC)
    if not all(p.leader >= 0 and len(p.replicas) == 2 and sorted(p.isr) == sorted(p.replicas) for p in parts):
        return None
    if node is not None and sum(node in p.replicas for p in parts) != 3:
        return None
    return parts
