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


def _fails_soon_after_a_kill(broker, proc: subprocess.Popen, stdin: bytes | None = None) -> bytes:
    """SIGKILL the broker, then wait for ``proc`` (given ``stdin``): it must fail (status
    1) well before the clients' default timeouts; its stderr."""
    try:
        broker.kill()
        started = time.monotonic()
        _, err = proc.communicate(stdin, timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert time.monotonic() - started < 20, err
    return err


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
    except BaseException:
        proc.kill()
        raise
    err = _fails_soon_after_a_kill(broker, proc, b"two\n")
    assert b"error: DELIVERY_TIMEOUT" in err and b"(1 of 2 messages failed)" in err, err


def test_consume_gives_up_after_its_retry_timeout(broker, cli):
    bs = broker.bootstrap
    assert cli("topic", "create", "orders", bootstrap=bs).returncode == 0
    assert cli("produce", "orders", bootstrap=bs, input=b"one\n").returncode == 0
    proc = _start(bs, "consume", "orders", "--from", "earliest", "--retry-timeout-ms", "1500")
    try:
        assert proc.stdout.readline() == b"one\n"  # it is reading
    except BaseException:
        proc.kill()
        raise
    err = _fails_soon_after_a_kill(broker, proc)
    assert b"error: BROKER_UNREACHABLE" in err and b"retry_timeout_ms=1500" in err, err
