"""Writing a DataFrame to Sluice: ``df.write.format("sluice")`` and ``writeStream``.

Columns: ``value`` (binary or string, required); optional ``key`` (binary or string),
``headers`` (array of struct<key: string, value: binary>), ``topic`` (string; the
``topic`` option, when given, wins over it, as in Spark's Kafka sink) and ``partition``
(int; else the producer's partitioner).  Other columns are ignored, so a DataFrame read
from one topic can be written to another as it is, keeping each record's partition (drop
the ``partition`` column to let the producer choose, e.g. for a topic with fewer).

Each Spark task sends its rows with its own producer, an Arrow batch at a time, and
returns only once every record is acknowledged; a failed send fails the task.

Delivery is **at-least-once**: a task Spark retries, or a micro-batch a restarted query
runs again, sends its rows again.  The way to exactly-once (next step, with the idempotent
producer): the producer identity of each task derives from (query id, batch id, partition
id), so a rerun of the same micro-batch partition reuses the identity and sequence numbers
and the broker drops the duplicates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from sluice import errors
from sluice.client.sync import SyncAdmin, SyncProducer
from sluice.spark.options import WriteOptions

__all__ = ["BatchWriter", "StreamWriter", "Written"]

log = logging.getLogger("sluice.spark")

_BYTES = (BinaryType, StringType)
_INTS = (IntegerType, LongType, ShortType)


@dataclass
class Written(WriterCommitMessage):
    """What one task sent."""

    records: int


def check_schema(schema: StructType, opts: WriteOptions) -> None:
    """``ConfigError`` unless ``schema`` has the columns a write needs, of usable types."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    wanted = {"value": _BYTES, "key": _BYTES, "topic": (StringType,), "partition": _INTS}
    if "value" not in fields:
        raise errors.ConfigError("writing to sluice needs a 'value' column (binary or string)")
    if "topic" not in fields and opts.topic is None:
        raise errors.ConfigError("give the topic option or a 'topic' column")
    for name, types in wanted.items():
        if name in fields and not isinstance(fields[name], types):
            raise errors.ConfigError(f"column {name!r} cannot be {fields[name].simpleString()}")
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, ArrayType)
        and isinstance(headers.elementType, StructType)
        and [(f.name, type(f.dataType)) for f in headers.elementType.fields]
        == [("key", StringType), ("value", BinaryType)]
    ):
        raise errors.ConfigError(
            "column 'headers' must be array<struct<key: string, value: binary>>, "
            f"not {headers.simpleString()}"
        )


class _Sender:
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        """On the driver, when the write is planned: check the columns, and that the
        ``topic`` option names a topic that exists (``UnknownTopic`` now, not in every task)."""
        check_schema(schema, opts)
        self.opts = opts
        if opts.topic is not None:
            with SyncAdmin(opts.bootstrap) as admin:
                admin.describe_topic(opts.topic)

    def write(self, iterator) -> Written:
        """Send every row of the task's Arrow batches; return once all are acknowledged."""
        producer = SyncProducer(self.opts.bootstrap, **self.opts.producer_config())
        try:
            pending = []
            total = 0
            for batch in iterator:
                msgs = _messages(batch, self.opts.topic)
                if msgs:
                    pending.append(producer.send_batch(msgs))
                    total += len(msgs)
                while pending and pending[0].done():
                    pending.pop(0).result()  # fail early on an error
            for fut in pending:
                fut.result()
        finally:
            producer.close()
        return Written(total)


def _messages(batch: pa.RecordBatch, topic_option: str | None) -> list[tuple]:
    """``(topic, value, key, headers, partition)`` per row, as ``send_batch`` takes them."""
    n = batch.num_rows
    names = [name.lower() for name in batch.schema.names]

    def column(name: str) -> list:
        if name not in names:
            return [None] * n
        col = batch.column(names.index(name))
        if name in ("key", "value") and not pa.types.is_binary(col.type):
            col = col.cast(pa.binary())  # string → UTF-8 bytes, in Arrow
        return col.to_pylist()

    topics = [topic_option] * n if topic_option is not None else column("topic")
    if None in topics:
        raise errors.ConfigError("a row has a null topic and no topic option is set")
    headers = [
        None if h is None else [(kv["key"], kv["value"]) for kv in h] for h in column("headers")
    ]
    return list(zip(topics, column("value"), column("key"), headers, column("partition"), strict=True))


class BatchWriter(_Sender, DataSourceArrowWriter):
    """``df.write.format("sluice")``: at-least-once (see the module docstring)."""

    def commit(self, messages) -> None:
        log.info("wrote %d records to sluice", sum(m.records for m in messages if m))

    def abort(self, messages) -> None:
        sent = sum(m.records for m in messages if m)
        log.warning("write aborted; %d records already sent stay in their topics", sent)


class StreamWriter(_Sender, DataSourceStreamArrowWriter):
    """``df.writeStream.format("sluice")``: at-least-once (see the module docstring)."""

    def commit(self, messages, batchId: int) -> None:
        log.info("micro-batch %d: wrote %d records", batchId, sum(m.records for m in messages if m))

    def abort(self, messages, batchId: int) -> None:
        sent = sum(m.records for m in messages if m)
        log.warning("micro-batch %d aborted; %d records already sent stay", batchId, sent)
