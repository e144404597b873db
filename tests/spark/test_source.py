"""The ``sluice`` Spark data source end to end: a real broker process, a real Spark session.

Batch reads (offset ranges, timestamps, ``minPartitions``, ``topicPattern``), streaming
reads into a Parquet sink across restarts, ``maxOffsetsPerTrigger``, data loss to
retention, batch and streaming writes, and the errors bad options give.  Every check is on
exact sets of ``(topic, partition, offset)``: a missing or duplicated record fails.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from sluice.client.sync import SyncAdmin, SyncConsumer, SyncProducer

# ---------------------------------------------------------------------- helpers


def create(bootstrap: str, name: str, partitions: int = 1, **config: str) -> None:
    with SyncAdmin(bootstrap) as admin:
        admin.create_topic(
            name, partitions, config={k.replace("_", "."): v for k, v in config.items()}
        )


def produce(bootstrap: str, records: list[dict]) -> list[tuple]:
    """Send ``records`` (``send`` keyword arguments plus ``topic`` and ``value``); return
    ``(topic, partition, offset, timestamp)`` of each, in order, once all are acknowledged."""
    with SyncProducer(bootstrap, linger_ms=1) as p:
        futs = [
            p.send(
                r["topic"],
                r["value"],
                **{k: v for k, v in r.items() if k not in ("topic", "value")},
            )
            for r in records
        ]
        p.flush()
        metas = [f.result(30) for f in futs]
    return [(m.topic, m.partition, m.offset, m.timestamp) for m in metas]


def fill(bootstrap: str, topic: str, partition: int, n: int, tag: str = "") -> list[tuple]:
    """``n`` records ``{topic}/{partition}/{i}{tag}`` into one partition; their
    ``(topic, partition, offset, value)``."""
    recs = [
        {"topic": topic, "value": f"{topic}/{partition}/{i}{tag}".encode(), "partition": partition}
        for i in range(n)
    ]
    metas = produce(bootstrap, recs)
    return [(t, p, o, r["value"]) for (t, p, o, _), r in zip(metas, recs, strict=True)]


def end_offsets(bootstrap: str, topic: str, which: int = -1) -> dict[int, int]:
    with SyncAdmin(bootstrap) as admin:
        return admin.list_offsets(topic, timestamp=which)


def consume_all(bootstrap: str, topic: str) -> list[tuple]:
    """Every record of ``topic`` as ``(topic, partition, offset, key, value, headers)``,
    read with the plain client up to the current end of each partition."""
    ends = end_offsets(bootstrap, topic)
    starts = end_offsets(bootstrap, topic, -2)
    want = sum(ends[p] - starts[p] for p in ends)
    out = []
    consumer = SyncConsumer(bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50)
    try:
        consumer.assign([(topic, p) for p in ends])
        for p in ends:
            consumer.seek(topic, p, starts[p])
        deadline = time.monotonic() + 30
        while len(out) < want:
            assert time.monotonic() < deadline, f"read {len(out)} of {want} records"
            for r in consumer.getmany(timeout_ms=200):
                out.append((r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers)))
    finally:
        consumer.close()
    assert len(out) == want
    return sorted(out)


def rows(df, *cols: str) -> list[tuple]:
    """The rows of ``df`` as sorted plain tuples (binary → bytes, headers → tuples)."""

    def plain(v):
        if isinstance(v, bytearray):
            return bytes(v)
        if isinstance(v, list):
            return tuple((h["key"], plain(h["value"])) for h in v)
        return v

    out = [tuple(plain(v) for v in row) for row in df.select(*cols).collect()]
    return sorted(out, key=repr)


def reader(spark, bootstrap: str, **options: str):
    r = spark.read.format("sluice").option("bootstrap", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def stream(spark, bootstrap: str, **options: str):
    r = spark.readStream.format("sluice").option("bootstrap", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(writer, timeout: float = 120):
    """Start a ``trigger(availableNow=True)`` query, wait until it has read everything and
    stopped on its own; the query (for its progress), stopped in any case."""
    query = writer.trigger(availableNow=True).start()
    try:
        finished = query.awaitTermination(timeout)
        assert finished, f"query still running after {timeout}s"
    finally:
        query.stop()
    return query


def parquet_rows(spark, path) -> list[tuple]:
    return sorted(
        (r.topic, r.partition, r.offset, bytes(r.value))
        for r in spark.read.parquet(str(path))
        .select("topic", "partition", "offset", "value")
        .collect()
    )


def progress_rows(query) -> list[int]:
    return [p.numInputRows for p in query.recentProgress]


# ---------------------------------------------------------------------- batch reads


def test_batch_read_exact_offset_ranges(spark, broker):
    b = broker.bootstrap
    create(b, "orders", 2)
    recs = [
        {
            "topic": "orders",
            "partition": p,
            "key": None if i == 3 else f"k{p}-{i}".encode(),
            "value": f"v{p}-{i}".encode(),
            "headers": [("h", f"{p}-{i}".encode()), ("empty", None)] if i % 2 else [],
        }
        for p in (0, 1)
        for i in range(10)
    ]
    metas = produce(b, recs)
    assert sorted((p, o) for _, p, o, _ in metas) == [(p, o) for p in (0, 1) for o in range(10)]
    by_pos = {(p, o): (r, ts) for (_, p, o, ts), r in zip(metas, recs, strict=True)}

    df = reader(
        spark,
        b,
        topic="orders",
        startingOffsets='{"orders": {"0": 2, "1": -2}}',
        endingOffsets='{"orders": {"0": 7, "1": 4}}',
        includeHeaders="true",
    )
    assert df.columns == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    got = rows(df, "topic", "partition", "offset", "key", "value", "headers", "timestamp")
    want_pos = [(0, o) for o in range(2, 7)] + [(1, o) for o in range(0, 4)]
    want = []
    for p, o in want_pos:
        r, ts = by_pos[(p, o)]
        headers = tuple(r["headers"])
        want.append(("orders", p, o, r["key"], r["value"], headers, ts))
    got = [g[:6] + (round(g[6].timestamp() * 1000),) for g in got]
    assert sorted(got, key=repr) == sorted(want, key=repr)
    # a record with headers, one without, and the record with no key are among them
    assert any(g[5] == (("h", b"0-3"), ("empty", None)) for g in got)
    assert any(g[5] == () for g in got)
    assert any(g[1:3] == (1, 3) and g[3] is None for g in got)

    # defaults: everything from earliest to latest, no headers column; a JSON spec that
    # names one partition leaves the other at its default (earliest / latest)
    df = reader(spark, b, topic="orders", startingOffsets='{"orders": {"1": 8}}')
    assert "headers" not in df.columns
    got = rows(df, "partition", "offset", "key", "value")
    want = sorted(
        (
            (p, o, by_pos[(p, o)][0]["key"], by_pos[(p, o)][0]["value"])
            for p, o in [(0, o) for o in range(10)] + [(1, 8), (1, 9)]
        ),
        key=repr,
    )
    assert got == want


def test_batch_read_by_timestamp(spark, broker):
    b = broker.bootstrap
    create(b, "clock", 2, timestamp_type="CreateTime")
    base = 1_700_000_000_000
    expected_band = []
    for band in range(3):
        # one band at a time, flushed: a band never shares a record batch with another
        recs = [
            {
                "topic": "clock",
                "partition": p,
                "value": f"{band}-{p}-{i}".encode(),
                "timestamp_ms": base + band * 1000 + i * 10 + p,
            }
            for p in (0, 1)
            for i in range(6)
        ]
        metas = produce(b, recs)
        if band == 1:
            expected_band = sorted(
                (p, o, r["value"], r["timestamp_ms"])
                for (_, p, o, _), r in zip(metas, recs, strict=True)
            )
    df = reader(
        spark,
        b,
        topic="clock",
        startingTimestamp=str(base + 500),
        endingTimestamp=str(base + 1500),
    )
    got = sorted(
        (p, o, v, round(ts.timestamp() * 1000))
        for p, o, v, ts in rows(df, "partition", "offset", "value", "timestamp")
    )
    assert got == expected_band
    assert [o for p, o, _, _ in got if p == 0] == list(range(6, 12))


def test_min_partitions_splits_ranges(spark, broker):
    b = broker.bootstrap
    create(b, "wide", 2)
    want = fill(b, "wide", 0, 17) + fill(b, "wide", 1, 6)
    df = reader(spark, b, topic="wide", minPartitions="5")
    assert df.rdd.getNumPartitions() >= 5
    got = rows(df, "topic", "partition", "offset", "value")
    assert got == sorted(want, key=repr)  # every offset exactly once
    # without minPartitions: one Spark partition per topic partition
    assert reader(spark, b, topic="wide").rdd.getNumPartitions() == 2


def test_min_partitions_small_range(spark, broker):
    """Five offsets and minPartitions=4 should give four Spark partitions."""
    b = broker.bootstrap
    create(b, "narrow", 1)
    fill(b, "narrow", 0, 5)
    df = reader(spark, b, topic="narrow", minPartitions="4")
    assert df.rdd.getNumPartitions() >= 4


def test_topic_pattern_reads_matching_topics_only(spark, broker):
    b = broker.bootstrap
    create(b, "ev-a", 1)
    create(b, "ev-b", 2)
    create(b, "ev-ab", 1)  # the pattern matches whole names only
    create(b, "xev-a", 1)
    want = fill(b, "ev-a", 0, 4) + fill(b, "ev-b", 0, 3) + fill(b, "ev-b", 1, 2)
    fill(b, "ev-ab", 0, 3)
    fill(b, "xev-a", 0, 3)
    got = rows(reader(spark, b, topicPattern="ev-[a-z]"), "topic", "partition", "offset", "value")
    assert got == sorted(want, key=repr)
    # ``topics``: a fixed list, the same records
    got = rows(reader(spark, b, topics="ev-b, ev-a"), "topic", "partition", "offset", "value")
    assert got == sorted(want, key=repr)


# ---------------------------------------------------------------------- streaming reads


def test_stream_to_parquet_restarts_exactly_once(spark, broker, tmp_path):
    b = broker.bootstrap
    out, cp = tmp_path / "out", tmp_path / "cp"
    create(b, "s-1", 2)
    want = fill(b, "s-1", 0, 6) + fill(b, "s-1", 1, 4)

    def run():
        df = stream(spark, b, topicPattern="s-[0-9]+", startingOffsets="earliest")
        w = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(cp))
        )
        return run_available_now(w)

    q1 = run()
    assert parquet_rows(spark, out) == sorted(want)
    assert sum(progress_rows(q1)) == len(want)

    # more records in the old topic, and a new topic matching the pattern
    want += fill(b, "s-1", 0, 3, "+") + fill(b, "s-1", 1, 5, "+")
    create(b, "s-2", 1)
    want += fill(b, "s-2", 0, 4)
    create(b, "other", 1)
    fill(b, "other", 0, 2)

    q2 = run()
    got = parquet_rows(spark, out)
    assert Counter(got).most_common(1)[0][1] == 1, "a record was written twice"
    assert got == sorted(want)
    assert sum(progress_rows(q2)) == 3 + 5 + 4

    # nothing new: a third run adds nothing
    q3 = run()
    assert sum(progress_rows(q3)) == 0
    assert parquet_rows(spark, out) == sorted(want)


def test_stream_from_latest_while_producing(spark, broker, tmp_path):
    """A query starting at ``latest`` while a producer writes: Spark asks for the initial
    offset again when it plans the first micro-batch, which must not have moved (it did:
    the query died with a bogus DataLoss).  Every record after the start arrives once."""
    create(broker.bootstrap, "busy", 2)
    stop = threading.Event()

    def keep_producing() -> None:
        with SyncProducer(broker.bootstrap, linger_ms=0) as p:
            i = 0
            while not stop.is_set():
                p.send("busy", str(i).encode(), partition=i % 2).result(10)
                i += 1

    producer = threading.Thread(target=keep_producing)
    producer.start()
    out = tmp_path / "out"
    query = None
    try:
        time.sleep(0.5)
        query = (
            stream(spark, broker.bootstrap, topic="busy")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 60
        while len([p for p in query.recentProgress if p["numInputRows"]]) < 3:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "no three non-empty micro-batches in 60 s"
            time.sleep(0.2)
        stop.set()
        producer.join()
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        stop.set()
        producer.join()
        if query is not None:
            query.stop()
    got = parquet_rows(spark, out)
    assert len(got) == len(set(got))
    ends = end_offsets(broker.bootstrap, "busy")
    for p in (0, 1):
        offsets = sorted(o for _, part, o, _ in got if part == p)
        assert offsets == list(range(offsets[0], ends[p])), f"partition {p} has gaps"


def test_nothing_to_read(spark, broker, tmp_path):
    """Spark plans a stand-in partition when a batch read has none: still zero rows."""
    b = broker.bootstrap
    create(b, "empty", 2)
    assert reader(spark, b, topic="empty").count() == 0
    create(b, "full", 1)
    fill(b, "full", 0, 3)
    assert reader(spark, b, topic="full", startingOffsets="latest").count() == 0
    assert reader(spark, b, topicPattern="nothing-matches-.*").count() == 0


def test_reads_finish_when_partitions_end_in_hidden_batches(spark, broker, tmp_path):
    """A partition whose log ends in batches no reader sees (a pending delayed message, a
    rolled-back half message's marker) is read to its end, in a batch read and a stream."""
    import asyncio

    from sluice.client import DelayedProducer

    b = broker.bootstrap
    create(b, "hidden-end", 2)
    want = fill(b, "hidden-end", 0, 5) + fill(b, "hidden-end", 1, 3)

    async def hide():
        async with DelayedProducer(b) as producer:
            for p in (0, 1):
                await producer.send_delayed("hidden-end", [(None, b"later", [])], delay_ms=3_600_000,
                                            partition=p)
            await producer.cancel(await producer.send_delayed(
                "hidden-end", [(None, b"never", [])], delay_ms=3_600_000, partition=0))

    asyncio.run(hide())
    assert end_offsets(b, "hidden-end") == {0: 8, 1: 4}  # 5 + 2 halves + a marker; 3 + 1 half
    got = [(t, p, o, v) for t, p, o, v in rows(reader(spark, b, topic="hidden-end"),
                                               "topic", "partition", "offset", "value")]
    assert got == sorted(want, key=repr)
    out = tmp_path / "out"
    run_available_now(
        stream(spark, b, topic="hidden-end", startingOffsets="earliest").writeStream.format("parquet")
        .option("path", str(out)).option("checkpointLocation", str(tmp_path / "ck")), timeout=60,
    )
    assert parquet_rows(spark, out) == sorted(want)


def test_stream_from_timestamp_zero_reads_everything(spark, broker, tmp_path):
    b = broker.bootstrap
    create(b, "ts0", 1)
    fill(b, "ts0", 0, 5)
    w = (
        stream(spark, b, topic="ts0", startingTimestamp="0")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
    )
    run_available_now(w)
    assert [o for _, _, o, _ in parquet_rows(spark, tmp_path / "out")] == [0, 1, 2, 3, 4]


def test_stream_over_a_deleted_topic(spark, broker, tmp_path):
    """A named topic deleted between runs: ``DataLoss``, or skipped with
    ``failOnDataLoss=false`` while the other topic is still read."""
    b = broker.bootstrap
    create(b, "stays", 1)
    create(b, "goes", 1)
    fill(b, "stays", 0, 2)
    fill(b, "goes", 0, 2)

    def run(fail: str):
        df = stream(
            spark, b, topics="stays,goes", startingOffsets="earliest", failOnDataLoss=fail
        )
        return run_available_now(
            df.writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
        )

    run("true")
    with SyncAdmin(b) as admin:
        admin.delete_topic("goes")
    fill(b, "stays", 0, 3, tag="-new")
    with pytest.raises(Exception, match="no longer exists"):
        run("true")
    run("false")
    got = parquet_rows(spark, tmp_path / "out")
    assert sorted((t, o) for t, _, o, _ in got) == [("goes", 0), ("goes", 1)] + [
        ("stays", o) for o in range(5)
    ]


def test_max_offsets_per_trigger(spark, broker, tmp_path):
    b = broker.bootstrap
    create(b, "capped", 2)
    total = len(fill(b, "capped", 0, 15) + fill(b, "capped", 1, 10))
    df = stream(spark, b, topic="capped", startingOffsets="earliest", maxOffsetsPerTrigger="7")
    w = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp"))
    q = run_available_now(w)
    counts = [n for n in progress_rows(q) if n]
    assert all(n <= 7 for n in counts), counts
    assert sum(counts) == total
    assert counts == [7, 7, 7, 4]  # every micro-batch but the last reads the full cap


# ---------------------------------------------------------------------- data loss


def test_fail_on_data_loss(spark, broker_factory, tmp_path):
    broker = broker_factory(extra_args=["--retention-check-ms", "50"]).start()
    b = broker.bootstrap
    create(b, "gone", 1, segment_bytes="1024", retention_bytes="2048")
    # one acknowledged record at a time: one small batch each, so segments roll often
    with SyncProducer(b, linger_ms=0) as p:
        for i in range(60):
            p.send("gone", b"r%03d-" % i + b"x" * 90, partition=0).result(30)
    deadline = time.monotonic() + 20
    earliest, stable_since = 0, time.monotonic()
    while True:
        now = end_offsets(b, "gone", -2)[0]
        if now != earliest:
            earliest, stable_since = now, time.monotonic()
        if earliest > 0 and time.monotonic() - stable_since > 0.5:
            break
        assert time.monotonic() < deadline, f"retention did not run (earliest {earliest})"
        time.sleep(0.05)
    assert 0 < earliest < 60
    kept = [("gone", 0, o, b"r%03d-" % o + b"x" * 90) for o in range(earliest, 60)]
    from_zero = '{"gone": {"0": 0}}'

    with pytest.raises(Exception) as info:
        reader(spark, b, topic="gone", startingOffsets=from_zero).collect()
    assert "DataLoss" in str(info.value) or "deleted by retention" in str(info.value)
    assert "gone/0" in str(info.value)

    df = reader(spark, b, topic="gone", startingOffsets=from_zero, failOnDataLoss="false")
    assert rows(df, "topic", "partition", "offset", "value") == kept

    # streaming: the same, with the first micro-batch starting at offset 0
    out = tmp_path / "out"
    df = stream(spark, b, topic="gone", startingOffsets=from_zero, failOnDataLoss="false")
    w = df.writeStream.format("parquet").option("path", str(out))
    run_available_now(w.option("checkpointLocation", str(tmp_path / "cp")))
    assert parquet_rows(spark, out) == kept

    df = stream(spark, b, topic="gone", startingOffsets=from_zero)
    w = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp2"))
    query = w.trigger(availableNow=True).start()
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert "deleted by retention" in str(info.value)


# ---------------------------------------------------------------------- writes


HEADERS_T = "array<struct<key: string, value: binary>>"


def test_batch_write_reads_back(spark, broker):
    """Values, keys (string), headers (some null), the topic and the partition from columns."""
    b = broker.bootstrap
    create(b, "w-a", 3)
    create(b, "w-b", 2)
    data = [
        (
            f"val-{i}".encode(),
            None if i % 5 == 0 else f"key-{i}",
            None if i % 3 == 0 else [("n", f"{i}".encode()), ("z", None)],
            "w-a" if i % 2 else "w-b",
            i % 3 if i % 2 else i % 4 // 2,
        )
        for i in range(24)
    ]
    schema = f"value binary, key string, headers {HEADERS_T}, topic string, partition int"
    df = spark.createDataFrame(data, schema).repartition(2)
    df.write.format("sluice").option("bootstrap", b).mode("append").save()

    want = Counter(
        (topic, partition, key.encode() if key is not None else None, value, tuple(headers or ()))
        for value, key, headers, topic, partition in data
    )
    got = Counter(
        (t, p, k, v, h) for topic in ("w-a", "w-b") for t, p, _, k, v, h in consume_all(b, topic)
    )
    assert got == want
    assert {t: len(end_offsets(b, t)) for t in ("w-a", "w-b")} == {"w-a": 3, "w-b": 2}
    # every partition got rows
    assert {(t, p) for t, p, *_ in got} == {
        ("w-a", 0),
        ("w-a", 1),
        ("w-a", 2),
        ("w-b", 0),
        ("w-b", 1),
    }


def test_stream_write_topic_to_topic(spark, broker, tmp_path):
    b = broker.bootstrap
    create(b, "src", 2)
    create(b, "dst", 2)
    recs = [
        {
            "topic": "src",
            "partition": i % 2,
            "value": f"m{i}".encode(),
            "key": f"k{i}".encode(),
            "headers": [("i", str(i).encode())],
        }
        for i in range(20)
    ]
    produce(b, recs)
    df = stream(spark, b, topic="src", startingOffsets="earliest", includeHeaders="true")
    w = (
        df.select("value", "key", "headers", "partition")
        .writeStream.format("sluice")
        .option("bootstrap", b)
        .option("topic", "dst")
        .option("checkpointLocation", str(tmp_path / "cp"))
    )
    run_available_now(w)
    src = consume_all(b, "src")
    dst = consume_all(b, "dst")
    assert len(src) == 20
    # same records, same partitions, same order within each partition
    assert [r[1:] for r in dst] == [r[1:] for r in src]


def test_write_a_read_dataframe_as_it_is(spark, broker):
    """The sink docstring: "a DataFrame read from one topic can be written to another as it
    is" -- its ``topic`` column must not send the rows back to where they came from."""
    b = broker.bootstrap
    create(b, "from", 1)
    create(b, "to", 1)
    fill(b, "from", 0, 5)
    df = reader(spark, b, topic="from")
    df.write.format("sluice").option("bootstrap", b).option("topic", "to").mode("append").save()
    assert end_offsets(b, "from") == {0: 5}
    assert [r[4] for r in consume_all(b, "to")] == [f"from/0/{i}".encode() for i in range(5)]


# ---------------------------------------------------------------------- bad options


def error_text(fn) -> str:
    with pytest.raises(Exception) as info:
        fn()
    return str(info.value)


def test_bad_options_give_clear_errors(spark, broker, tmp_path):
    b = broker.bootstrap
    create(b, "here", 1)
    fill(b, "here", 0, 3)
    text = error_text(lambda: spark.read.format("sluice").option("topic", "here").load().collect())
    assert "option bootstrap (host:port[,host:port...]) is required" in text
    text = error_text(lambda: reader(spark, b, topic="nope").collect())
    assert "topic(s) nope do not exist" in text
    text = error_text(lambda: reader(spark, b, topic="here", startingOfsets="earliest").collect())
    assert "unknown option(s) startingofsets for format 'sluice'" in text
    text = error_text(
        lambda: reader(spark, b, topic="here", endingOffsets='{"here": {"0": 9}}').collect()
    )
    assert "here/0: ending offset 9 is past the end of the log (3)" in text
    text = error_text(
        lambda: reader(spark, b, topic="here", startingOffsets='{"here": {"7": 0}}').collect()
    )
    assert "here/7" in text and "does not cover" in text
    w = (
        stream(spark, b, topic="here", endingOffsets='{"here": {"0": 1}}')
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
    )
    text = error_text(lambda: run_available_now(w, 60))
    assert "endingOffsets / endingTimestamp apply to batch reads only" in text
    df = spark.createDataFrame([(b"x",)], "payload binary")
    text = error_text(
        lambda: (
            df.write.format("sluice")
            .option("bootstrap", b)
            .option("topic", "here")
            .mode("append")
            .save()
        )
    )
    assert "writing to sluice needs a 'value' column" in text
    df = spark.createDataFrame([(b"x",)], "value binary")
    text = error_text(
        lambda: df.write.format("sluice").option("bootstrap", b).mode("append").save()
    )
    assert "give the topic option or a 'topic' column" in text
    df = spark.createDataFrame([(b"x", None)], "value binary, topic string")
    text = error_text(
        lambda: df.write.format("sluice").option("bootstrap", b).mode("append").save()
    )
    assert "a row has a null topic and no topic option is set" in text
    assert end_offsets(b, "here") == {0: 3}


def test_write_failures_fail_the_job(spark, broker):
    """A record the topic refuses, or a producer setting that is wrong, fails the write
    with the sluice error; nothing is silently dropped."""
    b = broker.bootstrap
    create(b, "small", 1, max_message_bytes="2048")
    df = spark.createDataFrame([(b"ok",), (b"x" * 10_000,)], "value binary")
    text = error_text(
        lambda: df.write.format("sluice").option("bootstrap", b).option("topic", "small")
        .mode("append").save()
    )  # fmt: skip
    assert "MessageTooLarge" in text or "MESSAGE_TOO_LARGE" in text, text[-2000:]
    text = error_text(
        lambda: df.write.format("sluice").option("bootstrap", b).option("topic", "small")
        .option("acks", "sometimes").mode("append").save()
    )  # fmt: skip
    assert "acks must be one of" in text


def test_write_to_a_missing_topic_fails_when_planned(spark, broker):
    """The README's write example names a topic that must exist: a missing one fails the
    write at once with UNKNOWN_TOPIC, not after a metadata wait in every task."""
    b = broker.bootstrap
    df = spark.createDataFrame([(b"v",)], "value binary")
    started = time.monotonic()
    text = error_text(
        lambda: df.write.format("sluice").option("bootstrap", b).option("topic", "orders-upper")
        .mode("append").save()
    )  # fmt: skip
    assert "UNKNOWN_TOPIC" in text and "orders-upper" in text, text[-2000:]
    assert time.monotonic() - started < 20
