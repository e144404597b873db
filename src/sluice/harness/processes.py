"""Child processes in their own process group, their output in a log file, and the signals
the harness sends them.

Every child starts a new session (``start_new_session``), so a signal to its group reaches
whatever it started too, and a benchmark can measure the CPU of the whole group.  Whoever
spawns a child stops it (``stop_group`` / ``kill_group``) in a ``finally`` or a fixture's
teardown, also when the test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def spawn(args: list[str], log_path: Path) -> subprocess.Popen:
    """Start ``args`` in a new session with stdout and stderr appended to ``log_path``."""
    with open(log_path, "ab") as log:  # the child holds its own descriptor
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen | None) -> None:
    """SIGKILL the process group of ``proc`` (if it still runs) and reap it."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def stop_group(proc: subprocess.Popen | None, timeout: float) -> bool:
    """SIGTERM the process group of ``proc`` and wait up to ``timeout`` s for ``proc`` to
    exit; if it does not, SIGKILL the group.  Returns whether it exited on SIGTERM (or had
    exited before)."""
    if proc is None or proc.poll() is not None:
        return True
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return False
    return True


def tail(log_path: Path, chars: int | None = None) -> str:
    """The text of ``log_path`` (its last ``chars`` characters), "" if there is none."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return text if chars is None else text[-chars:]


def freeze(pid: int, group: bool = False) -> None:
    """SIGSTOP ``pid`` (its process group with ``group``) and return once every thread of
    ``pid`` has stopped: the signal stops a thread running on another core only a moment
    later, and a request sent in that moment would still be answered."""
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not _all_threads_stopped(pid):
        if time.monotonic() >= deadline:
            raise AssertionError(f"process {pid} did not stop within 5 s of SIGSTOP")
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
