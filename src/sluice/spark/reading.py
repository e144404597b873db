"""Executor side of a read: one offset range of one partition → Arrow record batches.

An ``OffsetRange`` is the input partition Spark ships to an executor: plain data, picklable.
``read_range`` reads it with the blocking consumer, a fetch at a time (never a request per
record), and yields one Arrow ``RecordBatch`` per fetched chunk, so rows cross into Spark in
columnar form.  Reading the same range twice yields the same rows: that is what lets Spark
replay a micro-batch and its file sink keep each message exactly once.

Data loss: when the range starts (or, racing retention, continues) below the partition's
first kept offset, or the partition now ends before the range does (a topic deleted and
created again), ``failOnDataLoss=true`` raises ``DataLoss``; ``false`` logs a warning and
reads what is there.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from sluice import errors
from sluice.client.sync import SyncAdmin, SyncConsumer
from sluice.protocol import messages
from sluice.spark.options import ReadOptions

__all__ = ["OffsetRange", "arrow_schema", "data_lost", "read_range", "spark_schema"]

log = logging.getLogger("sluice.spark")

_STALL_CHECK_S = 2.0  # without records for this long, ask the broker where the log ends


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of ``topic``/``partition``, read with ``options``."""

    topic: str
    partition: int
    start: int
    end: int
    options: ReadOptions

    @property
    def size(self) -> int:
        return self.end - self.start


_MILLIS = pa.timestamp("ms", tz="UTC")  # record timestamps; Spark takes microseconds
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
    if include_headers:
        fields.append(("headers", _HEADERS))
    return pa.schema(fields)


def spark_schema(include_headers: bool) -> str:
    """The DDL of the rows a read yields (the columns of Spark's Kafka source, less
    ``timestampType``)."""
    ddl = (
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary"
    )
    if include_headers:
        ddl += ", headers array<struct<key: string, value: binary>>"
    return ddl


def read_range(rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``rng`` in offset order as Arrow batches (see the module doc)."""
    if rng.start >= rng.end:
        return
    opts = rng.options
    with contextlib.ExitStack() as stack:
        consumer = SyncConsumer(
            opts.bootstrap, auto_offset_reset="error", enable_auto_commit=False, fetch_max_wait_ms=200
        )
        stack.callback(consumer.close)
        admin = _LazyAdmin(opts.bootstrap)
        stack.callback(admin.close)
        schema = arrow_schema(opts.include_headers)
        consumer.assign([(rng.topic, rng.partition)])
        consumer.seek(rng.topic, rng.partition, rng.start)
        pos, idle_since = rng.start, time.monotonic()
        while pos < rng.end:
            try:
                recs = consumer.getmany(timeout_ms=500)
            except errors.OffsetOutOfRange:
                pos = _skip_lost(admin, consumer, rng, pos)
                continue
            except (errors.UnknownTopic, errors.UnknownPartition):
                pos = _check_end(admin, rng, pos)  # deleted: raises, or ends the read
                continue
            # Offsets only grow: past whatever came, even if none of it is in range, and
            # past batches no reader sees (half messages, markers, subscription records),
            # which the consumer's position passes and which may end the range.
            at = consumer.position((rng.topic, rng.partition))
            pos = max(pos, min(at if at is not None else pos, rng.end))
            if recs:
                if recs[-1].offset >= rng.end:
                    recs = [r for r in recs if r.offset < rng.end]
                if recs:
                    yield _to_arrow(recs, rng, schema)
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > _STALL_CHECK_S:
                pos = _check_end(admin, rng, pos)
                idle_since = time.monotonic()


def data_lost(opts: ReadOptions, what: str) -> None:
    """Raise ``DataLoss`` about ``what``, or with ``failOnDataLoss=false`` log a warning."""
    if opts.fail_on_data_loss:
        raise errors.DataLoss(what + " (failOnDataLoss=false skips it with a warning)")
    log.warning("%s; skipped (failOnDataLoss=false)", what)


class _LazyAdmin:
    """The admin client a read needs only when something is odd: opened on first use."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.client: SyncAdmin | None = None

    def offset(self, rng: OffsetRange, which: int) -> int | None:
        """``rng``'s partition offset at ``which``; None if the topic is gone."""
        self.client = self.client or SyncAdmin(self.bootstrap)
        try:
            return self.client.list_offsets(rng.topic, [rng.partition], which)[rng.partition]
        except (errors.UnknownTopic, errors.UnknownPartition):
            return None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _skip_lost(admin: _LazyAdmin, consumer: SyncConsumer, rng: OffsetRange, pos: int) -> int:
    """The broker said ``pos`` is out of range: find out why, raise or skip ahead."""
    earliest = admin.offset(rng, messages.EARLIEST)
    if earliest is not None and earliest > pos:
        data_lost(
            rng.options,
            f"{rng.topic}/{rng.partition}: offsets {pos}..{min(earliest, rng.end) - 1} "
            "were deleted by retention",
        )
        pos = min(earliest, rng.end)
    else:
        pos = _check_end(admin, rng, pos)
    if pos < rng.end:
        consumer.seek(rng.topic, rng.partition, pos)
    return pos


def _check_end(admin: _LazyAdmin, rng: OffsetRange, pos: int) -> int:
    """If the log now ends before the range does (or the topic is gone), the rest of the
    range is lost: raise, or return ``rng.end`` to finish the read."""
    latest = admin.offset(rng, messages.LATEST)
    if latest is None:
        data_lost(rng.options, f"{rng.topic}/{rng.partition}: the topic was deleted")
        return rng.end
    if latest < rng.end and latest <= pos:
        data_lost(
            rng.options,
            f"{rng.topic}/{rng.partition}: the log ends at {latest} "
            f"but offsets up to {rng.end - 1} were planned",
        )
        return rng.end
    return pos


def _to_arrow(recs: list, rng: OffsetRange, schema: pa.Schema) -> pa.RecordBatch:
    n = len(recs)
    columns = [
        pa.repeat(pa.scalar(rng.topic, pa.string()), n),
        pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
        pa.array([r.offset for r in recs], pa.int64()),
        pa.array([r.timestamp for r in recs], _MILLIS).cast(schema.field(3).type),
        pa.array([r.key for r in recs], pa.binary()),
        pa.array([r.value for r in recs], pa.binary()),
    ]
    if len(schema) == 7:
        columns.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in recs], schema.field(6).type
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=schema)
