"""``sluice bench``: start a broker (unless given one), run workloads, print result rows.

The broker runs as a separate process (``sluice.harness``: its own session, so its whole
process group's CPU is measured) on a free loopback port with a temporary data directory,
and is stopped with SIGTERM at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from importlib.metadata import version as _pkg_version
from pathlib import Path

import psutil

from sluice import errors
from sluice.bench import workloads as w
from sluice.harness import BrokerProcess

ALL = ["P1-100B", "P1-1KiB", "P2-1KiB", "C1", "L1", "L1-fsync"]
# P1 with one send() per record (asyncio), and with SyncProducer.send from a plain loop
PER_RECORD = ["P1-send-100B", "P1-send-1KiB", "P1-syncsend-100B"]
SPARK = ["S1", "S2"]  # need the spark extra; run with --workload S1, S2 or spark
CLUSTER = ["R3", "F1"]  # 3 brokers + etcd (bench/cluster.py); run with --workload R3, F1 or cluster
# what idempotence costs: P1-1KiB (idempotent, the default) with a producer that is not;
# compare runs of each on its own broker (a second workload on one broker runs warmer)
NOT_IDEMPOTENT = ["P1-1KiB-plain"]
TRANSACTIONS = ["TX-1KiB"]  # transactional messages (bench/transactions.py)
SUBSCRIPTIONS = ["C2", "D1"]  # per-message acks (bench/subscriptions.py), delayed messages (bench/delayed.py)


class CpuMeter:
    """CPU of this process and of the broker's process group over the measured interval."""

    def __init__(self, server_pid: int | None) -> None:
        self.server = psutil.Process(server_pid) if server_pid else None
        self._t0 = self._c0 = self._s0 = 0.0

    def _server_cpu(self) -> float:
        if self.server is None:
            return 0.0
        procs = [self.server, *self.server.children(recursive=True)]
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def start(self) -> None:
        self._t0, self._c0, self._s0 = time.perf_counter(), time.process_time(), self._server_cpu()

    def stop(self) -> str:
        wall = time.perf_counter() - self._t0
        client = (time.process_time() - self._c0) / wall * 100
        server = (self._server_cpu() - self._s0) / wall * 100 if self.server else float("nan")
        return f"client_cpu={client:.0f}% server_cpu={server:.0f}%"


@contextlib.contextmanager
def broker_process():
    """A broker (``sluice.harness.BrokerProcess``) on a free port with a temporary data dir
    and log file; yields (bootstrap, pid).  Stopped with SIGTERM (SIGKILL after 30 s) on the
    way out, whatever happens."""
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as root:
        broker = BrokerProcess(Path(root) / "data", Path(root) / "broker.log", log_level="WARNING")
        try:
            broker.start()
            yield broker.bootstrap, broker.pid
        finally:
            broker.stop(strict=False)


def _run_one(name: str, bootstrap: str, meter: CpuMeter) -> w.Row:
    if name in SPARK:
        from sluice.bench import spark

        return spark.run_s1(bootstrap, meter) if name == "S1" else spark.run_s2(bootstrap, meter)
    return asyncio.run(_run_async(name, bootstrap, meter))


async def _run_async(name: str, bootstrap: str, meter: CpuMeter) -> w.Row:
    if name == "P1-100B":
        return await w.run_publish(bootstrap, name, 100, 200_000, w.PAGE_CACHE, meter)
    if name == "P1-1KiB":
        return await w.run_publish(bootstrap, name, 1024, 100_000, w.PAGE_CACHE, meter)
    if name == "P1-1KiB-plain":
        return await w.run_publish(bootstrap, name, 1024, 100_000, w.PAGE_CACHE, meter, enable_idempotence=False)
    if name == "P1-send-100B":
        return await w.run_publish(bootstrap, name, 100, 200_000, w.PAGE_CACHE, meter, client="send")
    if name == "P1-send-1KiB":
        return await w.run_publish(bootstrap, name, 1024, 100_000, w.PAGE_CACHE, meter, client="send")
    if name == "P1-syncsend-100B":
        return await w.run_publish(bootstrap, name, 100, 200_000, w.PAGE_CACHE, meter, client="sync")
    if name == "P2-1KiB":
        return await w.run_publish(bootstrap, name, 1024, 100_000, w.FSYNC_ALWAYS, meter)
    if name == "TX-1KiB":
        from sluice.bench.transactions import run_tx

        return await run_tx(bootstrap, meter)
    if name == "C1":
        return await w.run_c1(bootstrap, meter)
    if name == "C2":
        from sluice.bench.subscriptions import run_c2

        return await run_c2(bootstrap, meter)
    if name == "D1":
        from sluice.bench.delayed import run_d1

        return await run_d1(bootstrap, meter, meter.server.pid if meter.server else None)
    if name == "L1":
        return await w.run_l1(bootstrap, meter)
    if name == "L1-fsync":
        return await w.run_l1(bootstrap, meter, name=name, config=w.FSYNC_ALWAYS)
    raise ValueError(name)


def run_workloads(workload: str, as_json: bool, bootstrap: str | None = None) -> tuple[list[dict], str | None]:
    """Run and print the rows of ``workload`` (a name or a group); return the rows and the
    run's one-line failure (``summary_error``: None when no workload failed)."""
    from sluice.server.app import install_uvloop

    loop_name = install_uvloop()
    groups = {"all": ALL, "spark": SPARK, "cluster": CLUSTER, "per-record": PER_RECORD}
    every = ALL + SPARK + CLUSTER + NOT_IDEMPOTENT + TRANSACTIONS + PER_RECORD + SUBSCRIPTIONS
    names = groups.get(workload.lower()) or [n for n in every if n.lower() == workload.lower()]
    from sluice.protocol.records import COMPILED

    codec = "compiled codec" if COMPILED else "pure-Python codec"
    version = f"{_pkg_version('sluice')}, python {sys.version.split()[0]}, {loop_name}, {codec}"
    if names and all(n in CLUSTER for n in names):
        return _run_cluster(names, as_json, version)
    rows: list[dict] = []
    raised: dict[str, BaseException] = {}
    with contextlib.ExitStack() as stack:
        pid = None
        if bootstrap is None:
            bootstrap, pid = stack.enter_context(broker_process())
        for name in names:
            meter = CpuMeter(pid)
            try:
                with _status(f"running {name}", enabled=not as_json):
                    row = _run_one(name, bootstrap, meter).as_dict(version)
            except Exception as exc:  # a failed workload is a row, not a crash
                row = _failed_row(name, exc, version, raised)
            rows.append(row)
            _print(row, as_json)
    return rows, summary_error(rows, raised)


def _run_cluster(names: list[str], as_json: bool, version: str) -> tuple[list[dict], str | None]:
    """Cluster workloads, each on a fresh local cluster (bench/cluster.py)."""
    from sluice.bench import cluster as c

    rows: list[dict] = []
    raised: dict[str, BaseException] = {}
    for name in names:
        try:
            with _status(f"running {name}", enabled=not as_json), c.local_cluster() as local:
                meter = CpuMeter(None)
                run = c.run_r3 if name == "R3" else c.run_f1
                row = asyncio.run(run(local, meter)).as_dict(version)
        except Exception as exc:  # a failed workload is a row, not a crash
            row = _failed_row(name, exc, version, raised)
        rows.append(row)
        _print(row, as_json)
    return rows, summary_error(rows, raised)


def _failed_row(name: str, exc: Exception, version: str, raised: dict[str, BaseException]) -> dict:
    """The row of workload ``name`` that raised ``exc`` (kept in ``raised`` for
    ``summary_error``)."""
    raised[name] = exc
    return w.Row(name, notes=[f"FAILED: {type(exc).__name__}: {exc}"]).as_dict(version)


def failed(row: dict) -> bool:
    """Whether a row says its workload failed (it raised, or its counts did not check)."""
    return any(note.startswith("FAILED") for note in row["notes"].split("; "))


def summary_error(rows: list[dict], raised: dict[str, BaseException]) -> str | None:
    """The one-line failure of a bench run (None when no row says FAILED): the first failed
    workload's error, ``NAME (code): message`` as every error line (what it raised when
    that was a Sluice error, else ``SLUICE_ERROR`` with its row's note), then which
    workload and how many failed."""
    bad = [row for row in rows if failed(row)]
    if not bad:
        return None
    name = bad[0]["workload"]
    exc = raised.get(name)
    if not isinstance(exc, errors.SluiceError):
        note = next(n for n in bad[0]["notes"].split("; ") if n.startswith("FAILED"))
        exc = errors.SluiceError(note.removeprefix("FAILED").lstrip(": ") or "failed")
    return f"{errors.describe(exc)} (workload {name}; {len(bad)} of {len(rows)} workloads failed)"


@contextlib.contextmanager
def _status(text: str, enabled: bool):
    if not (enabled and sys.stderr.isatty()):
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(text):
        yield


def _print(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
        return
    from rich.console import Console

    lat = f" p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms p99.9 {row['p999_ms']} ms" if row["p50_ms"] is not None else ""
    Console().print(
        f"[bold]{row['workload']}[/]: {row['msgs']} msgs in {row['seconds']} s = "
        f"[green]{row['msgs_per_s']:,.0f} msg/s[/] ({row['mb_per_s']} MB/s){lat}\n  {row['notes']}"
    )
