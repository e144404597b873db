"""The benchmark workloads at toy sizes: `sluice bench` must keep working (not a speed test)."""

from __future__ import annotations

import asyncio

import pytest

from cli.test_cli import assert_error, json_lines
from sluice import errors
from sluice.bench import workloads as w
from sluice.bench.runner import CpuMeter
from sluice.bench.transactions import run_tx


@pytest.mark.timeout(120)
def test_every_workload_runs_and_checks_its_counts(broker):
    meter = CpuMeter(broker.proc.pid)
    p1 = asyncio.run(w.run_publish(broker.bootstrap, "P1-100B", 100, 3000, w.PAGE_CACHE, meter))
    assert p1.msgs == 3000 and p1.bytes == 300_000 and "server_cpu=" in p1.notes[-1]
    p2 = asyncio.run(w.run_publish(broker.bootstrap, "P2-1KiB", 1024, 2000, w.FSYNC_ALWAYS, meter))
    assert p2.msgs == 2000
    plain = asyncio.run(w.run_publish(
        broker.bootstrap, "P1-1KiB-plain", 1024, 2000, w.PAGE_CACHE, meter, enable_idempotence=False
    ))
    assert plain.msgs == 2000 and "not idempotent" in " ".join(plain.notes)
    tx = asyncio.run(run_tx(broker.bootstrap, meter, seconds=0.5))
    assert tx.msgs > 0 and tx.p99_ms >= tx.p50_ms
    c1 = asyncio.run(w.run_c1(broker.bootstrap, meter, count=5000))
    assert c1.msgs == 5000 and c1.bytes == 5000 * 1024
    l1 = asyncio.run(w.run_l1(broker.bootstrap, meter, rate=500, seconds=1.0))
    assert l1.msgs == 500 and l1.p50_ms is not None and l1.p99_ms >= l1.p50_ms
    assert not any("FAILED" in n for n in l1.notes)
    l1f = asyncio.run(w.run_l1(broker.bootstrap, meter, rate=500, seconds=1.0, name="L1-fsync", config=w.FSYNC_ALWAYS))
    assert l1f.workload == "L1-fsync" and l1f.msgs == 500 and l1f.p99_ms >= l1f.p50_ms
    assert not any("FAILED" in n for n in l1f.notes) and "flush.messages=1" in " ".join(l1f.notes)
    row = l1.as_dict("test")
    assert set(row) >= {"system", "workload", "msgs", "bytes", "seconds", "msgs_per_s", "mb_per_s",
                        "p50_ms", "p99_ms", "p999_ms", "max_ms", "notes"}


@pytest.mark.timeout(120)
def test_subscription_and_delayed_workloads_run(broker):
    from sluice.bench.delayed import run_d1
    from sluice.bench.subscriptions import run_c2

    meter = CpuMeter(broker.proc.pid)
    c2 = asyncio.run(run_c2(broker.bootstrap, meter, count=3000))
    assert c2.msgs == 3000 and c2.bytes == 3000 * 1024
    d1 = asyncio.run(run_d1(broker.bootstrap, meter, broker.proc.pid, count=2000, lead_s=3.0, spread_s=1.0))
    assert d1.msgs == 2000 and d1.p50_ms is not None and d1.p99_ms >= d1.p50_ms >= 0
    assert "broker RSS" in d1.notes[0]


def test_a_failed_workload_prints_its_row_and_fails_the_command(cli):
    res = cli("bench", "--workload", "l1", "--bootstrap", "127.0.0.1:1", bootstrap="127.0.0.1:1")
    line = assert_error(res, "(workload L1; 1 of 1 workloads failed)")
    assert line.startswith("error: BROKER_UNREACHABLE (1007): cannot connect to 127.0.0.1:1")
    assert res.returncode == 1
    [row] = json_lines(res.stdout.decode())
    assert row["workload"] == "L1" and row["notes"].startswith("FAILED: BrokerUnreachable: ")


def test_the_first_failed_row_names_the_failure():
    from sluice.bench.runner import summary_error

    def row(name, *notes):
        return w.Row(name, notes=list(notes)).as_dict("test")

    fine = row("P1-100B", "page-cache ack")
    assert summary_error([fine], {}) is None
    short = row("L1", "page-cache ack", "FAILED: consumer received 3 of 5")  # counts that did not check
    crashed = row("C1", "FAILED: RuntimeError: boom")
    unreachable = row("C2", "FAILED: BrokerUnreachable: no")
    assert summary_error([fine, short, crashed], {"C1": RuntimeError("boom")}) == (
        "SLUICE_ERROR (1000): consumer received 3 of 5 (workload L1; 2 of 3 workloads failed)")
    assert summary_error([crashed, fine], {"C1": RuntimeError("boom")}) == (
        "SLUICE_ERROR (1000): RuntimeError: boom (workload C1; 1 of 2 workloads failed)")
    assert summary_error([unreachable], {"C2": errors.BrokerUnreachable("no")}) == (
        "BROKER_UNREACHABLE (1007): no (workload C2; 1 of 1 workloads failed)")
