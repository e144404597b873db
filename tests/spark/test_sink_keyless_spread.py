"""The Spark sink spreads keyless rows evenly over the target topic's partitions: 30,000
rows without key or partition into 3 partitions leave each partition between 25 % and 42 %
of them, for batch writes and streaming queries, exactly once and at least once.  (The
client writers: tests/integration/test_keyless_spread.py.)"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sluice.client.sync import SyncAdmin, SyncProducer
from sluice.spark.sink import PositionPartitioner, task_producer_id

pytestmark = pytest.mark.timeout(300)

ROWS = 30_000
MODES = {"exactly-once": "true", "at-least-once": "false"}


def shares(bootstrap: str, topic: str) -> list[float]:
    with SyncAdmin(bootstrap) as admin:
        ends = admin.list_offsets(topic)
    assert sum(ends.values()) == ROWS, ends
    return [ends[p] / ROWS for p in sorted(ends)]


def assert_even(got: list[float]) -> None:
    assert len(got) == 3 and all(0.25 <= s <= 0.42 for s in got), got


def test_exactly_once_placement_gives_every_partition_its_share_of_each_task():
    """A task's i-th keyless row goes to (start + i) mod n: a task of any size leaves its
    partitions within one row of each other (runs of 1,000 rows put every row of a task
    of up to 1,000 rows in one partition), and a rerun places each row where it was."""
    for rows in (1, 2, 7, 100, 4000):
        for task in range(6):
            start = task_producer_id("query", 3, task)
            first, again = PositionPartitioner(start), PositionPartitioner(start)
            placed = [first(None, 3) for _ in range(rows)]
            assert placed == [again(None, 3) for _ in range(rows)]
            counts = [placed.count(p) for p in range(3)]
            assert max(counts) - min(counts) <= 1, (rows, task, counts)


@pytest.mark.parametrize("mode", MODES)
def test_batch_write_spreads_keyless_rows(spark, broker, mode):
    target = f"spread-batch-{mode}"
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic(target, 3)
    df = spark.range(0, ROWS, numPartitions=2).select(
        F.lpad(F.col("id").cast("string"), 100, "v").cast("binary").alias("value")
    )
    (
        df.write.format("sluice").option("bootstrap", broker.bootstrap).option("topic", target)
        .option("exactlyOnce", MODES[mode]).mode("append").save()
    )  # fmt: skip
    assert_even(shares(broker.bootstrap, target))


@pytest.mark.parametrize("mode", MODES)
def test_streaming_write_spreads_keyless_rows(spark, broker, tmp_path, mode):
    source, target = f"spread-in-{mode}", f"spread-out-{mode}"
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic(source, 2)
        admin.create_topic(target, 3)
    with SyncProducer(broker.bootstrap) as producer:
        futs = []
        for p in range(2):
            futs.append(producer.send_many(source, [b"%099d" % i for i in range(p, ROWS, 2)], partition=p))
        producer.flush()
        for f in futs:
            f.result(30)
    frame = (
        spark.readStream.format("sluice").option("bootstrap", broker.bootstrap).option("topic", source)
        .option("startingOffsets", "earliest").load()
    )  # fmt: skip
    query = (
        frame.select("value").writeStream.format("sluice").option("bootstrap", broker.bootstrap)
        .option("topic", target).option("exactlyOnce", MODES[mode])
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        assert query.awaitTermination(240), "query still running"
    finally:
        query.stop()
    assert_even(shares(broker.bootstrap, target))
