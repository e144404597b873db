"""The Spark sink writes exactly once: a streaming topic -> topic query whose tasks fail
after sending, or which is killed mid micro-batch and started again on its checkpoint,
leaves exactly one copy of every input record in the target topic (tests/spark/eos_query.py
runs the query in its own Spark)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sluice.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from sluice.spark.sink import PositionPartitioner, task_producer_id

pytestmark = pytest.mark.timeout(300)

QUERY = Path(__file__).with_name("eos_query.py")
N = 1200  # per source partition: each task of the micro-batch reaches the fault row


def _fill(bootstrap: str, source: str, target: str) -> list[bytes]:
    with SyncAdmin(bootstrap) as admin:
        admin.create_topic(source, 2)
        admin.create_topic(target, 3)
    values = [b"v-%05d" % i for i in range(2 * N)]
    with SyncProducer(bootstrap) as p:
        futs = [p.send(source, v, key=b"k%d" % (i % 7) if i % 3 else None, partition=i % 2) for i, v in enumerate(values)]
        p.flush()
        for f in futs:
            f.result(30)
    return values


def _copies(bootstrap: str, topic: str) -> Counter:
    got: Counter = Counter()
    with SyncAdmin(bootstrap) as admin, SyncConsumer(bootstrap, enable_auto_commit=False) as consumer:
        ends = admin.list_offsets(topic)
        consumer.assign([(topic, p) for p in ends])
        for p in ends:
            consumer.seek(topic, p, 0)
        left = sum(ends.values())
        while left > 0:
            recs = consumer.getmany(timeout_ms=2000)
            assert recs, "the broker stopped returning records"
            got.update(r.value for r in recs)
            left -= len(recs)
    return got


def _run(bootstrap, source, target, ck, mode, marker) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(QUERY), bootstrap, source, target, str(ck), mode, str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    return text


def test_tasks_failing_after_sending_leave_one_copy_of_each_record(broker, tmp_path):
    values = _fill(broker.bootstrap, "eos-in", "eos-out")
    marker = tmp_path / "failed"
    _finish(_run(broker.bootstrap, "eos-in", "eos-out", tmp_path / "ck", "fail-once", marker))
    assert marker.exists(), "no task failed: the test proved nothing"
    copies = _copies(broker.bootstrap, "eos-out")
    assert copies == Counter(values), {v: n for v, n in copies.items() if n != 1}


def test_a_query_killed_mid_batch_and_restarted_leaves_one_copy(broker, tmp_path):
    values = _fill(broker.bootstrap, "eos-in2", "eos-out2")
    marker = tmp_path / "hung"
    proc = _run(broker.bootstrap, "eos-in2", "eos-out2", tmp_path / "ck", "hang", marker)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "the query never reached its fault"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, Spark's JVM and its Python workers
        proc.wait()
    partial = sum(_copies(broker.bootstrap, "eos-out2").values())
    assert 0 < partial < len(values), "killed before or after the micro-batch wrote"
    _finish(_run(broker.bootstrap, "eos-in2", "eos-out2", tmp_path / "ck", "plain", marker))
    copies = _copies(broker.bootstrap, "eos-out2")
    assert copies == Counter(values), {v: n for v, n in copies.items() if n != 1}


def test_task_identities_and_keyless_placement_depend_on_their_inputs_only():
    a = task_producer_id("query", 7, 3)
    assert a == task_producer_id("query", 7, 3) and 2**62 <= a < 2**63
    assert len({task_producer_id("query", b, p) for b in range(50) for p in range(50)}) == 2500
    first, again = PositionPartitioner(2), PositionPartitioner(2)
    keys = [None if i % 4 else b"k%d" % i for i in range(5000)]
    assert [first(k, 5) for k in keys] == [again(k, 5) for k in keys]
    assert len({first(None, 5) for _ in range(5000)}) == 5, "keyless runs go round the partitions"
