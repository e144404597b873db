"""``EtcdProcess``: a real one-member etcd on free loopback client and peer ports.

It runs Debian's ``etcd`` (etcd-server 3.4, found on PATH or in /usr/bin) with its own data
directory and log file, with a 500 ms election timeout so that it grants leases as short as
1 s (``tuned=False``: etcd's own defaults, as a user starts it).  It can be killed
(SIGKILL), started again on the same data, paused (SIGSTOP) and resumed.  Whoever starts one
kills it, whatever happens.
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

from sluice.harness.ports import free_ports
from sluice.harness.processes import freeze, kill_group, spawn, tail


def etcd_binary() -> str:
    """The path of the ``etcd`` binary; ``RuntimeError`` when there is none."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if found is None:
        raise RuntimeError("no etcd binary on PATH or in /usr/bin: install Debian's etcd-server (scripts/test does)")
    return found


class EtcdProcess:
    """One etcd member named ``name``; ``kill``, ``start`` again on the same data,
    ``pause`` / ``resume``."""

    def __init__(self, data_dir: Path, log_path: Path, *, tuned: bool = True, name: str = "test") -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.tuned, self.name = tuned, name
        self.client_port, self.peer_port = free_ports(2)
        self.proc: subprocess.Popen | None = None

    def url(self, cluster: str) -> str:
        """The ``--cluster`` URL of Sluice cluster ``cluster`` (its key prefix) here."""
        return f"etcd://127.0.0.1:{self.client_port}/{cluster}"

    def start(self, timeout: float = 30) -> EtcdProcess:
        """Start and return once etcd reports healthy; ``RuntimeError`` (with its log) if
        it exits first or is not healthy within ``timeout`` s (it then still runs: kill it)."""
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        self.proc = spawn(
            [
                etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}",
                *(["--election-timeout", "500", "--heartbeat-interval", "50"] if self.tuned else []),
            ],
            self.log_path,
        )
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
        return tail(self.log_path, 5000)

    def kill(self) -> None:
        kill_group(self.proc)

    def pause(self) -> None:
        """SIGSTOP, returning once every thread of etcd has stopped (``processes.freeze``)."""
        freeze(self.proc.pid, group=True)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)
