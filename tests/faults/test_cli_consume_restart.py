"""``sluice consume`` rides out a broker crash, and says so in one readable line on stderr
(``warning: ...``, the form of its ``error:`` line), both with a group and with a
subscription (real broker processes)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest


class _Lines:
    """The consumer's stdout lines, read by a thread (select on a buffered pipe would miss
    lines already buffered)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.queue: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.queue.put(line)

    def next(self, timeout: float = 30.0) -> bytes:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message within the timeout") from None


@pytest.mark.parametrize("how", [["--group", "g", "--from", "earliest"], ["--sub", "s"]])
def test_consume_says_in_one_line_that_the_broker_went_and_goes_on(broker, cli, how):
    bs = broker.bootstrap
    assert cli("topic", "create", "orders", bootstrap=bs).returncode == 0
    assert cli("produce", "orders", bootstrap=bs, input=b"one\n").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", bs, "consume", "orders", *how],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    lines = _Lines(proc)
    try:
        assert lines.next() == b"one\n"
        broker.kill()
        time.sleep(1.0)  # long enough for the consumer to notice
        broker.start()
        assert cli("produce", "orders", bootstrap=bs, input=b"two\n").returncode == 0
        again = lines.next()
        if again == b"one\n":  # its commit or ack did not outlive the crash: at least once
            again = lines.next()
        assert again == b"two\n"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    err = proc.stderr.read().decode()
    said = [ln for ln in err.splitlines() if ln.strip()]
    if "--sub" in how:
        assert said.pop(0).startswith("created subscription s on orders"), err
    assert said and all(ln.startswith("warning: ") for ln in said), err
    assert "Traceback" not in err
