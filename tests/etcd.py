"""A real etcd member for multi-process tests (imported as ``from etcd import EtcdProcess``).

``EtcdProcess`` runs Debian's ``etcd`` (etcd-server 3.4, found on PATH or in /usr/bin) on
free loopback client and peer ports with its own data directory, with a 500 ms election
timeout so that it grants leases as short as 1 s (``tuned=False``: etcd's own defaults, as
a user starts it).  It can be killed (SIGKILL), started
again on the same data, paused (SIGSTOP) and resumed.  Whoever starts one kills it, in a
``finally`` or a fixture's teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from brokers import free_ports, freeze


def etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if found is None:
        pytest.fail("no etcd binary on PATH or in /usr/bin: install Debian's etcd-server (scripts/test does)")
    return found


class EtcdProcess:
    """One etcd member; ``kill``, ``start`` again on the same data, ``pause`` / ``resume``."""

    def __init__(self, data_dir: Path, log_path: Path, *, tuned: bool = True) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.tuned = tuned
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
                *(["--election-timeout", "500", "--heartbeat-interval", "50"] if self.tuned else []),
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
        """SIGSTOP, returning once every thread of etcd has stopped (``brokers.freeze``)."""
        freeze(self.proc.pid, group=True)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

