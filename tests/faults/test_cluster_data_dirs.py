"""A broker's data directory belongs to its node (storage/identity.py), on a three-broker
cluster with real etcd: a wiped directory restarted under its node id must not lose the
acknowledged messages its replicas held (it leaves their ISR and leadership, then copies
them back), a directory started under another node id is refused, untouched, and so is
a second broker started under a live broker's node id, leaving the cluster as it was.  A
partition left offline that way gets its live replica as leader as soon as the topic allows
unclean elections, and ``cluster rebalance`` says why it cannot give it one before."""

from __future__ import annotations

import shutil

from checker import read_logs
from replicated import eventually

from sluice.client import Admin, Producer
from sluice.errors import error_for_code
from sluice.harness import BrokerProcess

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
    # behind proxies, which accept connections for a dead broker, its peers cannot tell it
    # died (broker/liveness.py), and with a 5 s session it restarts while still registered
    # and in the ISRs
    cluster = await three_brokers.start(proxied=True, extra_args=["--session-timeout-ms", "5000"])
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
    b4.refused(f"{b1.bootstrap} is where live broker 1 is reached")
    assert len((await cluster.metadata()).brokers) == 3


async def test_a_broker_refused_a_live_brokers_node_id_changes_nothing_in_the_cluster(three_brokers, tmp_path):
    """A second ``--node-id 2`` with a new (mistyped) data directory while broker 2 runs:
    refused with NODE_ID_IN_USE before it writes anything, so broker 2 keeps leading its
    partitions and stays in every ISR."""
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    before = _states(await cluster.partitions(TOPIC))
    assert any(leader == 2 for _, leader, _, _ in before), before
    typo = BrokerProcess(tmp_path / "d2-typo", tmp_path / "typo.log", list(cluster.brokers[2].extra_args))
    typo.refused("NODE_ID_IN_USE", "node id 2 is held by a live broker")
    assert typo.proc.returncode == 1
    assert "its replica is empty" not in typo.log()
    assert _states(await cluster.partitions(TOPIC)) == before
    assert cluster.brokers[2].alive
    sent = await _produce(cluster.bootstrap)  # every partition still takes acks=all writes
    logs = await read_logs(cluster.bootstrap, TOPIC)
    assert {part: [r.value for r in logs[part]] for part in sent} == sent


def _states(parts) -> list[tuple[int, int, int, list[int]]]:
    return [(p.partition, p.leader, p.leader_epoch, sorted(p.isr)) for p in parts]


async def test_an_offline_partition_elects_its_live_replica_once_unclean_elections_are_allowed(three_brokers):
    """Topic ``one`` has a single replica; its broker comes back with a wiped directory and
    leaves the ISR (leader -1, ISR []).  No broker comes or goes after that: the config
    change alone must give the partition its leader, well before the 30 s rebalance pass."""
    cluster = await three_brokers.start()
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic("one", 1, replication_factor=1)
    [part] = await eventually(lambda: _led(cluster, "one"), 15, "one-0 led")
    node = part.leader
    b = cluster.brokers[node]
    b.kill()
    shutil.move(b.data_dir, b.data_dir.with_name("wiped"))
    await cluster.start_broker(node)
    await eventually(lambda: _offline(cluster, "one"), 15, "one-0 offline, its ISR empty")

    async with Admin(cluster.bootstrap) as admin:
        result = await admin.rebalance()
        failed = [r for r in result.elections if r.error]
        assert [(r.topic, r.partition, error_for_code(r.error).name) for r in failed] == [
            ("one", 0, "ELIGIBLE_LEADERS_NOT_AVAILABLE")
        ], result
        assert "unclean.leader.election.enable=true" in failed[0].message, failed[0].message
        assert (await _offline(cluster, "one")), "rebalance elected a replica out of sync"

        await admin.alter_topic_config("one", {"unclean.leader.election.enable": "true"})
        [part] = await eventually(lambda: _led(cluster, "one"), 10, "one-0 led after allowing unclean elections")
        assert (part.leader, list(part.isr)) == (node, [node])
        assert not [r for r in (await admin.rebalance()).elections if r.error]
    async with Producer(cluster.bootstrap, acks="all") as p:
        await (await p.send("one", b"after", partition=0))


async def _led(cluster, topic: str):
    parts = await cluster.partitions(topic)
    return parts if all(p.leader > 0 for p in parts) else None


async def _offline(cluster, topic: str) -> bool:
    [part] = await cluster.partitions(topic)
    return part.leader == -1 and not part.isr and len((await cluster.metadata()).brokers) == 3
