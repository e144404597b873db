"""The command line with arguments that are not UTF-8 and with standard streams closed:
one usage error line, never a traceback or an aborted event loop."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

X = b"\xff"  # not UTF-8


def sluice_sh(bootstrap: str, args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    """``sluice ARGS`` through a shell, for its redirections (``<&-`` closes stdin)."""
    cmd = f"{shlex.quote(sys.executable)} -m sluice.cli.main --bootstrap {bootstrap} {args}"
    return subprocess.run(["sh", "-c", cmd], input=input, capture_output=True, timeout=60)


@pytest.mark.parametrize("args", [
    [b"topic", b"create", b"t" + X],
    [b"produce", b"orders", b"--key", b"k" + X],
    [b"produce", b"orders", b"-H", b"k=" + X],
    [b"consume", b"orders", b"--group", b"g" + X, b"--timeout-ms", b"100"],
    [b"sub", b"create", b"orders", b"s" + X],
    [b"txn", b"commit", b"orders" + X + b"/0/0"],
])
def test_arguments_that_are_not_utf8_are_a_usage_error(broker, cli, args):
    cli("topic", "create", "orders", bootstrap=broker.bootstrap)
    res = subprocess.run(
        [sys.executable.encode(), b"-m", b"sluice.cli.main", b"--bootstrap", broker.bootstrap.encode(), *args],
        input=b"x\n", capture_output=True, timeout=60,
    )
    assert res.returncode == 2, res
    assert res.stderr.startswith(b"error: USAGE_ERROR (1002): not UTF-8 text: ") and b"\\xff" in res.stderr
    assert b"Traceback" not in res.stderr


def test_a_bootstrap_host_that_is_not_utf8_is_a_usage_error():
    res = subprocess.run(
        [sys.executable.encode(), b"-m", b"sluice.cli.main", b"--bootstrap", b"h" + X + b":1", b"topic", b"list"],
        capture_output=True, timeout=60,
    )
    assert res.returncode == 2 and b"USAGE_ERROR (1002)" in res.stderr and b"Traceback" not in res.stderr, res


def test_closed_standard_streams(broker, cli):
    bs = broker.bootstrap
    cli("topic", "create", "orders", bootstrap=bs)
    closed_in = sluice_sh(bs, "produce orders <&-")
    assert closed_in.returncode == 2 and b"standard input is closed" in closed_in.stderr, closed_in
    assert sluice_sh(bs, "produce orders 2>&-", input=b"kept\n").returncode == 0  # no stderr: still sends
    closed_out = sluice_sh(bs, "consume orders --from earliest --timeout-ms 200 >&-")
    assert closed_out.returncode == 2 and b"standard output is closed" in closed_out.stderr, closed_out
    assert sluice_sh(bs, "topic list >&-").returncode == 0
    got = cli("consume", "orders", "--from", "earliest", "--timeout-ms", "500", bootstrap=bs)
    assert got.stdout == b"kept\n", got


def test_a_header_given_twice_is_sent_twice_and_sluice_headers_are_refused(broker, cli):
    bs = broker.bootstrap
    cli("topic", "create", "orders", bootstrap=bs)
    sent = cli("produce", "orders", "-H", "a=1", "-H", "b=x", "-H", "a=2", bootstrap=bs, input=b"m\n")
    assert sent.returncode == 0, sent
    forged = cli("produce", "orders", "-H", "sluice.deliver_at=1", bootstrap=bs, input=b"f\n")
    assert forged.returncode == 2 and b"set by Sluice itself" in forged.stderr
    got = cli("consume", "orders", "--from", "earliest", "--timeout-ms", "500", "--json", bootstrap=bs)
    [rec] = [json.loads(line) for line in got.stdout.splitlines()]
    assert rec["headers"] == {"a": ["1", "2"], "b": "x"}
