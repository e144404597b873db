"""``BrokerProcess``: ``sluice serve`` as a child process on a free loopback port.

Each broker has its own data directory and log file; it can be killed (SIGKILL), stopped
(SIGTERM) and started again on the same data and port.  Whoever starts one kills or stops
it, whatever happens.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from sluice.harness.ports import free_port
from sluice.harness.processes import kill_group, spawn, stop_group, tail

# levels at which the broker logs "listening on HOST:PORT" (server/app.py)
_ANNOUNCING = ("DEBUG", "INFO")


class BrokerProcess:
    """One broker.  ``extra_args`` go to ``sluice serve`` after the data directory and
    port; they may be changed before each ``start``.  ``log_level`` is the broker's
    ``--log-level``.  Not thread-safe: one caller drives it."""

    def __init__(
        self, data_dir: Path, log_path: Path, extra_args: list[str] | None = None, *, log_level: str = "INFO"
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.log_level = log_level
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 30) -> BrokerProcess:
        """Start and return once the broker listens; ``RuntimeError`` (with its log) if it
        exits first or does not listen within ``timeout`` s (it then still runs: kill it)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = spawn(
            [
                sys.executable, "-m", "sluice.cli.main", "--log-level", self.log_level,
                "serve", "--data-dir", str(self.data_dir), "--port", str(self.port), *self.extra_args,
            ],
            self.log_path,
        )
        # Started once it says so in its log (an answer on the port alone could come from
        # another process that took the port meanwhile) and answers there.  Below INFO it
        # says nothing: then the answer alone counts.
        listening = f"listening on 127.0.0.1:{self.port} ".encode()
        announces = self.log_level.upper() in _ANNOUNCING
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if not announces or self._said(listening, logged):
                    with socket.create_connection(("127.0.0.1", self.port), 0.2):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker did not listen within {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def _said(self, text: bytes, since: int) -> bool:
        with open(self.log_path, "rb") as f:
            f.seek(since)
            return text in f.read()

    def log(self) -> str:
        return tail(self.log_path)

    def kill(self) -> None:
        """SIGKILL the broker: no flush, no cleanup."""
        kill_group(self.proc)

    def stop(self, timeout: float = 30, *, strict: bool = True) -> int:
        """SIGTERM and wait: the clean shutdown path.  Returns the exit status.  A broker
        still running after ``timeout`` s is killed, and with ``strict`` that is an
        ``AssertionError``."""
        if not stop_group(self.proc, timeout) and strict:
            raise AssertionError(f"broker ignored SIGTERM for {timeout}s")
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
