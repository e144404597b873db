"""Three brokers, one etcd and a recorded workload: the ground of the cluster fault tests.

``ThreeBrokers`` starts a real etcd and brokers 1, 2 and 3 (``sluice serve --cluster``) with
short timeouts (session 1 s, replica lag 2 s).  With ``proxied=True`` every broker sits
behind a ``FaultyProxy`` that it advertises (clients and peers connect through it) and
reaches etcd through a proxy of its own, so that one broker can be cut off from everyone.
``close()`` kills every process and proxy it started, whatever happened.

``Workload`` runs several producers (each its own client, ``acks=all``, bounded delivery
timeout) sending to every partition of a topic and recording each outcome in a checker
``History``, with each send's latency, until ``stop()``.

``inject`` gives one broker's disk fault rules (storage/faults.py) while it runs.

``ext4_image`` loop-mounts a fresh ext4 image (root only; the caller kills what uses it
before leaving the ``with``); ``make_read_only`` turns it read-only under a running broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from checker import History, read_logs
from proxy import FaultyProxy

from sluice import harness
from sluice.client import Admin, Producer
from sluice.client.cluster import Cluster
from sluice.errors import SluiceError
from sluice.harness import BrokerProcess, EtcdProcess
from sluice.protocol.coordinator import GROUPS_TOPIC
from sluice.storage import faults

SESSION_MS = 1000
LAG_MS = 2000
NODES = (1, 2, 3)


async def eventually(check, timeout: float, what: str):
    """``sluice.harness.eventually`` polling every 0.1 s, where metadata errors while
    polling count as "not yet"."""
    return await harness.eventually(check, timeout, what, interval=0.1, ignore=(SluiceError, OSError))


class ThreeBrokers:
    def __init__(self, tmp_path: Path, name: str = "faults") -> None:
        self.tmp_path = tmp_path
        self.name = name
        self.etcd = EtcdProcess(tmp_path / "etcd", tmp_path / "etcd.log")
        self.brokers: dict[int, BrokerProcess] = {}
        self.proxies: dict[int, FaultyProxy] = {}  # in front of each broker
        self.etcd_proxies: dict[int, FaultyProxy] = {}  # each broker's way to etcd

    async def start(
        self, *, proxied: bool = False, data_dirs: dict[int, Path] | None = None, extra_args: list[str] | None = None
    ) -> ThreeBrokers:
        await asyncio.to_thread(self.etcd.start)
        for n in NODES:
            data = (data_dirs or {}).get(n, self.tmp_path / f"data{n}")
            b = self.brokers[n] = BrokerProcess(data, self.tmp_path / f"broker{n}.log")
            url = self.etcd.url(self.name)
            extra: list[str] = []
            if proxied:
                front = self.proxies[n] = await FaultyProxy("127.0.0.1", b.port).start()
                to_etcd = self.etcd_proxies[n] = await FaultyProxy(
                    "127.0.0.1", self.etcd.client_port, raw=True
                ).start()
                url = f"etcd://{to_etcd.address}/{self.name}"
                extra = ["--advertise", front.address]
            b.extra_args = [
                "--cluster", url, "--node-id", str(n), "--session-timeout-ms", str(SESSION_MS),
                "--replica-lag-time-max-ms", str(LAG_MS), *extra, *(extra_args or []),
            ]
        # started from threads: with proxies the brokers reach etcd through this event loop
        await asyncio.gather(*(self.start_broker(n) for n in NODES))
        await eventually(self._all_live, 20, "three live brokers")
        # a broker killed later must not take a group's only in-sync copy of its offsets
        await self.fully_replicated(GROUPS_TOPIC)
        return self

    async def start_broker(self, n: int) -> None:
        await asyncio.to_thread(self.brokers[n].start)

    def kill_brokers(self) -> None:
        for b in self.brokers.values():
            b.kill()

    async def close(self) -> None:
        self.kill_brokers()
        for p in [*self.proxies.values(), *self.etcd_proxies.values()]:
            await p.close()
        self.etcd.kill()

    def address(self, n: int) -> str:
        return self.proxies[n].address if n in self.proxies else self.brokers[n].bootstrap

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(n) for n in NODES)

    def bootstrap_without(self, n: int) -> str:
        return ",".join(self.address(m) for m in NODES if m != n)

    async def metadata(self, topic: str | None = None, bootstrap: str | None = None):
        cluster = Cluster(bootstrap or self.bootstrap, connect_timeout=2)
        try:
            return await asyncio.wait_for(cluster.refresh([topic] if topic else None), 5)
        finally:
            await cluster.close()

    async def partitions(self, topic: str, bootstrap: str | None = None):
        meta = await self.metadata(topic, bootstrap)
        [t] = [t for t in meta.topics if t.name == topic]
        return t.partitions

    async def _all_live(self) -> bool:
        return len((await self.metadata()).brokers) == len(NODES)

    async def create_topic(self, topic: str, partitions: int = 3, config: dict | None = None):
        async with Admin(self.bootstrap) as admin:
            await admin.create_topic(
                topic, partitions, {"min.insync.replicas": "2", **(config or {})}, replication_factor=3
            )
        return await self.fully_replicated(topic)

    async def fully_replicated(self, topic: str, timeout: float = 30, bootstrap: str | None = None):
        """Wait until every partition has a leader and all three replicas in its ISR."""

        async def check():
            parts = await self.partitions(topic, bootstrap)
            ok = all(p.leader in NODES and sorted(p.isr) == list(NODES) for p in parts)
            return parts if ok else None

        return await eventually(check, timeout, f"every replica of {topic} in sync")

    async def leader_of(self, topic: str, partition: int, bootstrap: str | None = None) -> tuple[int, int]:
        """(leader, leader epoch) of a partition as the metadata has it now."""
        p = (await self.partitions(topic, bootstrap))[partition]
        return p.leader, p.leader_epoch


def inject(cluster: ThreeBrokers, node: int, **rules) -> None:
    """Give broker ``node``'s disk the fault ``rules`` (storage/faults.py), now; no rules:
    its disk works again.  The broker must have been started armed (``faults.ENV``)."""
    path = cluster.brokers[node].data_dir / faults.CONTROL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rules))
    tmp.replace(path)


class Workload:
    """``producers`` producers (each its own client) sending ``window`` messages at a time,
    spread over ``partitions``, recording outcomes and latencies until ``stop()``.  Their
    values are named ``<name><k>:<seq>``; workloads sharing a ``history`` need other names."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: list[int], *, producers: int = 3,
        window: int = 10, delivery_timeout_ms: int = 8000, request_timeout_ms: int = 3000,
        pause_s: float = 0.01, name: str = "p", history: History | None = None, value_size: int = 0,
    ) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.n, self.window, self.pause_s = producers, window, pause_s
        self.options = dict(
            acks="all", linger_ms=1, delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=50, metadata_max_age_ms=1000,
        )
        self.name, self.value_size = name, value_size
        self.history = history if history is not None else History()
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds to its answer), loop time
        self.errors: Counter = Counter()  # error class name -> failed sends
        self.events: list[tuple[float, int, str]] = []  # (when, partition, "ack" or error)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._producers: list[Producer] = []

    async def start(self) -> Workload:
        for k in range(self.n):
            p = Producer(self.bootstrap, **self.options)
            await p.start()
            self._producers.append(p)
            self._tasks.append(asyncio.create_task(self._send_loop(f"{self.name}{k}", p)))
        return self

    @property
    def acked(self) -> int:
        return len(self.history.acked)

    async def _send_loop(self, name: str, producer: Producer) -> None:
        seq = 0
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            pending = []
            for _ in range(self.window):
                value = self.history.value(name, seq, self.value_size)
                partition = self.partitions[seq % len(self.partitions)]
                seq += 1
                t0 = loop.time()
                fut = await producer.send(self.topic, value, partition=partition)
                fut.add_done_callback(lambda _, t0=t0: self.latencies.append((t0, loop.time() - t0)))
                pending.append((value, fut))
            for value, fut in pending:
                try:
                    meta = await fut
                    self.history.ack(value, meta)
                    self.events.append((loop.time(), meta.partition, "ack"))
                except SluiceError as exc:
                    self.history.fail(value, exc)
                    self.errors[type(exc).__name__] += 1
                    self.events.append((loop.time(), -1, type(exc).__name__))
            await asyncio.sleep(self.pause_s)

    def timeline(self, since: float = 0.0) -> str:
        """Answers per 0.5 s and partition since ``since`` (loop time): for failure reports."""
        slots: dict[float, Counter] = {}
        for when, partition, what in self.events:
            if when >= since:
                slots.setdefault(round(when * 2) / 2, Counter())[(partition, what)] += 1
        return "\n".join(f"{t:.1f}: {dict(sorted(c.items()))}" for t, c in sorted(slots.items()))

    async def progress(self, n: int, timeout: float, what: str = "") -> None:
        """Wait until ``n`` more sends were acknowledged."""
        target = self.acked + n

        async def check():
            for t in self._tasks:
                if t.done():
                    t.result()  # a sender died: say why
            return self.acked >= target

        try:
            await eventually(check, timeout, f"{n} more acknowledgements {what}".strip())
        except AssertionError as exc:
            raise AssertionError(f"{exc}; answers per 0.5 s:\n{self.timeline()}") from None

    async def stop(self) -> None:
        self._stop.set()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for p in self._producers:
                await p.close()

    async def finish(self, bootstrap: str, max_copies: int = 1):
        """Stop, then check the history against what the cluster at ``bootstrap`` stores
        (idempotent producers: a record at most ``max_copies`` times); at least one send
        must have been acknowledged.  Returns the checker's report."""
        await self.stop()
        report = self.history.check(
            await read_logs(bootstrap, self.topic), max_acked_copies=max_copies, max_unsure_copies=max_copies
        )
        print(f"{report}; errors {dict(self.errors)}")
        assert report.acked > 0
        return report


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str):
    """A tmpfs of ``size`` on ``mount_point`` for the ``with`` (root only, else skipped)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mount_point
    finally:
        res = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True)
        if res.returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


@contextlib.contextmanager
def ext4_image(image: Path, mount_point: Path, size: str = "64M"):
    """A fresh ext4 file system in ``image``, loop-mounted on ``mount_point`` for the
    ``with``; skips the test when loop devices cannot be used here (not root, no
    /dev/loop-control)."""
    if os.geteuid() != 0:
        pytest.skip("loop-mounting an ext4 image needs root")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("no loop devices here (/dev/loop-control is missing)")
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    res = subprocess.run(
        ["mount", "-o", "loop,errors=remount-ro", str(image), str(mount_point)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {res.stderr.strip()}")
    try:
        yield mount_point
    finally:
        res = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True)
        if res.returncode != 0:  # still busy: detach it now, it goes when its last user does
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def make_read_only(mount_point: Path) -> None:
    """Turn a mounted ext4 file system read-only under its users.  ``mount -o remount,ro``
    refuses while files are open for writing (a broker always has its segments open), so
    then an ext4 error is triggered instead: mounted ``errors=remount-ro``, the kernel turns
    the file system read-only at once, as it does when a disk fails: every later write to
    it fails with EROFS, reads go on."""
    res = subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True)
    if res.returncode != 0:
        dev = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(mount_point)], capture_output=True, text=True, check=True
        ).stdout.strip()
        Path(f"/sys/fs/ext4/{os.path.basename(dev)}/trigger_fs_error").write_text("sluice fault test\n")
    options = subprocess.run(
        ["findmnt", "-n", "-o", "OPTIONS", str(mount_point)], capture_output=True, text=True, check=True
    ).stdout
    flags = options.strip().split(",")
    # Linux 6.x says "emergency_ro" beside "rw" for a file system that went read-only on error
    assert flags[0] == "ro" or "emergency_ro" in flags, f"{mount_point} is still writable: {options}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
