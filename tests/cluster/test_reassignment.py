"""Replacing the replicas of a broker that left, on real brokers and a real etcd: a new
broker takes them over (``sluice cluster rebalance``), catches up and joins the ISR, no
acknowledged message is lost, and the old broker, back, drops its stale copies."""

from __future__ import annotations

import json

from cluster_helpers import eventually
from test_replication import bootstrap_of, cluster_args, metadata, partitions_of, read_all

from sluice.client import Admin, Producer

TOPIC = "orders"
PARTITIONS = 6


async def produce(boot: str, prefix: str, n: int) -> list[bytes]:
    values = [f"{prefix}{i}".encode() for i in range(n)]
    async with Producer(boot, acks="all", linger_ms=1) as producer:
        futs = [await producer.send(TOPIC, v, partition=i % PARTITIONS) for i, v in enumerate(values)]
        for f in futs:
            await f
    return values


async def live_brokers(boot: str) -> list[int]:
    return sorted(b.node_id for b in (await metadata(boot)).brokers)


async def test_a_new_broker_takes_over_the_replicas_of_a_dead_one(etcd, cluster_name, broker_factory, cli):
    brokers = [broker_factory(extra_args=cluster_args(etcd, cluster_name, n)).start() for n in (1, 2, 3)]
    boot = bootstrap_of(brokers)
    await eventually(lambda: _live_are(boot, [1, 2, 3]), 10, "three live brokers")
    async with Admin(boot) as admin:
        await admin.create_topic(TOPIC, PARTITIONS, replication_factor=2)
    parts = await eventually(lambda: _in_sync(boot), 10, "full ISRs")
    lost = sorted(p.partition for p in parts if 3 in p.replicas)
    assert lost and len(lost) < PARTITIONS
    acked = await produce(boot, "m", 300)

    victim = brokers[2]
    victim.kill()
    boot = bootstrap_of(brokers[:2])
    await eventually(lambda: _live_are(boot, [1, 2]), 15, "broker 3's registration lapsing")
    newcomer = broker_factory(extra_args=cluster_args(etcd, cluster_name, 4)).start()
    await eventually(lambda: _live_are(boot, [1, 2, 4]), 10, "broker 4 registered")
    acked += await produce(boot, "n", 300)  # while broker 3's partitions have one replica

    done = cli("cluster", "rebalance", "--json", bootstrap=boot)
    assert done.returncode == 0, done.stderr.decode()
    replaced = json.loads(done.stdout)["replicas"]["replaced"]
    ours = sorted((r["partition"], r["old"], r["new"]) for r in replaced if r["topic"] == TOPIC)
    assert [p for p, _, _ in ours] == lost
    for _, old, new in ours:
        assert new == [4 if r == 3 else r for r in old]

    after = await eventually(lambda: _in_sync(boot), 30, "broker 4 in sync")
    for p in after:
        assert 3 not in p.replicas
        assert (4 in p.replicas) == (p.partition in lost)
    for p in lost:
        assert (newcomer.data_dir / "logs" / f"{TOPIC}-{p}").is_dir()

    acked += await produce(boot, "o", 300)
    records = await read_all(boot, TOPIC, PARTITIONS, len(acked))
    assert sorted(r.value for r in records) == sorted(acked)

    # broker 4 holds complete copies: with the first replica of each moved partition
    # gone, it leads them and serves everything acknowledged
    brokers[0].kill()
    boot = bootstrap_of([brokers[1], newcomer])
    await eventually(lambda: _led(boot), 30, "leaders without broker 1")
    records = await read_all(boot, TOPIC, PARTITIONS, len(acked))
    assert sorted(r.value for r in records) == sorted(acked)
    brokers[0].start()
    boot = bootstrap_of([brokers[0], brokers[1], newcomer])

    victim.start()  # back: its stale copies go to the trash, it is in no list of the topic
    for p in lost:
        assert not (victim.data_dir / "logs" / f"{TOPIC}-{p}").exists()
    assert "reassigned away from this broker" in victim.log()
    await eventually(lambda: _live_are(boot, [1, 2, 3, 4]), 10, "broker 3 back")
    final = await eventually(lambda: _in_sync(boot), 30, "full ISRs again")
    assert [p.replicas for p in final] == [p.replicas for p in after]


async def _live_are(boot: str, nodes: list[int]) -> bool:
    return await live_brokers(boot) == nodes


async def _in_sync(boot: str):
    parts = await partitions_of(boot, TOPIC)
    if all(p.leader >= 0 and sorted(p.isr) == sorted(p.replicas) for p in parts):
        return parts
    return None


async def _led(boot: str):
    parts = await partitions_of(boot, TOPIC)
    return parts if all(p.leader in (2, 4) for p in parts) else None
