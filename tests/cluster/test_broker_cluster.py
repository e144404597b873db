"""``sluice serve --cluster etcd://...``: brokers register in etcd and keep their topics
there, replicated over the live brokers (replication itself: test_replication.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cluster_helpers import REQUEST_MS, SESSION_MS, answered, eventually, free_ports

from sluice.client import Admin, Consumer, Producer
from sluice.cluster.etcd import EtcdStore
from sluice.cluster.store import BrokerRegistration
from sluice.errors import TopicAlreadyExists, UnknownTopic


@pytest.fixture
async def etcd_view(etcd, cluster_name):
    """A store on the brokers' cluster, to look at what they wrote."""
    store = EtcdStore(etcd.url(cluster_name), session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
    await store.start()
    yield store
    await store.close()


def cluster_args(etcd, cluster_name: str, node_id: int) -> list[str]:
    return ["--cluster", etcd.url(cluster_name), "--node-id", str(node_id), "--session-timeout-ms", "1000"]


async def test_brokers_register_and_keep_topics_in_etcd(etcd, cluster_name, broker_factory, etcd_view):
    b1 = broker_factory(extra_args=cluster_args(etcd, cluster_name, 1)).start()
    b2 = broker_factory(extra_args=cluster_args(etcd, cluster_name, 2)).start()
    assert await etcd_view.brokers() == [
        BrokerRegistration(1, "127.0.0.1", b1.port), BrokerRegistration(2, "127.0.0.1", b2.port)
    ]

    async with Admin(b1.bootstrap) as admin:
        await admin.create_topic("orders", 2, {"retention.ms": "60000"})
        assert (await admin.describe_topic("orders")).config["retention.ms"] == "60000"
    record = (await etcd_view.topics())["orders"]
    assert (record.partitions, record.config, record.replication_factor) == (2, {"retention.ms": "60000"}, 2)
    assert sorted(map(sorted, record.assignment)) == [[1, 2], [1, 2]]  # min(3, live brokers) replicas
    assert sorted(s.leader for s in await etcd_view.partition_states("orders")) == [1, 2]  # spread

    async with Admin(b2.bootstrap) as admin:  # the name is taken cluster-wide
        with pytest.raises(TopicAlreadyExists):
            await admin.create_topic("orders", 1)

    async with Producer(b1.bootstrap, linger_ms=0) as producer:
        await (await producer.send("orders", b"kept", partition=1))
    b1.kill()  # no revoke: its registration lapses, its topic stays in etcd
    await eventually(answered(etcd_view.brokers, node_ids([2])), 10, "broker 1's registration lapsing")
    b1.start()  # reads its topic back from etcd and follows or leads it again
    await eventually(answered(etcd_view.brokers, node_ids([1, 2])), 10, "broker 1 registered again")
    assert [r.value for r in await read_partition(b1.bootstrap, "orders", 1)] == [b"kept"]

    async with Admin(b1.bootstrap) as admin:
        await admin.delete_topic("orders")
        with pytest.raises(UnknownTopic):
            await admin.describe_topic("orders")
    assert await etcd_view.topics() == {}
    assert b2.stop() == 0  # a clean stop ends the registration at once
    assert await etcd_view.brokers() == [BrokerRegistration(1, "127.0.0.1", b1.port)]


async def read_partition(bootstrap: str, topic: str, partition: int) -> list:
    consumer = Consumer(bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    consumer.assign([(topic, partition)])
    await consumer.start()
    try:
        await consumer.seek_to_beginning()
        return await eventually(lambda: consumer.getmany(timeout_ms=500), 10, "a record")
    finally:
        await consumer.close()


def node_ids(ids: list[int]):
    return lambda live: [r.node_id for r in live] == ids


def test_a_taken_node_id_or_no_etcd_stops_the_broker(etcd, cluster_name, broker_factory, tmp_path):
    broker_factory(extra_args=cluster_args(etcd, cluster_name, 1)).start()
    [port] = free_ports(1)
    serve = [sys.executable, "-m", "sluice.cli.main", "serve", "--port", "0"]

    taken = subprocess.run(
        [*serve, "--data-dir", str(tmp_path / "other"), *cluster_args(etcd, cluster_name, 1)],
        capture_output=True, text=True, timeout=60,
    )
    assert taken.returncode == 1
    assert "node id 1 is held by a live broker" in taken.stderr

    down = subprocess.run(
        [*serve, "--data-dir", str(tmp_path / "down"), "--cluster", f"etcd://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60,
    )
    assert down.returncode == 1
    assert "METADATA_UNAVAILABLE" in down.stderr and f"127.0.0.1:{port}" in down.stderr

    bad = subprocess.run([*serve, "--cluster", "etcd:/nowhere"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "etcd://HOST:PORT" in bad.stderr  # a usage error
