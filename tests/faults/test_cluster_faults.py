"""Faults of a three-broker cluster under acks=all producers: broker crashes, stalls and the
metadata store's outage.  Every test ends by reading every partition back from its leader
and checking the producers' history: no acknowledged message lost (each is at the offset it
was acknowledged with), failed sends where their ``maybe_stored`` says, offsets dense, each
producer's messages in order (checker.py), and none stored twice: the producers are
idempotent, so a send retried after a failover whose first attempt survived on the new
leader is answered with that first copy's offset (the new leader folded the producer state
from the batches it replicated)."""

from __future__ import annotations

import asyncio
import os
import signal

from replicated import LAG_MS, SESSION_MS, Workload, eventually

from sluice.client import Admin, Producer

TOPIC = "orders"



async def test_leader_sigkilled_five_times(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1, 2]).start()
    await workload.progress(200, 20, "before the first kill")
    for round in range(5):
        victim, epoch = await cluster.leader_of(TOPIC, 0)
        cluster.brokers[victim].kill()

        async def moved(victim=victim, epoch=epoch):
            leader, new_epoch = await cluster.leader_of(TOPIC, 0, cluster.bootstrap_without(victim))
            return leader not in (-1, victim) and new_epoch > epoch

        await eventually(moved, 10, f"a new leader of {TOPIC}-0 (round {round})")
        await workload.progress(200, 20, f"after kill {round}")
        await cluster.start_broker(victim)
        await cluster.fully_replicated(TOPIC)  # it rejoined every ISR
        await workload.progress(100, 20, f"after restart {round}")
    await workload.finish(cluster.bootstrap)


def _acked_in(workload: Workload, partition: int) -> int:
    return sum(1 for p, _ in workload.history.acked.values() if p == partition)


async def test_follower_then_leader_sigstopped(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1, 2]).start()
    await workload.progress(200, 20, "before the stalls")

    # a follower of partition 0 stalls past the lag timeout: it leaves the ISR, acks go on
    leader, epoch = await cluster.leader_of(TOPIC, 0)
    follower = next(n for n in cluster.brokers if n != leader)
    others = cluster.bootstrap_without(follower)
    os.killpg(cluster.brokers[follower].proc.pid, signal.SIGSTOP)
    try:

        async def shrunk():
            [p0] = [p for p in await cluster.partitions(TOPIC, others) if p.partition == 0]
            return follower not in p0.isr and len(p0.isr) == 2

        await eventually(shrunk, 3 * LAG_MS / 1000, f"broker {follower} out of the ISR of {TOPIC}-0")
        before = _acked_in(workload, 0)
        # sends of the stalled broker's own partitions wait for their request timeout (3 s)
        await eventually(lambda: _acked_in(workload, 0) >= before + 50, 10, "acks with ISR 2")
        assert await cluster.leader_of(TOPIC, 0, others) == (leader, epoch)
    finally:
        os.killpg(cluster.brokers[follower].proc.pid, signal.SIGCONT)
    await cluster.fully_replicated(TOPIC)

    # now the leader stalls past the lag and session timeouts: another is elected; the old
    # one, resumed, is fenced (acknowledges nothing it would lose) and follows
    leader, epoch = await cluster.leader_of(TOPIC, 0)
    others = cluster.bootstrap_without(leader)
    os.killpg(cluster.brokers[leader].proc.pid, signal.SIGSTOP)
    try:

        async def moved():
            new, new_epoch = await cluster.leader_of(TOPIC, 0, others)
            return new not in (-1, leader) and new_epoch > epoch

        await eventually(moved, 10, f"a new leader of {TOPIC}-0")
        before = _acked_in(workload, 0)
        await eventually(lambda: _acked_in(workload, 0) >= before + 50, 10, "acks from the new leader")
    finally:
        os.killpg(cluster.brokers[leader].proc.pid, signal.SIGCONT)
    # a producer that knows only the deposed leader, at once: whatever it is told is checked
    probe = Workload(
        cluster.address(leader), TOPIC, [0], producers=1, delivery_timeout_ms=5000, name="probe",
        history=workload.history,
    )
    await probe.start()
    await probe.progress(20, 15, "from a producer bootstrapped at the deposed leader")
    await probe.stop()
    new, new_epoch = await cluster.leader_of(TOPIC, 0, others)

    async def learned():  # what the old leader itself says (it may answer stale at first)
        return await cluster.leader_of(TOPIC, 0, cluster.address(leader)) == (new, new_epoch)

    await eventually(learned, 15, f"broker {leader} knowing it was deposed")
    await cluster.fully_replicated(TOPIC, bootstrap=others)
    assert f"following broker {new} for {TOPIC}-0 in epoch {new_epoch}" in cluster.brokers[leader].log()
    await workload.finish(cluster.bootstrap)
    # a send caught by a stall is retried on the new leader within its delivery timeout (8 s):
    # the producer does not go back to the stalled broker, for a send or for metadata
    assert not workload.errors, workload.errors



async def test_etcd_killed_and_restarted(three_brokers):
    cluster = await three_brokers.start()
    before = await cluster.create_topic(TOPIC)
    await cluster.create_topic("fresh", partitions=1)
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1, 2]).start()
    await workload.progress(200, 20, "before etcd goes")

    cluster.etcd.kill()
    try:
        # every replica is up: acks=all goes on well past the session timeout
        await workload.progress(300, 4 * SESSION_MS / 1000, "while etcd is down")
        await asyncio.sleep(2 * SESSION_MS / 1000)
        await workload.progress(300, 5, "while etcd is still down")
        assert not workload.errors, f"sends failed while etcd was down: {workload.errors}"
        # each broker answers from what it last saw, and says that it cannot reach etcd
        for node in cluster.brokers:
            async with Admin(cluster.address(node)) as admin:
                status = await admin.cluster_status()
            assert not status.healthy and "etcd" in status.store_error, (node, status)
            assert status.controller == -1  # none can act without the store
        # a producer that starts now gets its id from a block its broker reserved at start
        async with Producer(cluster.bootstrap, linger_ms=0, delivery_timeout_ms=5000) as fresh:
            assert (await (await fresh.send("fresh", b"new producer", partition=0))).offset == 0
    finally:
        await asyncio.to_thread(cluster.etcd.start)

    async def store_answers():
        async with Admin(cluster.bootstrap) as admin:
            return not (await admin.cluster_status()).store_error

    await eventually(store_answers, 10, "cluster status with etcd back")
    after = await cluster.fully_replicated(TOPIC)
    assert [(p.leader, p.leader_epoch) for p in after] == [(p.leader, p.leader_epoch) for p in before], (
        "no election while etcd was away"
    )
    await workload.progress(300, 10, "after etcd returned")

    # and elections work again: the leader of partition 0 dies, another takes over
    leader, epoch = after[0].leader, after[0].leader_epoch
    cluster.brokers[leader].kill()

    async def moved():
        new, new_epoch = await cluster.leader_of(TOPIC, 0, cluster.bootstrap_without(leader))
        return new not in (-1, leader) and new_epoch > epoch

    await eventually(moved, 10, f"a new leader of {TOPIC}-0 after etcd's return")
    await workload.progress(200, 15, "after the election")
    await cluster.start_broker(leader)
    await cluster.fully_replicated(TOPIC)
    await workload.finish(cluster.bootstrap)
    assert not workload.errors, workload.errors
