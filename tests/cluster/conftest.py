"""Real etcd processes for the cluster tests, and the stores under test.

``etcd_factory`` starts Debian's ``etcd`` (etcd-server 3.4, found on PATH or in /usr/bin) on
free loopback client and peer ports with a fresh data directory, waits until it reports
healthy, and kills it at the end of the test even when the test fails.  ``etcd`` is one
such process shared by a test module; tests sharing it use their own cluster name (key
prefix), so they never see each other's keys.

etcd runs with a 500 ms election timeout, so it grants leases as short as 1 s: sessions in
these tests time out after 1 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from cluster_helpers import REQUEST_MS, SESSION_MS, free_ports

from sluice.cluster.embedded import EmbeddedStore
from sluice.cluster.etcd import EtcdStore


def etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if found is None:
        pytest.fail("no etcd binary on PATH or in /usr/bin: install Debian's etcd-server (scripts/test does)")
    return found


class EtcdProcess:
    """One etcd member; ``kill``, ``start`` again on the same data, ``pause`` / ``resume``."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.client_port, self.peer_port = free_ports(2)
        self.proc: subprocess.Popen | None = None

    def url(self, cluster: str) -> str:
        return f"etcd://127.0.0.1:{self.client_port}/{cluster}"

    def start(self, timeout: float = 30) -> EtcdProcess:
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [
                etcd_binary(), "--name", "test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}",
                "--election-timeout", "500", "--heartbeat-interval", "50",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return self
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy within {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def etcd_factory(tmp_path):
    started: list[EtcdProcess] = []

    def make() -> EtcdProcess:
        n = len(started)
        e = EtcdProcess(tmp_path / f"etcd{n}", tmp_path / f"etcd{n}.log")
        started.append(e)
        return e.start()

    yield make
    for e in started:
        e.kill()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    d = tmp_path_factory.mktemp("etcd")
    e = EtcdProcess(d / "data", d / "etcd.log")
    try:
        yield e.start()
    finally:
        e.kill()


@pytest.fixture
def cluster_name() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["embedded", "etcd"])
async def store_factory(request, tmp_path, cluster_name):
    """``make()`` opens a started store of the parametrized kind on the same metadata each
    time: the same data directory (a restart) or the same etcd cluster (another broker)."""
    opened = []
    url = request.getfixturevalue("etcd").url(cluster_name) if request.param == "etcd" else None

    async def make():
        if url is None:
            store = EmbeddedStore(tmp_path / "data", node_id=0)
        else:
            store = EtcdStore(url, session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
        await store.start()
        opened.append(store)
        return store

    make.kind = request.param
    yield make
    for store in opened:
        await store.close()

