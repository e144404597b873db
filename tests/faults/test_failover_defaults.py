"""Failover with the defaults a user starts a cluster with: etcd as it comes (no tuned
election timeout), three brokers with no timing flags, one ``acks=all`` producer with its
defaults.

A leader killed with SIGKILL leaves a port that refuses connections: its peers notice at
once (broker/liveness.py) and end its registration without waiting for its session
(6 s) to lapse, so the next ``acks=all`` acknowledgement comes within ``FAILOVER_S``.

A leader paused with SIGSTOP leaves no such evidence: it is deposed only when its session
lapses, and its producers, whose requests wait on it, follow the new leader within
``RESUME_S`` of its election (client/leaders.py: a slow request makes the producer look at
the metadata again, and a partition whose leader moved resends what was in flight there).

Run by hand with ``-s`` the tests print each figure (``failover took ...``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import deque
from datetime import datetime
from pathlib import Path

import pytest

from sluice.client import Admin, Producer
from sluice.client.cluster import Cluster
from sluice.harness import BrokerProcess, EtcdProcess, freeze

pytestmark = pytest.mark.timeout(120)

NODES = (1, 2, 3)
TOPIC = "payments"
# the goal is 1 s (measured: see docs/design.md); 2 s leaves margin for a loaded machine,
# and is far below the 6 s session timeout a failover waited for before
FAILOVER_S = 2.0
# acceptance: acknowledgements resume within 1 s of the new leader's election; 1.5 s leaves
# margin for a loaded machine (before, they waited for the old leader's return or 30 s)
RESUME_S = 1.5
SESSION_S = 6.0  # the default session timeout
STOP_S = 2.0  # a prompt shutdown takes well under a second; this leaves margin


class DefaultCluster:
    """etcd with its defaults and three brokers started with ``--cluster`` and ``--node-id``
    only; ``close()`` kills them all."""

    def __init__(self, tmp_path: Path) -> None:
        self.etcd = EtcdProcess(tmp_path / "etcd", tmp_path / "etcd.log", tuned=False)
        self.brokers = {
            n: BrokerProcess(tmp_path / f"data{n}", tmp_path / f"broker{n}.log") for n in NODES
        }

    async def start(self) -> DefaultCluster:
        await asyncio.to_thread(self.etcd.start)
        for n, b in self.brokers.items():
            b.extra_args = ["--cluster", f"etcd://127.0.0.1:{self.etcd.client_port}", "--node-id", str(n)]
        await asyncio.gather(*(asyncio.to_thread(b.start) for b in self.brokers.values()))
        await self.wait(lambda m: len(m.brokers) == len(NODES), "three live brokers")
        return self

    def close(self) -> None:
        for b in self.brokers.values():
            b.kill()
        self.etcd.kill()

    def bootstrap(self, without: int = -1) -> str:
        return ",".join(b.bootstrap for n, b in self.brokers.items() if n != without)

    async def metadata(self, without: int = -1, at: int | None = None):
        """Metadata of ``TOPIC`` from any broker but ``without``, or from broker ``at``."""
        cluster = Cluster(self.brokers[at].bootstrap if at else self.bootstrap(without), connect_timeout=2)
        try:
            return await asyncio.wait_for(cluster.refresh([TOPIC]), 5)
        finally:
            await cluster.close()

    async def wait(self, predicate, what: str, timeout: float = 30, without: int = -1):
        deadline = time.monotonic() + timeout
        while True:
            try:
                meta = await self.metadata(without)
                if predicate(meta):
                    return meta
            except Exception:  # noqa: BLE001 - not yet
                pass
            assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
            await asyncio.sleep(0.1)


def _in_sync(meta) -> bool:
    parts = [p for t in meta.topics if t.name == TOPIC for p in t.partitions]
    return bool(parts) and all(p.leader in NODES and sorted(p.isr) == list(NODES) for p in parts)


@pytest.fixture
async def cluster(tmp_path):
    c = DefaultCluster(tmp_path)
    try:
        yield await c.start()
    finally:
        c.close()


async def _produce(producer: Producer, partition: int, acks: list[float], stop: asyncio.Event) -> None:
    """Send to ``partition`` one record at a time; note when each is acknowledged."""
    i = 0
    while not stop.is_set():
        fut = await producer.send(TOPIC, b"v%d" % i, partition=partition)
        await fut
        acks.append(time.monotonic())
        i += 1
        await asyncio.sleep(0.005)


async def _status_shows_gone(cluster: DefaultCluster, victim: int, since: float) -> float:
    """Seconds from ``since`` until ``cluster status`` (asked of the other brokers) lists
    ``victim`` as not alive and the cluster as unhealthy."""
    async with Admin(cluster.bootstrap(without=victim), request_timeout_ms=2000) as admin:
        while True:
            try:
                status = await admin.cluster_status()
                if not any(b.alive for b in status.brokers if b.node_id == victim) and not status.healthy:
                    return time.monotonic() - since
            except Exception:  # noqa: BLE001 - asked again
                pass
            await asyncio.sleep(0.02)


async def _failover(cluster: DefaultCluster, victim_is_controller: bool) -> tuple[float, float]:
    """Kill the leader of a partition (the controller too, or not) while a producer sends
    to it; return the seconds from the kill to the first acknowledgement of a send made
    after it, and to a ``cluster status`` that shows the broker gone."""
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_topic(TOPIC, 3, {"min.insync.replicas": "2"}, replication_factor=3)
    meta = await cluster.wait(_in_sync, "every replica in sync")
    [topic] = [t for t in meta.topics if t.name == TOPIC]
    if victim_is_controller:
        victim = meta.controller_id
    else:
        victim = next(p.leader for p in topic.partitions if p.leader != meta.controller_id)
    partition = next(p.partition for p in topic.partitions if p.leader == victim)
    acks: list[float] = []
    stop = asyncio.Event()
    producer = Producer(cluster.bootstrap())
    await producer.start()
    sender = asyncio.create_task(_produce(producer, partition, acks, stop))
    status: asyncio.Task | None = None
    try:
        deadline = time.monotonic() + 20
        while len(acks) < 50:
            assert not sender.done() and time.monotonic() < deadline, "no steady acknowledgements before the kill"
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        await asyncio.to_thread(cluster.brokers[victim].kill)
        status = asyncio.create_task(_status_shows_gone(cluster, victim, killed_at))
        after = len(acks)
        deadline = killed_at + 20
        while len(acks) <= after + 1 and time.monotonic() < deadline and not sender.done():
            await asyncio.sleep(0.01)
        assert len(acks) > after + 1, "no acknowledgement within 20 s of the kill"
        # the first ack counted is of a send made after the kill (the one in flight at the
        # kill may have been answered by the old leader just before it died)
        took = acks[after + 1] - killed_at
        shown = await asyncio.wait_for(status, 20)
    finally:
        stop.set()
        await asyncio.wait([sender], timeout=10)
        await producer.close()
        sender.cancel()
        if status is not None:
            status.cancel()
    new = await cluster.wait(
        lambda m: next(p.leader for t in m.topics if t.name == TOPIC for p in t.partitions
                       if p.partition == partition) not in (-1, victim),
        "a new leader", without=victim,
    )
    print(f"failover took {took:.3f} s (broker {victim} killed, controller: {victim_is_controller}; "
          f"new controller {new.controller_id}); cluster status showed it gone after {shown:.3f} s")
    return took, shown


async def test_sigkill_of_a_leader_fails_over_within_2s(cluster):
    took, shown = await _failover(cluster, victim_is_controller=False)
    assert took <= FAILOVER_S, f"the next acks=all acknowledgement came {took:.2f} s after the kill"
    assert shown <= FAILOVER_S, f"cluster status showed the killed broker alive for {shown:.2f} s"


async def test_sigkill_of_the_controller_leading_fails_over_within_2s(cluster):
    took, shown = await _failover(cluster, victim_is_controller=True)
    assert took <= FAILOVER_S, f"the next acks=all acknowledgement came {took:.2f} s after the kill"
    assert shown <= FAILOVER_S, f"cluster status showed the killed broker alive for {shown:.2f} s"


async def _produce_window(producer: Producer, partition: int, acks: list[float], stop: asyncio.Event) -> None:
    """Send to ``partition`` with up to 20 records unanswered; note (wall clock) when each
    is acknowledged."""
    pending: deque = deque()
    i = 0
    while not stop.is_set():
        pending.append(await producer.send(TOPIC, b"w%d" % i, partition=partition))
        i += 1
        while len(pending) > 20 or (pending and pending[0].done()):
            await pending.popleft()
            acks.append(time.time())
        await asyncio.sleep(0.002)


def _logged_at(log: str, line: str) -> float:
    """The wall-clock time of the first log line holding ``line``."""
    for entry in log.splitlines():
        if line in entry:
            stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", entry)
            return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no log line with {line!r}")


async def test_producers_follow_a_new_leader_at_once_while_the_old_one_is_paused(cluster):
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_topic(TOPIC, 3, {"min.insync.replicas": "2"}, replication_factor=3)
    meta = await cluster.wait(_in_sync, "every replica in sync")
    [topic] = [t for t in meta.topics if t.name == TOPIC]
    part = next(p for p in topic.partitions if p.leader != meta.controller_id)
    victim, partition = part.leader, part.partition
    acks: list[float] = []
    stop = asyncio.Event()
    producer = Producer(cluster.bootstrap())
    await producer.start()
    sender = asyncio.create_task(_produce_window(producer, partition, acks, stop))
    pid = cluster.brokers[victim].proc.pid
    try:
        deadline = time.monotonic() + 20
        while len(acks) < 200:
            assert not sender.done() and time.monotonic() < deadline, "no steady acknowledgements before the pause"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(freeze, pid, True)
        stopped_at = time.time()

        def leader_now(m):
            return next(p.leader for t in m.topics if t.name == TOPIC for p in t.partitions if p.partition == partition)

        # a paused broker's port still accepts: it is fenced by its session, not before
        new = await cluster.wait(lambda m: leader_now(m) not in (-1, victim), "a new leader", without=victim)
        noticed = time.time() - stopped_at
        assert noticed >= SESSION_S / 2, f"a new leader {noticed:.1f} s after the pause, before the session lapsed"
        new_leader = leader_now(new)
        elected_at = _logged_at(cluster.brokers[new_leader].log(), f"leading {TOPIC}-{partition} in epoch 1")
        # (an answer already on its way when the leader stopped may come just after it)
        deadline = time.monotonic() + 10
        while acks[-1] <= elected_at and time.monotonic() < deadline and not sender.done():
            await asyncio.sleep(0.01)
        assert acks[-1] > elected_at, "no acknowledgement on the new leader while the old one is paused"
        resumed = next(t for t in acks if t > elected_at) - elected_at
    finally:
        os.killpg(pid, signal.SIGCONT)
        stop.set()
        await asyncio.wait([sender], timeout=30)
        await producer.close()
        sender.cancel()
    print(f"acknowledgements resumed {resumed:.3f} s after the election of broker {new_leader} "
          f"({elected_at - stopped_at:.1f} s after the pause)")
    assert resumed <= RESUME_S, f"acknowledgements resumed {resumed:.2f} s after the new leader's election"


async def test_sigterm_of_a_leader_hands_off_at_once_despite_a_paused_follower(cluster):
    """One follower of the partition is paused (a hung broker, still registered and in the
    ISR), the leader gets SIGTERM while producers send: it hands the partition to the
    follower that fetches (an election after it left could pick the paused one, still
    registered: the partition would wait for that broker's session to lapse), stops at once
    instead of holding its waiting writes for the paused follower, and the producers go on
    there with no error (once the paused follower leaves the ISR: its session lapses)."""
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_topic(TOPIC, 3, {"min.insync.replicas": "1"}, replication_factor=3)
    meta = await cluster.wait(_in_sync, "every replica in sync")
    [topic] = [t for t in meta.topics if t.name == TOPIC]
    part = next(p for p in topic.partitions if p.leader != meta.controller_id)
    victim, partition = part.leader, part.partition
    paused, successor = [n for n in part.replicas if n != victim]
    acks: list[float] = []
    stop = asyncio.Event()
    producer = Producer(cluster.bootstrap())
    await producer.start()
    sender = asyncio.create_task(_produce_window(producer, partition, acks, stop))
    paused_pid = cluster.brokers[paused].proc.pid
    proc = cluster.brokers[victim].proc
    try:
        deadline = time.monotonic() + 20
        while len(acks) < 200:
            assert not sender.done() and time.monotonic() < deadline, "no steady acknowledgements before the stop"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(freeze, paused_pid, True)
        await asyncio.sleep(0.2)  # writes wait on the leader for the paused follower
        stopping_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 30)
        took = time.monotonic() - stopping_at
        log = cluster.brokers[victim].log()
        assert proc.returncode == 0, log[-3000:]
        assert took <= STOP_S, f"broker {victim} took {took:.2f} s to stop:\n{log[-3000:]}"
        meta = await cluster.metadata(at=successor)
        leader = next(p.leader for t in meta.topics if t.name == TOPIC for p in t.partitions if p.partition == partition)
        assert leader == successor, f"{TOPIC}-{partition} is led by {leader}, not the live follower {successor}"
        assert f"{TOPIC}-{partition}: leadership handed to broker {successor}" in log, log[-3000:]
        before = len(acks)
        deadline = time.monotonic() + 20
        while len(acks) < before + 100 and time.monotonic() < deadline and not sender.done():
            await asyncio.sleep(0.05)
        assert not sender.done(), f"a send failed: {sender.exception()!r}"
        assert len(acks) >= before + 100, "the producer did not go on on the new leader"
    finally:
        os.killpg(paused_pid, signal.SIGCONT)
        stop.set()
        await asyncio.wait([sender], timeout=30)
        await producer.close()
        sender.cancel()
    print(f"broker {victim} stopped {took:.3f} s after SIGTERM with follower {paused} paused")
