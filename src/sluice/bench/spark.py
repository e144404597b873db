"""Spark workloads of ``sluice bench`` (need the ``spark`` extra), on ``local[2]``.

- ``S1``: a batch read of 200,000 1 KiB messages (two partitions) through
  ``spark.read.format("sluice")``, every value summed so every byte reaches Spark; msgs/s
  of the second of two full reads (the first starts the Python workers and warms the JIT).
- ``S2``: end-to-end latency of a streaming query with a 1 s processing-time trigger: a
  producer sends 1 KiB messages at 2,000 msg/s for 20 s with its send time as the record
  timestamp; ``foreachBatch`` notes when each micro-batch reaches the sink; latency =
  that moment − send time, per message.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from sluice.bench import workloads as w
from sluice.client import Producer

TRIGGER = "1 second"


def _session():
    from sluice.spark.pipelines import session

    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    spark = session("local[2]", "sluice-bench", conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


async def _fill(bootstrap: str, count: int, size: int) -> None:
    await w.reset_topic(bootstrap, w.PAGE_CACHE, partitions=2)
    payloads = [os.urandom(size) for _ in range(w.CHUNK)]
    async with Producer(bootstrap, linger_ms=5) as p:
        futs = [
            await p.send_many(w.TOPIC, payloads, partition=i % 2)
            for i in range(count // w.CHUNK)
        ]
        await asyncio.gather(*futs)


def run_s1(bootstrap: str, meter, count: int = 200_000, size: int = 1024) -> w.Row:
    from pyspark.sql import functions as F

    asyncio.run(_fill(bootstrap, count, size))
    spark = _session()
    try:
        df = spark.read.format("sluice").option("bootstrap", bootstrap).option("topic", w.TOPIC)
        def read():  # a new plan each time: a collected plan would reuse its shuffle output
            return df.load().select(F.sum(F.length("value")), F.count("*")).collect()[0]

        read()  # warm-up: Python workers, data source lookup, the JVM's JIT
        meter.start()
        t0 = time.perf_counter()
        total = read()
        seconds = time.perf_counter() - t0
        notes = [meter.stop(), "second of two full reads"]
    finally:
        spark.stop()
    if tuple(total) != (count * size, count):
        raise AssertionError(f"read {tuple(total)}, expected {(count * size, count)}")
    return w.Row("S1", msgs=count, bytes=count * size, seconds=seconds, notes=notes)


def run_s2(bootstrap: str, meter, rate: int = 2000, seconds: float = 20.0, size: int = 1024) -> w.Row:
    asyncio.run(w.reset_topic(bootstrap, {**w.PAGE_CACHE, "timestamp.type": "CreateTime"}))
    spark = _session()
    latencies: list[float] = []

    def sink(batch, _batch_id) -> None:
        stamps = [r[0] for r in batch.select("ts").collect()]
        now = time.time() * 1000
        latencies.extend(now - ts for ts in stamps)

    try:
        stream = (
            spark.readStream.format("sluice")
            .option("bootstrap", bootstrap)
            .option("topic", w.TOPIC)
            .load()
            .selectExpr("unix_millis(timestamp) AS ts")
        )
        query = stream.writeStream.foreachBatch(sink).trigger(processingTime=TRIGGER).start()
        deadline = time.monotonic() + 60
        while query.lastProgress is None:  # first (empty) micro-batch done: the query runs
            query.awaitTermination(0.1)  # raises if the query failed
            if time.monotonic() > deadline:
                raise TimeoutError("the streaming query ran no micro-batch in 60 s")
        meter.start()
        sent = threading.Thread(target=asyncio.run, args=(_paced(bootstrap, rate, seconds, size),))
        sent.start()
        sent.join()
        deadline = time.monotonic() + 30
        while len(latencies) < int(rate * seconds) and time.monotonic() < deadline:
            time.sleep(0.1)
        notes = [meter.stop(), f"trigger {TRIGGER}, {rate} msg/s"]
        query.stop()
    finally:
        spark.stop()
    if len(latencies) != int(rate * seconds):
        raise AssertionError(f"{len(latencies)} of {int(rate * seconds)} messages arrived")
    lat = sorted(latencies)
    return w.Row(
        "S2",
        msgs=len(lat),
        bytes=len(lat) * size,
        seconds=seconds,
        p50_ms=round(w.percentile(lat, 50), 1),
        p99_ms=round(w.percentile(lat, 99), 1),
        p999_ms=round(w.percentile(lat, 99.9), 1),
        max_ms=round(lat[-1], 1),
        notes=notes,
    )


async def _paced(bootstrap: str, rate: int, seconds: float, size: int) -> None:
    """Send ``rate`` msg/s for ``seconds``, each stamped with its send time."""
    payload = os.urandom(size)
    total = int(rate * seconds)
    async with Producer(bootstrap, linger_ms=0) as p:
        start = time.perf_counter()
        futs = []
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            futs.append(await p.send(w.TOPIC, payload, timestamp_ms=int(time.time() * 1000)))
        await asyncio.gather(*futs)
