"""The ``sluice`` data source of Spark: batch and streaming reads, batch and streaming writes.

Built on PySpark's Python Data Source API.  Planning runs on the driver (``planning``),
reading on executors (``reading``), writing on executors (``sink``).  Installed with the
``spark`` extra, the source registers itself (the ``pyspark_sluice`` module), so
``spark.read.format("sluice")`` works in any session; ``register(spark)`` does it by hand.

Streaming: the offsets of each micro-batch, per partition, are kept in Spark's checkpoint,
and a range of offsets always reads back the same records, so a restarted query re-reads a
failed micro-batch identically and a file sink writes each message exactly once.
Partitions and topics that appear while a query runs (a topic matching ``topicPattern``, a
topic grown with more partitions) are read from their earliest offset.
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sluice import errors
from sluice.spark import planning
from sluice.spark.options import EARLIEST, LATEST, ReadOptions, WriteOptions
from sluice.spark.planning import Planner
from sluice.spark.reading import OffsetRange, data_lost, read_range, spark_schema

__all__ = ["SluiceDataSource"]

log = logging.getLogger("sluice.spark")


class SluiceDataSource(DataSource):
    """``format("sluice")``: see the module docstring and ``options`` for the options."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self):
        include = ReadOptions.parse(self.options).include_headers
        return spark_schema(include)

    def reader(self, schema) -> DataSourceReader:
        return BatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return StreamReader(ReadOptions.parse(self.options))

    def writer(self, schema, overwrite: bool):
        from sluice.spark.sink import BatchWriter

        return BatchWriter(WriteOptions.parse(self.options), schema)

    def streamWriter(self, schema, overwrite: bool):
        from sluice.spark.sink import StreamWriter

        return StreamWriter(WriteOptions.parse(self.options), schema)


class BatchReader(DataSourceReader):
    """Reads ``[startingOffsets, endingOffsets)`` of every covered partition, planned once."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[OffsetRange]:
        planner = Planner(self.opts)
        try:
            tps = planner.partitions()
            starting = "earliest" if self.opts.starting is None else self.opts.starting
            start = planner.resolve(starting, tps, "earliest")
            end = planner.resolve(self.opts.ending, tps, "latest")
            latest = end if self.opts.ending == "latest" else planner.list_offsets(tps, LATEST)
        finally:
            planner.close()
        for (t, p), off in end.items():
            if off > latest[(t, p)]:
                raise errors.ConfigError(
                    f"{t}/{p}: ending offset {off} is past the end of the log ({latest[(t, p)]})"
                )
            if start[(t, p)] > off:
                raise errors.ConfigError(
                    f"{t}/{p}: starting offset {start[(t, p)]} is past the ending offset {off}"
                )
        return planning.ranges(start, end, self.opts)

    def read(self, partition: OffsetRange):
        return _read(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offsets; lives on the driver for the query's lifetime."""

    def __init__(self, opts: ReadOptions) -> None:
        if opts.ending != "latest":
            raise errors.ConfigError("endingOffsets / endingTimestamp apply to batch reads only")
        self.opts = opts
        self.planner = Planner(opts)
        self.target: planning.Offsets | None = None  # Trigger.AvailableNow: read up to here
        self.initial: dict | None = None

    def initialOffset(self) -> dict:
        """Resolved once per reader: Spark asks again when it plans the first micro-batch,
        and ``latest`` must not have moved by then."""
        if self.initial is None:
            tps = self.planner.partitions()
            spec = "latest" if self.opts.starting is None else self.opts.starting
            self.initial = planning.to_json(self.planner.resolve(spec, tps, "latest"))
        return self.initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.planner.list_offsets(self.planner.partitions(strict=False), LATEST)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tps = self.planner.partitions(strict=False)
        begin = self._with_new_partitions(planning.from_json(start), tps)
        latest = self.planner.list_offsets(tps, LATEST)
        if self.target is not None:
            # Never below begin: Spark asks for the target before the initial offset, so a
            # query starting at ``latest`` may begin past it.
            latest = {
                tp: min(off, max(self.target.get(tp, begin[tp]), begin[tp]))
                for tp, off in latest.items()
            }
        for t, p in begin.keys() - latest.keys():
            data_lost(self.opts, f"{t}/{p} no longer exists")
        if isinstance(limit, ReadMaxRows):
            latest = planning.limit_offsets(begin, latest, limit.max_rows)
        return planning.to_json(latest)

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        first = start == self.initial
        tps = self.planner.partitions(strict=False)
        begin = self._with_new_partitions(planning.from_json(start), tps)
        stop = planning.from_json(end)
        for tp, off in stop.items():
            if tp not in begin or off >= begin[tp]:
                continue
            if first and self.planner.list_offsets([tp], LATEST)[tp] >= begin[tp]:
                # The log did not shrink: ``start`` is ``startingOffsets`` (``latest``, a
                # time) resolved anew by a query restarted before its first micro-batch
                # committed; Spark keeps no start for that batch.  It reads from its end on.
                log.warning(
                    "%s/%s: first micro-batch replanned from offset %d, past its end %d: "
                    "offsets before %d are skipped (JSON startingOffsets keep it stable)",
                    *tp, begin[tp], off, off,
                )
                begin[tp] = off
                continue
            data_lost(
                self.opts,
                f"{tp[0]}/{tp[1]} went back from offset {begin[tp]} to {off} "
                "(deleted and created again?); reading it from its earliest offset",
            )
            begin[tp] = self.planner.list_offsets([tp], EARLIEST)[tp]
        return planning.ranges(begin, stop, self.opts)

    def read(self, partition: OffsetRange):
        return _read(partition)

    def commit(self, end: dict) -> None:
        pass  # the broker keeps everything until retention: nothing to release

    def stop(self) -> None:
        self.planner.close()

    # ------------------------------------------------------------------ helpers

    def _with_new_partitions(self, start: planning.Offsets, tps: list) -> planning.Offsets:
        """``start`` plus the partitions of ``tps`` it lacks, at their earliest offsets."""
        new = [tp for tp in tps if tp not in start]
        if new:
            log.info("new partitions %s: reading them from their earliest offsets", new)
            start = {**start, **self.planner.list_offsets(new, EARLIEST)}
        return start


def _read(partition: OffsetRange):
    if not isinstance(partition, OffsetRange):
        return iter(())  # Spark's stand-in partition when partitions() returned none
    return read_range(partition)
