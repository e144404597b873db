"""A broker's data directory belongs to its node (storage/identity.py), on a three-broker
cluster with real etcd: a wiped directory restarted under its node id must not lose the
acknowledged messages its replicas held (it leaves their ISR and leadership, then copies
them back), and a directory started under another node id is refused, untouched."""

from __future__ import annotations

import shutil

from checker import read_logs
from replicated import eventually

from brokers import BrokerProcess
from sluice.client import Admin, Producer

TOPIC = "orders"
PER_PARTITION = 300


async def _produce(bootstrap: str) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {}
    async with Producer(bootstrap, acks="all") as p:
        for part in range(3):
            values = sent[part] = [b"v-%d-%d" % (part, i) for i in range(PER_PARTITION)]
            await (await p.send_many(TOPIC, values, partition=part))
    return sent


async def _settled(cluster) -> bool:
    """Every partition's high watermark at its log end, as its leader has them (a new
    leader's starts where its followers' first fetches in its epoch put it)."""
    leaders = {p.partition: p.leader for p in await cluster.partitions(TOPIC)}
    if any(n not in cluster.brokers for n in leaders.values()):
        return False
    for n in set(leaders.values()):
        async with Admin(cluster.brokers[n].bootstrap) as admin:
            desc = await admin.describe_topic(TOPIC)
        if any(d.high_watermark != d.log_end_offset for d in desc.partitions if leaders[d.partition] == n):
            return False
    return True


async def test_a_wiped_data_directory_restarted_under_its_node_id_loses_no_acknowledged_message(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    sent = await _produce(cluster.bootstrap)
    victim, _ = await cluster.leader_of(TOPIC, 0)
    b = cluster.brokers[victim]
    b.kill()
    shutil.rmtree(b.data_dir)  # the disk is replaced
    await cluster.start_broker(victim)  # at once: its old registration may still be live
    await cluster.fully_replicated(TOPIC)  # it copied its replicas back
    await eventually(lambda: _settled(cluster), 15, "high watermarks at the log ends")
    logs = await read_logs(cluster.bootstrap, TOPIC)
    assert {part: [r.value for r in logs[part]] for part in sent} == sent
    assert "its replica is empty" in b.log()


async def test_a_data_directory_started_under_another_node_id_is_refused_untouched(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    sent = await _produce(cluster.bootstrap)
    b = cluster.brokers[3]
    b.kill()
    before = sorted(p.relative_to(b.data_dir) for p in b.data_dir.rglob("*.log"))
    args = b.extra_args
    b.extra_args = [*args[: args.index("--node-id") + 1], "33", *args[args.index("--node-id") + 2:]]
    try:
        await cluster.start_broker(3)
    except RuntimeError as exc:
        assert "belongs to node 3" in str(exc) and "--node-id 3" in str(exc), exc
    else:
        raise AssertionError("a broker started on node 3's data directory as node 33")
    assert sorted(p.relative_to(b.data_dir) for p in b.data_dir.rglob("*.log")) == before
    b.extra_args = args
    await cluster.start_broker(3)
    await cluster.fully_replicated(TOPIC)
    await eventually(lambda: _settled(cluster), 15, "high watermarks at the log ends")
    logs = await read_logs(cluster.bootstrap, TOPIC)
    assert {part: [r.value for r in logs[part]] for part in sent} == sent


async def test_a_broker_advertising_a_live_brokers_address_is_refused(three_brokers, tmp_path):
    cluster = await three_brokers.start()
    b1 = cluster.brokers[1]
    b4 = BrokerProcess(tmp_path / "data4", tmp_path / "broker4.log", [
        "--cluster", cluster.etcd.url(cluster.name), "--node-id", "4", "--advertise", b1.bootstrap,
    ])
    try:
        b4.start()
    except RuntimeError as exc:
        assert f"{b1.bootstrap} is where live broker 1 is reached" in str(exc), exc
    else:
        raise AssertionError("a broker registered with broker 1's address")
    finally:
        b4.kill()
    assert len((await cluster.metadata()).brokers) == 3
