"""Real broker processes for integration and fault tests (imported by ``conftest`` and by
tests that start brokers themselves: ``from brokers import BrokerProcess, free_port``).

``BrokerProcess`` starts ``sluice serve`` as a child process on a free loopback port with
its own data directory; tests can ``kill()`` it (SIGKILL), ``stop()`` it (SIGTERM) and
``start()`` it again on the same data.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    return free_ports(1)[0]


_handed_out: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all bound at once, then released), none of them
    handed out before in this process: a port picked for a broker that has not started yet
    is free again as far as the kernel knows, and must not go to a second broker."""
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] in _handed_out:
                socks.pop()
                s.close()
        ports = [s.getsockname()[1] for s in socks]
        _handed_out.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()


def freeze(pid: int, group: bool = False) -> None:
    """SIGSTOP ``pid`` (its process group with ``group``) and return once every thread of
    ``pid`` has stopped: the signal stops a thread running on another core only a moment
    later, and a request sent in that moment would still be answered."""
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not _all_threads_stopped(pid):
        assert time.monotonic() < deadline, f"process {pid} did not stop within 5 s of SIGSTOP"
        time.sleep(0.001)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in state T (stopped), as /proc tells."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that just ended
            continue
        states.append(stat.rsplit(")", 1)[1].split()[0])
    return all(st in ("T", "t") for st in states)


class BrokerProcess:
    def __init__(self, data_dir: Path, log_path: Path, extra_args: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> BrokerProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice.cli.main",
                "--log-level",
                "INFO",
                "serve",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        # Started once it says so in its log (an answer on the port alone could come from
        # another process that took the port meanwhile) and answers there.
        listening = f"listening on 127.0.0.1:{self.port} ".encode()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(logged)
                    said = listening in f.read()
                if said:
                    with socket.create_connection(("127.0.0.1", self.port), 0.2):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker did not listen within {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL the broker: no flush, no cleanup."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit status."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"broker ignored SIGTERM for {timeout}s") from None
        return self.proc.returncode if self.proc else 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def refused(self, *needles: str) -> None:
        """Start, expecting the broker to refuse: its error names every needle.  It is
        stopped in any case."""
        try:
            self.start()
        except RuntimeError as exc:
            assert all(n in str(exc) for n in needles), (needles, exc)
        else:
            raise AssertionError(f"the broker started; expected a refusal naming {needles}")
        finally:
            self.kill()
