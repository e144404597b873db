"""The Spark guide's example (docs/guides/spark.md), pasted as written (only the broker's address differs), run twice
in a new Python process after the README's Python examples would have left ``orders`` (3
partitions) and ``payments`` behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sluice.client.sync import SyncAdmin, SyncConsumer, SyncProducer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "spark.md"
ADDRESS = "127.0.0.1:7400"


def spark_block() -> str:
    found = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(found) == 1, f"one python block in the Spark guide, found {len(found)}"
    return found[0]


def upper_values(bootstrap: str) -> list[bytes]:
    consumer = SyncConsumer(bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50)
    try:
        consumer.assign([("orders-upper", p) for p in range(3)])
        for p in range(3):
            consumer.seek("orders-upper", p, 0)
        out, quiet = [], 0
        while quiet < 5:
            batch = consumer.getmany(timeout_ms=200)
            out += [r.value for r in batch]
            quiet = 0 if batch else quiet + 1
        return sorted(out)
    finally:
        consumer.close()


def test_spark_example_runs_twice(spark, broker, tmp_path):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("orders", 3)
        admin.create_topic("payments", 3)
    with SyncProducer(b) as producer:
        for p, values in enumerate([[b"a", b"b", b"c"], [b"d"], []]):
            for v in values:
                producer.send("orders", v, partition=p)
        producer.send("payments", b"paid", partition=1)
        producer.flush()
    code = spark_block()
    assert ADDRESS in code
    for run in (1, 2):
        res = subprocess.run([sys.executable, "-c", code.replace(ADDRESS, b)], cwd=tmp_path,
                             capture_output=True, timeout=240)
        assert res.returncode == 0, res.stderr.decode(errors="replace")[-3000:]
        # offsets 1.. of partition 0, all of 1 (and the empty 2), upper-cased: once per run
        assert upper_values(b) == sorted([b"B", b"C", b"D"] * run)
    lake = spark.read.parquet(str(tmp_path / "lake" / "orders")).select("topic", "value").collect()
    assert sorted((r.topic, bytes(r.value)) for r in lake) == sorted(
        [("orders", v) for v in (b"a", b"b", b"c", b"d")] + [("payments", b"paid")]
    )  # the stream's checkpoint: the second run adds nothing
