"""A streaming topic -> topic query for the exactly-once tests, run as its own process.

    python eos_query.py BOOTSTRAP SOURCE TARGET CHECKPOINT MODE MARKER

Spark runs ``local[2,3]`` (a failed task is retried, up to 3 attempts), with Arrow batches of
100 rows, so a task hands its rows to the sink in many batches.  A Python UDF on the way
counts each task's rows and, at row ``FAULT_AT`` of a task's first attempt, waits until some
of the query's output is stored in TARGET, then injects the fault:

- ``fail-once``: touches MARKER and raises: Spark retries the task, which sends its rows
  again;
- ``hang``: touches MARKER and sleeps: the test kills the whole process group there, mid
  micro-batch, and runs the query again on the same checkpoint;
- ``plain``: no fault.

The query uses ``trigger(availableNow=True)`` and exits once the source is drained.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

FAULT_AT = 250


def main() -> None:
    bootstrap, source, target, checkpoint, mode, marker = sys.argv[1:7]
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    from sluice.spark.pipelines import session

    spark = session("local[2,3]", "sluice-eos-test", {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100",
        "spark.sql.shuffle.partitions": "2",
    })  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")

    def stored_in_target() -> int:
        from sluice.client.sync import SyncAdmin

        with SyncAdmin(bootstrap) as admin:
            return sum(admin.list_offsets(target).values())

    seen: dict = {}

    def fault(value: bytes) -> bytes:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = (ctx.stageId(), ctx.partitionId(), ctx.attemptNumber())
        seen[task] = n = seen.get(task, 0) + 1
        if mode != "plain" and n == FAULT_AT and ctx.attemptNumber() == 0:
            deadline = time.monotonic() + 60
            while stored_in_target() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            Path(marker).touch()
            if mode == "fail-once":
                raise RuntimeError("fault injected after sending")
            time.sleep(3600)
        return value

    udf = F.udf(fault, BinaryType())
    frame = (
        spark.readStream.format("sluice").option("bootstrap", bootstrap).option("topic", source)
        .option("startingOffsets", "earliest").load()
    )
    query = (
        frame.select(udf(F.col("value")).alias("value"), F.col("key"))
        .writeStream.format("sluice").option("bootstrap", bootstrap).option("topic", target)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
