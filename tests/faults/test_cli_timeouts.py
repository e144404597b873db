"""How long ``sluice produce`` and ``sluice consume`` go on retrying once the broker is
gone: ``--delivery-timeout-ms`` and ``--retry-timeout-ms`` (a real broker, SIGKILLed)."""

from __future__ import annotations

import subprocess
import sys
import time


def _start(bs: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", bs, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def test_produce_gives_up_after_its_delivery_timeout(broker, cli):
    bs = broker.bootstrap
    assert cli("topic", "create", "orders", bootstrap=bs).returncode == 0
    proc = _start(bs, "produce", "orders", "--delivery-timeout-ms", "1500")
    try:
        proc.stdin.write(b"one\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while cli("consume", "orders", "--from", "earliest", "-e", bootstrap=bs).stdout != b"one\n":
            assert time.monotonic() < deadline, "the first message was not stored"
            time.sleep(0.1)
        broker.kill()
        started = time.monotonic()
        _, err = proc.communicate(b"two\n", timeout=60)
    finally:
        proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == 1, err
    assert b"error: DELIVERY_TIMEOUT" in err and b"(1 of 2 messages failed)" in err, err
    assert took < 20, took  # not the default 120 s


def test_consume_gives_up_after_its_retry_timeout(broker, cli):
    bs = broker.bootstrap
    assert cli("topic", "create", "orders", bootstrap=bs).returncode == 0
    assert cli("produce", "orders", bootstrap=bs, input=b"one\n").returncode == 0
    proc = _start(bs, "consume", "orders", "--from", "earliest", "--retry-timeout-ms", "1500")
    try:
        assert proc.stdout.readline() == b"one\n"  # it is reading
        broker.kill()
        started = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == 1, err
    assert b"error: BROKER_UNREACHABLE" in err and b"retry_timeout_ms=1500" in err, err
    assert took < 20, took  # not the default 60 s
