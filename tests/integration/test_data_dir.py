"""One broker per data directory, refused before recovery touches anything (real processes)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from sluice.client import Consumer, Producer
from sluice.harness import free_port


def _serve(data_dir, port: int, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``sluice serve`` expecting it to refuse to start; returns the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "serve", "--data-dir", str(data_dir),
         "--port", str(port)],
        capture_output=True, timeout=timeout,
    )


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    async with Producer(bootstrap, linger_ms=0) as p:
        for v in values:
            await (await p.send(topic, v, partition=0))


async def _read(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(bootstrap, enable_auto_commit=False)
    consumer.assign([(topic, 0)])
    got: list[bytes] = []
    try:
        while len(got) < count:
            batch = await consumer.getmany(timeout_ms=5000)
            assert batch, f"stalled after {len(got)} of {count}"
            got += [r.value for r in batch]
    finally:
        await consumer.close()
    return got


def test_second_broker_on_a_live_data_dir_is_refused(broker_factory, cli):
    first = broker_factory().start()
    assert cli("topic", "create", "t", bootstrap=first.bootstrap).returncode == 0
    values = [b"acked-%d" % i for i in range(5)]
    asyncio.run(_produce(first.bootstrap, "t", values))
    before = sorted((p, p.stat().st_size) for p in first.data_dir.rglob("*.log"))

    res = _serve(first.data_dir, free_port())
    err = res.stderr.decode()
    assert res.returncode != 0
    assert "in use by another broker" in err and f"pid {first.proc.pid}" in err, err
    assert str(first.data_dir) in err
    assert "Traceback" not in err
    assert sorted((p, p.stat().st_size) for p in first.data_dir.rglob("*.log")) == before

    asyncio.run(_produce(first.bootstrap, "t", [b"after"]))
    assert asyncio.run(_read(first.bootstrap, "t", 6)) == values + [b"after"]
    first.stop()
    again = broker_factory(data_dir=first.data_dir)  # the lock went with the process
    again.start()
    assert asyncio.run(_read(again.bootstrap, "t", 6)) == values + [b"after"]


def test_lock_is_released_by_kill_9(broker_factory):
    first = broker_factory().start()
    first.kill()
    assert (first.data_dir / ".lock").exists()
    broker_factory(data_dir=first.data_dir).start()  # a stale lock file never blocks


def test_port_taken_is_refused_before_recovery(broker_factory, tmp_path):
    first = broker_factory().start()
    other = tmp_path / "other"
    res = _serve(other, first.port)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr.decode()
    assert not (other / "logs").exists()  # nothing was recovered or created


def test_data_dir_that_is_a_file(tmp_path):
    path = tmp_path / "plain-file"
    path.write_text("not a directory")
    res = _serve(path, free_port())
    err = res.stderr.decode()
    assert res.returncode == 2 and "is not a directory" in err and "Traceback" not in err, err
    assert err.startswith("error: USAGE_ERROR (1002): ") and "--data-dir" in err and err.count("\n") == 1, err
