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
process is started on free loopback ports in a temporary directory and stopped at the end,
whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sluice.bench import workloads as w
from sluice.bench.runner import free_port, wait_port
from sluice.client import Admin, Producer
from sluice.client.transport import Cluster

SESSION_TIMEOUT_MS = 1000
BROKERS = 3


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class LocalCluster:
    """One etcd and ``BROKERS`` brokers (node ids 1..n) on free loopback ports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etcd: subprocess.Popen | None = None
        self.brokers: dict[int, subprocess.Popen] = {}
        self.ports = {n: free_port() for n in range(1, BROKERS + 1)}
        self.etcd_port = free_port()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def start(self) -> LocalCluster:
        binary = shutil.which("etcd") or "/usr/bin/etcd"
        if not os.access(binary, os.X_OK):
            raise RuntimeError("cluster workloads need etcd: install Debian's etcd-server")
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{free_port()}"
        self.etcd = subprocess.Popen(
            [binary, "--name", "bench", "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"bench={peer}", "--election-timeout", "500", "--heartbeat-interval", "50"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                if json.loads(r.read()).get("health") == "true":
                    break
            if self.etcd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("etcd did not become healthy")
            time.sleep(0.05)
        for n in self.ports:
            self.start_broker(n)
        return self

    def start_broker(self, node: int) -> None:
        port = self.ports[node]
        self.brokers[node] = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli.main", "serve", "--node-id", str(node),
             "--cluster", f"etcd://127.0.0.1:{self.etcd_port}/bench", "--data-dir", str(self.root / f"broker{node}"),
             "--port", str(port), "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
             "--leader-rebalance-interval-ms", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        wait_port(port, self.brokers[node], f"broker {node}")

    def kill(self, node: int) -> None:
        _stop(self.brokers.get(node), signal.SIGKILL)

    def stop(self) -> None:
        for proc in self.brokers.values():
            _stop(proc)
        _stop(self.etcd)


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
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            result = await check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.05)


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
