"""A network partition in a three-broker cluster: the leader of a partition cut off from
its peers, its clients and etcd.

Each broker sits behind a ``FaultyProxy`` it advertises (peers and clients reach it only
through it) and reaches etcd through a proxy of its own; ``partition()`` on both of the
leader's proxies cuts every connection to it and refuses new ones.  Its lease expires,
another replica is elected, producers move there; healed, the old leader is fenced (it
acknowledges nothing it would lose), truncates and follows.  Its own connections to the
other brokers' proxies stay up (one proxy per broker cannot tell who connects): it keeps
fetching as a follower of the partitions others lead.
"""

from __future__ import annotations

from checker import read_logs
from replicated import Workload, eventually

TOPIC = "orders"
MAX_COPIES = 1  # producers are idempotent: a send retried after a failover is stored once


async def test_leader_cut_off_then_healed(three_brokers):
    cluster = await three_brokers.start(proxied=True)
    parts = await cluster.create_topic(TOPIC)
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1, 2], delivery_timeout_ms=10000).start()
    await workload.progress(300, 20, "before the partition")

    leader, epoch = parts[0].leader, parts[0].leader_epoch
    others = cluster.bootstrap_without(leader)
    cluster.proxies[leader].partition()
    cluster.etcd_proxies[leader].partition()
    try:

        async def moved():
            new, new_epoch = await cluster.leader_of(TOPIC, 0, others)
            return new not in (-1, leader) and new_epoch > epoch

        await eventually(moved, 15, f"a new leader of {TOPIC}-0 among the others")
        before = sum(1 for p, _ in workload.history.acked.values() if p == 0)

        def acked_on_new_leader():
            return sum(1 for p, _ in workload.history.acked.values() if p == 0) >= before + 100

        await eventually(acked_on_new_leader, 15, "producers moved to the new leader")
    finally:
        cluster.proxies[leader].heal()
        cluster.etcd_proxies[leader].heal()
    new, new_epoch = await cluster.leader_of(TOPIC, 0, others)

    async def learned():  # what the old leader itself says, once it is back with etcd
        return await cluster.leader_of(TOPIC, 0, cluster.address(leader)) == (new, new_epoch)

    await eventually(learned, 15, f"broker {leader} knowing it was deposed")
    await cluster.fully_replicated(TOPIC, timeout=30, bootstrap=others)
    assert f"following broker {new} for {TOPIC}-0 in epoch {new_epoch}" in cluster.brokers[leader].log()
    await workload.progress(300, 20, "after healing")
    await workload.stop()
    report = workload.history.check(
        await read_logs(cluster.bootstrap, TOPIC), max_acked_copies=MAX_COPIES, max_unsure_copies=MAX_COPIES
    )
    print(f"{report}; errors {dict(workload.errors)}")
