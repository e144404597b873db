"""A data directory records its cluster's id (storage/identity.py), and a broker never
deletes replicas because a metadata store that is not its cluster's lists none: on a
three-broker cluster with real etcd, an etcd that comes back empty stops every broker
(``CLUSTER_ID_MISMATCH``) with all their data, restarts against it are refused, and with
the cluster's own etcd back everything acknowledged is there.  A single-node directory
is refused by a cluster, and a cluster's directory by a single-node broker, also one
recorded before cluster ids existed."""

from __future__ import annotations

import asyncio
import json
import shutil

from checker import read_logs
from replicated import eventually

from sluice.client import Producer
from sluice.harness import BrokerProcess

TOPIC = "orders"


def _log_files(b: BrokerProcess) -> list:
    return sorted(p.relative_to(b.data_dir) for p in b.data_dir.rglob("*.log"))


async def test_an_etcd_that_comes_back_empty_stops_the_brokers_with_their_data(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    sent: dict[int, list[bytes]] = {}
    async with Producer(cluster.bootstrap, acks="all") as p:
        for part in range(3):
            values = sent[part] = [b"v-%d-%d" % (part, i) for i in range(200)]
            await (await p.send_many(TOPIC, values, partition=part))
    files = {n: _log_files(b) for n, b in cluster.brokers.items()}
    assert all(files.values())

    etcd = cluster.etcd
    etcd.kill()
    kept = etcd.data_dir.with_name("etcd-kept")
    etcd.data_dir.rename(kept)  # etcd's data lost: it starts empty
    await asyncio.to_thread(etcd.start)

    async def all_stopped() -> bool:
        return not any(b.alive for b in cluster.brokers.values())

    await eventually(all_stopped, 30, "every broker stopped")
    for n, b in cluster.brokers.items():
        assert b.proc.returncode == 1, (n, b.proc.returncode)
        assert "CLUSTER_ID_MISMATCH" in b.log() and "has no cluster id" in b.log(), b.log()[-3000:]
        assert "deleted topic" not in b.log()
        assert _log_files(b) == files[n]
    await asyncio.to_thread(cluster.brokers[1].refused, "CLUSTER_ID_MISMATCH")
    assert _log_files(cluster.brokers[1]) == files[1]

    etcd.kill()  # the cluster's own etcd back
    shutil.rmtree(etcd.data_dir)
    kept.rename(etcd.data_dir)
    await asyncio.to_thread(etcd.start)
    await asyncio.gather(*(cluster.start_broker(n) for n in cluster.brokers))
    await cluster.fully_replicated(TOPIC)
    logs = await read_logs(cluster.bootstrap, TOPIC)
    assert {part: [r.value for r in logs[part]] for part in sent} == sent


async def test_single_node_and_cluster_directories_do_not_cross(three_brokers, tmp_path):
    cluster = await three_brokers.start()
    single = BrokerProcess(tmp_path / "single", tmp_path / "single.log")
    single.start()
    single.stop()
    files = _log_files(single)  # the __groups partitions it created
    assert files
    single.extra_args = ["--cluster", cluster.etcd.url(cluster.name), "--node-id", "0"]
    single.refused("CLUSTER_ID_MISMATCH", "start it without --cluster")
    assert _log_files(single) == files

    member = cluster.brokers[2]
    member.stop()
    files = _log_files(member)
    alone = BrokerProcess(member.data_dir, tmp_path / "alone.log", ["--node-id", "2"])
    alone.refused("CLUSTER_ID_MISMATCH", "started without --cluster")
    assert _log_files(member) == files

    # recorded before cluster ids: still not taken as a single node's, and its cluster takes it
    meta = member.data_dir / "meta.json"
    meta.write_text('{"node_id": 2}')
    alone.refused("CLUSTER_ID_MISMATCH", "no single-node metadata")
    assert meta.read_text() == '{"node_id": 2}' and _log_files(member) == files
    await cluster.start_broker(2)
    assert json.loads(meta.read_text()) == {"node_id": 2, "cluster_id": json.loads(
        (cluster.brokers[1].data_dir / "meta.json").read_text())["cluster_id"]}
