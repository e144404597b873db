"""Cluster workloads: three brokers and one etcd, all on this machine.

- **R3**: P2-1KiB (100,000 records of 1 KiB, fsync before every ack) on a topic with
  replication factor 3 and ``min.insync.replicas=2``, producer ``acks=all``: the price of
  replication, to hold against the single-node P2-1KiB.
- **F1**: failover.  A producer sends to partition 0 with ``acks=all`` every 5 ms; the
  partition's leader is SIGKILLed; the time from the kill to the first acknowledgement of
  a record sent after it.  Three rounds (the killed broker restarts and rejoins the ISR
  between them); the row gives the median and each round.  Brokers run with
  ``--session-timeout-ms 1000`` (a dead broker's lease expires after 1 s).

etcd is Debian's ``etcd`` (package ``etcd-server``), found on PATH or in /usr/bin; every
process is started by ``sluice.harness`` on free loopback ports in a temporary directory
(its log there too) and stopped at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from sluice.bench import workloads as w
from sluice.client import Admin, Producer
from sluice.client.cluster import Cluster
from sluice.harness import BrokerProcess, EtcdProcess, etcd_binary, eventually

SESSION_TIMEOUT_MS = 1000
BROKERS = 3


class LocalCluster:
    """One etcd and ``BROKERS`` brokers (node ids 1..n) on free loopback ports, each with
    its data and log under ``root`` (``sluice.harness``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etcd = EtcdProcess(root / "etcd", root / "etcd.log", name="bench")
        url = self.etcd.url("bench")
        self.brokers = {
            n: BrokerProcess(
                root / f"broker{n}", root / f"broker{n}.log",
                ["--node-id", str(n), "--cluster", url, "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
                 "--leader-rebalance-interval-ms", "0"],
                log_level="WARNING",
            )
            for n in range(1, BROKERS + 1)
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def start(self) -> LocalCluster:
        try:
            etcd_binary()
        except RuntimeError:
            raise RuntimeError("cluster workloads need etcd: install Debian's etcd-server") from None
        self.etcd.start()
        for n in self.brokers:
            self.start_broker(n)
        return self

    def start_broker(self, node: int) -> None:
        self.brokers[node].start()

    def kill(self, node: int) -> None:
        self.brokers[node].kill()

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop(strict=False)
        self.etcd.kill()


@contextlib.contextmanager
def local_cluster():
    with tempfile.TemporaryDirectory(prefix="sluice-bench-cluster-") as root:
        cluster = LocalCluster(Path(root))
        try:
            yield cluster.start()
        finally:
            cluster.stop()


async def _partition_state(bootstrap: str, topic: str, index: int):
    cluster = Cluster(bootstrap)
    try:
        resp = await cluster.refresh([topic])
    finally:
        await cluster.close()
    return resp.topics[0].partitions[index]


async def _until(check, timeout: float, what: str):
    """``sluice.harness.eventually`` where any error while polling counts as "not yet"."""
    return await eventually(check, timeout, what, ignore=(Exception,))


async def _in_sync(bootstrap: str, topic: str, index: int = 0):
    p = await _partition_state(bootstrap, topic, index)
    return p if p.leader >= 0 and sorted(p.isr) == sorted(p.replicas) else None


async def _create(bootstrap: str, config: dict) -> None:
    async with Admin(bootstrap) as admin:
        with contextlib.suppress(Exception):
            await admin.delete_topic(w.TOPIC)
        await admin.create_topic(w.TOPIC, 1, config, replication_factor=BROKERS)
    await _until(lambda: _in_sync(bootstrap, w.TOPIC), 30, "a fully in-sync partition")


async def run_r3(cluster: LocalCluster, meter, count: int = 100_000, size: int = 1024) -> w.Row:
    boot = cluster.bootstrap
    config = {**w.FSYNC_ALWAYS, "min.insync.replicas": "2"}
    await _until(lambda: _brokers(boot, BROKERS), 30, f"{BROKERS} live brokers")
    await _create(boot, config)
    payloads = [os.urandom(size) for _ in range(count)]
    producer = Producer(boot, acks="all", linger_ms=0, batch_size=1 << 20)
    await producer.start()
    try:
        await (await producer.send_many(w.TOPIC, payloads[:1], partition=0))  # connect, learn the leader
        meter.start()
        t0 = time.perf_counter()
        acked, stopped = await w.publish(producer, payloads, t0 + 120)
        seconds = time.perf_counter() - t0
        cpu = meter.stop()
    finally:
        await producer.close()
    row = w.Row("R3", acked, acked * size, seconds)
    row.notes += [
        f"{BROKERS} brokers + etcd on this machine, replication factor {BROKERS}, min.insync.replicas=2, "
        "acks=all, fsync before ack on every replica (flush.messages=1)",
        f"client: Producer.send_many, {w.CHUNK} records per call, ≤{w.WINDOW} unacked", cpu,
    ]
    if stopped:
        row.notes.append("STOPPED at the 120s cap")
    return row


async def _brokers(bootstrap: str, n: int) -> bool:
    cluster = Cluster(bootstrap)
    try:
        return len((await cluster.refresh()).brokers) == n
    finally:
        await cluster.close()


async def run_f1(cluster: LocalCluster, meter, rounds: int = 3, interval_s: float = 0.005) -> w.Row:
    boot = cluster.bootstrap
    await _until(lambda: _brokers(boot, BROKERS), 30, f"{BROKERS} live brokers")
    await _create(boot, {"min.insync.replicas": "2"})
    producer = Producer(
        boot, acks="all", linger_ms=0, request_timeout_ms=2000, retry_backoff_ms=50,
        retry_backoff_max_ms=200, delivery_timeout_ms=30_000,
    )
    await producer.start()
    times = []
    meter.start()
    try:
        for _ in range(rounds):
            await _until(lambda: _in_sync(boot, w.TOPIC), 60, "the restarted broker back in sync")
            leader = (await _partition_state(boot, w.TOPIC, 0)).leader
            await (await producer.send(w.TOPIC, b"before", partition=0))
            killed = time.perf_counter()
            cluster.kill(leader)
            first = await _first_ack_after(producer, killed, interval_s)
            times.append(first - killed)
            cluster.start_broker(leader)
    finally:
        cpu = meter.stop()
        await producer.close()
    row = w.Row("F1", len(times), 0, sum(times))
    ordered = sorted(times)
    row.p50_ms = round(ordered[len(ordered) // 2] * 1000, 1)
    row.max_ms = round(ordered[-1] * 1000, 1)
    row.notes += [
        "failover: SIGKILL of the partition leader -> first acks=all ack of a record sent after it; "
        f"rounds: {', '.join(f'{t * 1000:.0f} ms' for t in times)}",
        f"settings: --session-timeout-ms {SESSION_TIMEOUT_MS}, replication factor {BROKERS}, "
        "min.insync.replicas=2; producer retry_backoff_ms=50 (max 200), request_timeout_ms=2000; "
        "a send every 5 ms",
        cpu,
    ]
    return row


async def _first_ack_after(producer: Producer, since: float, interval_s: float) -> float:
    """Send a record every ``interval_s`` until one sent after ``since`` is acknowledged;
    returns when that first acknowledgement came."""
    loop = asyncio.get_running_loop()
    acked = loop.create_future()

    def done(fut: asyncio.Future) -> None:
        if fut.exception() is None and not acked.done():
            acked.set_result(time.perf_counter())

    pending = []
    while not acked.done():
        fut = await producer.send(w.TOPIC, b"after", partition=0)
        fut.add_done_callback(done)
        pending.append(fut)
        await asyncio.wait([acked], timeout=interval_s)
    for fut in pending:  # the rest: outcomes no longer measured
        if fut.done() and not fut.cancelled():
            fut.exception()
        else:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return acked.result()
