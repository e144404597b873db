"""The archive pipeline, checked against counts read straight from the broker.

The expected counts per (topic, date) come from the Sluice consumer, and the archive is
read with pyarrow, so neither side of the comparison goes through Spark.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.dataset as ds

from sluice.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from sluice.harness import wait_until
from sluice.spark import pipelines

DAY_MS = 86_400_000
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
CREATE_TIME = {"timestamp.type": "CreateTime"}  # keep the producer's timestamps


def _produce(bootstrap: str, topic: str, n: int, first: int, partitions: int) -> None:
    """``n`` messages spread over partitions and over three days."""
    with SyncProducer(bootstrap, linger_ms=1) as p:
        futs = [
            p.send(
                topic,
                f"{topic}-{i}".encode(),
                partition=i % partitions,
                timestamp_ms=T0 + (i % 3) * DAY_MS + i,
                headers=[("n", str(i).encode())],
            )
            for i in range(first, first + n)
        ]
        p.flush()
        for f in futs:
            f.result(30)


def _expected(bootstrap: str, topics: list[str]) -> Counter:
    """{(topic, date): messages} read from the broker with the plain consumer."""
    counts: Counter = Counter()
    with SyncAdmin(bootstrap) as admin, SyncConsumer(
        bootstrap, enable_auto_commit=False
    ) as consumer:
        ends = {(t, p): off for t in topics for p, off in admin.list_offsets(t).items()}
        consumer.assign(list(ends))
        for tp in ends:
            consumer.seek(*tp, 0)
        left = sum(ends.values())
        while left:
            recs = consumer.getmany(timeout_ms=2000)
            assert recs, "the broker stopped returning records"
            for r in recs:
                day = datetime.fromtimestamp(r.timestamp / 1000, UTC).date().isoformat()
                counts[(r.topic, day)] += 1
            left -= len(recs)
    return counts


def _archived(output) -> tuple[Counter, list]:
    """{(topic, date): rows} and every (topic, partition, offset) of the Parquet archive,
    read with pyarrow from the files the file sink's log lists as committed."""
    files = [str(f) for f in pipelines.archived_files(output)]
    table = ds.dataset(
        files, format="parquet", partitioning="hive", partition_base_dir=str(output)
    ).to_table(columns=["topic", "date", "partition", "offset", "value", "headers"])
    rows = table.to_pylist()
    counts = Counter((r["topic"], str(r["date"])) for r in rows)
    ids = [(r["topic"], r["partition"], r["offset"]) for r in rows]
    for r in rows:
        assert r["value"] == f"{r['topic']}-{r['headers'][0]['value'].decode()}".encode()
    return counts, ids


def _archived_so_far(output) -> int:
    """Rows archived, while a query may still be writing (0 if a file is half-written)."""
    try:
        return sum(_archived(output)[0].values())
    except (OSError, pa.ArrowException):  # no committed batch yet
        return 0


def _run_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", bootstrap,
         "pipeline", "archive", "--master", "local[2]", *args],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip


def test_one_shot_archive_twice_keeps_each_message_once(broker, tmp_path):
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("orders", 2, config=CREATE_TIME)
        admin.create_topic("payments", 1, config=CREATE_TIME)
    _produce(broker.bootstrap, "orders", 900, 0, 2)
    _produce(broker.bootstrap, "payments", 300, 0, 1)
    out, ck = tmp_path / "archive", tmp_path / "checkpoint"
    args = ["--pattern", "orders|payments", "--output", str(out), "--checkpoint", str(ck)]

    first = _run_cli(broker.bootstrap, *args, "--max-offsets-per-trigger", "500")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "archived 1200 messages in 3 micro-batches" in first.stdout

    _produce(broker.bootstrap, "orders", 150, 900, 2)
    second = _run_cli(broker.bootstrap, *args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "archived 150 messages in 1 micro-batches" in second.stdout

    expected = _expected(broker.bootstrap, ["orders", "payments"])
    counts, ids = _archived(out)
    assert counts == expected
    assert len(ids) == len(set(ids)) == 1350
    assert {d for _, d in counts} == {"2023-11-14", "2023-11-15", "2023-11-16"}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("topic=")) == [
        "topic=orders",
        "topic=payments",
    ]


def test_cli_needs_topics_or_pattern(broker, tmp_path):
    res = _run_cli(broker.bootstrap, "--output", str(tmp_path / "o"), "--checkpoint", str(tmp_path))
    assert res.returncode != 0
    assert "--topic" in res.stderr and "--pattern" in res.stderr


def test_cli_unknown_topic_is_one_clear_line(broker, tmp_path):
    res = _run_cli(
        broker.bootstrap, "--topic", "nosuch", "--output", str(tmp_path / "o"),
        "--checkpoint", str(tmp_path / "ck"),
    )  # fmt: skip
    assert res.returncode == 1
    assert "error: UNKNOWN_TOPIC" in res.stderr and "nosuch" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr


def test_continuous_archive_follows_new_messages(spark, broker, tmp_path):
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("events", 2, config=CREATE_TIME)
    _produce(broker.bootstrap, "events", 200, 0, 2)
    out, ck = tmp_path / "archive", tmp_path / "checkpoint"

    def run_until(total: int):
        query = pipelines.archive(
            spark, bootstrap=broker.bootstrap, output=str(out), checkpoint=str(ck),
            topics=["events"], continuous=True, trigger_interval="500 milliseconds",
        )  # fmt: skip

        def archived() -> bool:
            assert query.exception() is None, query.exception()
            return _archived_so_far(out) >= total

        try:
            wait_until(archived, 120, f"{total} messages archived", interval=0.5)
        finally:
            query.stop()

    run_until(200)
    _produce(broker.bootstrap, "events", 100, 200, 2)
    run_until(300)  # restarted on the same checkpoint
    counts, ids = _archived(out)
    assert counts == _expected(broker.bootstrap, ["events"])
    assert len(ids) == len(set(ids)) == 300


def test_continuous_cli_stops_on_sigterm(broker, tmp_path):
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("clicks", 1, config=CREATE_TIME)
    _produce(broker.bootstrap, "clicks", 50, 0, 1)
    out = tmp_path / "archive"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", broker.bootstrap,
         "pipeline", "archive", "--topic", "clicks", "--output", str(out),
         "--checkpoint", str(tmp_path / "ck"), "--continuous",
         "--trigger-interval", "1 second", "--master", "local[2]"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    try:
        def archived() -> bool:
            if _archived_so_far(out) >= 50:
                return True
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            return False

        wait_until(archived, 120, "50 messages archived", interval=0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _archived(out)[0] == _expected(broker.bootstrap, ["clicks"])


def test_archive_killed_mid_run_resumes_exactly_once(broker, tmp_path):
    """kill -9 the whole pipeline (Python and Spark's JVM) while it writes; a second run on
    the same checkpoint completes the archive with every message once."""
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("audit", 2, config=CREATE_TIME)
    _produce(broker.bootstrap, "audit", 3000, 0, 2)
    out, ck = tmp_path / "archive", tmp_path / "checkpoint"
    args = ["--topic", "audit", "--output", str(out), "--checkpoint", str(ck)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", broker.bootstrap,
         "pipeline", "archive", *args, "--max-offsets-per-trigger", "100", "--master", "local[2]"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        def archived() -> bool:
            if _archived_so_far(out) >= 300:
                return True
            assert proc.poll() is None, "the pipeline ended before it was killed"
            return False

        wait_until(archived, 120, "300 messages archived", interval=0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _archived_so_far(out) < 3000, "killed too late to test anything"

    rerun = _run_cli(broker.bootstrap, *args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    counts, ids = _archived(out)
    assert counts == _expected(broker.bootstrap, ["audit"])
    assert len(ids) == len(set(ids)) == 3000
