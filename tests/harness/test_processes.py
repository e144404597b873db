"""sluice.harness: free ports are distinct and never handed out twice; a child runs in its
own process group with its output in its log, and stopping it ends the whole group."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import pytest

from sluice.harness import free_ports, freeze
from sluice.harness.ports import ephemeral_range
from sluice.harness.processes import kill_group, spawn, stop_group, tail

# a child that starts a grandchild and says both pids; SIGTERM ends it (default action)
PARENT = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(c.pid, flush=True); time.sleep(60)"
# a child that ignores SIGTERM
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def test_free_ports_are_distinct_and_not_handed_out_again():
    first = free_ports(20)
    second = free_ports(20)
    assert len(set(first)) == 20 and len(set(second)) == 20
    assert not set(first) & set(second)


@pytest.mark.skipif(ephemeral_range() is None, reason="the kernel's ephemeral port range is unknown here")
def test_free_ports_are_never_ones_an_outgoing_connection_may_take():
    """A broker restarted on its port after a kill must find it free: a port from the
    ephemeral range can meanwhile be the local port of any client's connection."""
    low, high = ephemeral_range()
    ports = free_ports(50)
    assert all(p < low or p > high for p in ports), ports
    with socket.create_server(("127.0.0.1", 0)) as server:  # an outgoing connection's port
        with socket.create_connection(server.getsockname()) as client:
            assert low <= client.getsockname()[1] <= high
            assert client.getsockname()[1] not in free_ports(50)


def _said(log, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not tail(log).strip():
        assert time.monotonic() < deadline, "the child said nothing"
        time.sleep(0.01)
    return tail(log)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except FileNotFoundError:
        return True


def test_stopping_a_child_ends_its_whole_group(tmp_path):
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", PARENT], log)
    try:
        grandchild = int(_said(log))
        assert os.getpgid(proc.pid) == proc.pid  # a group of its own
        assert stop_group(proc, 10) is True
        assert proc.returncode == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while not _gone(grandchild):
            assert time.monotonic() < deadline, "the grandchild outlived its group's SIGTERM"
            time.sleep(0.01)
    finally:
        kill_group(proc)


def test_a_child_ignoring_sigterm_is_killed(tmp_path):
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", STUBBORN], log)
    try:
        assert _said(log).strip() == "ready"
        assert stop_group(proc, 0.5) is False
        assert proc.returncode == -signal.SIGKILL
    finally:
        kill_group(proc)


def test_freeze_returns_once_every_thread_stopped(tmp_path):
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"], log)
    try:
        _said(log)
        freeze(proc.pid, group=True)
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{task}/stat") as f:
                assert f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
        os.killpg(proc.pid, signal.SIGCONT)
    finally:
        kill_group(proc)


@pytest.mark.parametrize("log_exists", [False, True])
def test_tail_of_a_missing_or_long_log(tmp_path, log_exists):
    log = tmp_path / "x.log"
    if log_exists:
        log.write_text("a" * 10 + "b" * 5)
        assert tail(log, 5) == "bbbbb"
    else:
        assert tail(log) == ""
