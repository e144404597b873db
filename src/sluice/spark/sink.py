"""Writing a DataFrame to Sluice: ``df.write.format("sluice")`` and ``writeStream``.

Columns: ``value`` (binary or string, required); optional ``key`` (binary or string),
``headers`` (array of struct<key: string, value: binary>), ``topic`` (string; the
``topic`` option, when given, wins over it, as in Spark's Kafka sink) and ``partition``
(int; else the producer's partitioner).  Other columns are ignored, so a DataFrame read
from one topic can be written to another as it is, keeping each record's partition (drop
the ``partition`` column to let the producer choose, e.g. for a topic with fewer).

Each Spark task sends its rows with its own producer, an Arrow batch at a time, and
returns only once every record is acknowledged; a failed send fails the task.  Keyless rows
spread evenly over the topic's partitions: with ``exactlyOnce=false`` through the
producer's sticky partitioner (a batch per partition in turn, client/partitioning.py),
exactly once as below.

**Exactly once** (the default; ``exactlyOnce=false`` gives at-least-once): each task's
producer identity derives from (query id, micro-batch id, partition id) in a stream, or
(write id, partition id) for a batch write, where the write id is drawn once on the driver.
A task Spark retries, or the micro-batch a restarted query runs again from its checkpoint,
repeats the same identity and — since the rows and their batching are the same — the same
sequence numbers, and the broker drops every batch it stored already
(storage/producers.py).  What makes the batching the same: records go to partitions by key
hash, by the ``partition`` column, or for keyless rows in turn by position — the task's
i-th keyless row to partition ``(start + i) % partitions``, ``start`` the task's producer
id, so every partition gets its share of every task however few rows it has (never a
sticky partition, which moves on with timing) — and producer batches close only when full
or at the end of each Arrow batch (never by linger time).  The input must be
deterministic, as Spark's own exactly-once sinks need: the same partition of the same micro-batch yields the same rows in
the same order (true of Sluice's and file sources).  A rerun of a *batch* write job is a new
write and sends again.  Open batches hold memory until their Arrow batch ends: a task
writing to more partitions than ``buffer_memory / batchSize`` (256 by default) waits for
memory forever; lower ``batchSize`` for such fan-outs.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import crc32c as _crc32c
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


DERIVED_IDS = 1 << 62  # producer ids from here up are derived by callers (broker/produce.py)
NO_LINGER_CLOSE_MS = 3_600_000  # batches close when full or at an Arrow batch's end


def task_producer_id(*parts: object) -> int:
    """The producer id of a task identified by ``parts``: the same parts give the same id,
    in the range the broker leaves to derived identities."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return DERIVED_IDS | (int.from_bytes(digest, "big") & (DERIVED_IDS - 1))


class PositionPartitioner:
    """Key hash (CRC-32C, as the producer's default) for keyed records; the i-th keyless
    record to partition ``(start + i) % partitions``: a function of the records' order
    alone, so a rerun places every record where the first run did, and every partition gets
    its share of a task's keyless records, within one record.

    Called once per record, in send order (the producer's contract for a partitioner)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.keyless = 0

    def __call__(self, key: bytes | None, partitions: int) -> int:
        if key is not None:
            return _crc32c.crc32c(key) % partitions
        i = self.keyless
        self.keyless = i + 1
        return (self.start + i) % partitions


class TaskSender:
    """What a write sends from each Spark task, and how (the module docstring); the writers
    hold one, built on the driver and pickled to the tasks with them.

    Constructed on the driver, when the write is planned: checks the columns, and that the
    ``topic`` option names a topic that exists (``UnknownTopic`` now, not in every task).
    ``write_id`` names a batch write (its tasks' identities derive from it)."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.write_id = uuid.uuid4().hex
        if opts.topic is not None:
            with SyncAdmin(opts.bootstrap) as admin:
                admin.describe_topic(opts.topic)

    def write(self, iterator, identity: Callable[[object], tuple]) -> Written:
        """In a task: send every row of its Arrow batches; return once all are acknowledged.
        ``identity(task context)`` names the task's output across its reruns (exactly once)."""
        config = self.opts.producer_config()
        exactly_once = self.opts.exactly_once
        if exactly_once:
            from pyspark import TaskContext

            context = TaskContext.get()
            producer_id = task_producer_id(*identity(context))
            config.update(
                producer_id=producer_id, producer_epoch=0,
                partitioner=PositionPartitioner(producer_id), linger_ms=NO_LINGER_CLOSE_MS,
            )
        producer = SyncProducer(self.opts.bootstrap, **config)
        try:
            pending = []
            total = 0
            for batch in iterator:
                msgs = _messages(batch, self.opts.topic)
                if msgs:
                    pending.append(producer.send_batch(msgs))
                    total += len(msgs)
                    if exactly_once:
                        producer.flush()  # close this Arrow batch's producer batches
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


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("sluice")``: a retried task sends nothing twice (see the module
    docstring)."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.sender = TaskSender(opts, schema)

    def write(self, iterator) -> Written:
        return self.sender.write(iterator, self._identity)

    def _identity(self, context) -> tuple:
        """What names this task's output across its reruns: (write id, partition id)."""
        return (self.sender.write_id, context.partitionId())

    def commit(self, messages) -> None:
        log.info("wrote %d records to sluice", sum(m.records for m in messages if m))

    def abort(self, messages) -> None:
        sent = sum(m.records for m in messages if m)
        log.warning("write aborted; %d records already sent stay in their topics", sent)


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("sluice")``: exactly once across task retries and query
    restarts (see the module docstring)."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.sender = TaskSender(opts, schema)

    def write(self, iterator) -> Written:
        return self.sender.write(iterator, self._identity)

    def _identity(self, context) -> tuple:
        """What names this task's output across its reruns: (query id, micro-batch id,
        partition id)."""
        query = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            raise errors.ClientError("no streaming query id or micro-batch id in the task's context")
        return (query, batch, context.partitionId())

    def commit(self, messages, batchId: int) -> None:
        log.info("micro-batch %d: wrote %d records", batchId, sum(m.records for m in messages if m))

    def abort(self, messages, batchId: int) -> None:
        sent = sum(m.records for m in messages if m)
        log.warning("micro-batch %d aborted; %d records already sent stay", batchId, sent)
