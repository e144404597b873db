"""Data pipelines shipped with Sluice, runnable on ``local[*]`` or on a Spark cluster.

``archive`` copies topics to Parquet, partitioned by topic and by the UTC date of each
message's timestamp (``<output>/topic=<t>/date=<yyyy-mm-dd>/part-….parquet``).  It is a
streaming query over the ``sluice`` source with a checkpoint, in one of two modes:

- one-shot (``continuous=False``): archive what the topics hold now, then stop
  (``Trigger.AvailableNow``).  Run it again later and it archives only what came since.
- continuous: keep archiving, one micro-batch per ``trigger_interval``.

Each message lands in the output exactly once, across stops, crashes and restarts, as long
as the same ``checkpoint`` is used: the offsets of every micro-batch are in the checkpoint,
and Spark's file sink lists the files of committed micro-batches in
``<output>/_spark_metadata``.  Spark readers honour that list; other readers can take
their file list from ``archived_files`` and so skip what a crashed run left behind.

The code is the same on a cluster: pass another ``master``.  Then ``output`` and
``checkpoint`` must be on storage every node sees, and the executors' Python must have
Sluice installed (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from sluice.errors import ConfigError
from sluice.spark.options import ReadOptions
from sluice.spark.planning import Planner

__all__ = ["ArchiveRun", "archive", "archive_frame", "archived_files", "session"]

_MICROS_PER_DAY = 86_400_000_000


def session(
    master: str = "local[*]", app_name: str = "sluice", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A ``SparkSession`` for a pipeline (``conf`` on top of quiet defaults).

    Executors run this Python unless ``PYSPARK_PYTHON`` says otherwise.  The ``sluice``
    data source needs no registering: PySpark finds it (module ``pyspark_sluice``).

    A session that starts a local Spark (``local…`` master) gives it one scratch directory
    (under ``TMPDIR``), removed when this process exits: Spark's local files (shuffle
    blocks, the native libraries it unpacks, its own temporary directories) would
    otherwise stay in ``/tmp`` whenever its JVM does not finish its shutdown hook (killed,
    or its process group ended).  ``spark.local.dir`` or a ``java.io.tmpdir`` in
    ``spark.driver.extraJavaOptions`` in ``conf`` turns that off.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}
    settings = {**defaults, **(conf or {})}
    if master.startswith("local") and SparkContext._active_spark_context is None:
        settings = _with_scratch_dir(settings)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _with_scratch_dir(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` with Spark's local and Java temporary files in a fresh directory that
    is removed at exit (unchanged when they place those files themselves)."""
    java_options = settings.get("spark.driver.extraJavaOptions", "")
    if "spark.local.dir" in settings or "-Djava.io.tmpdir=" in java_options:
        return settings
    scratch = tempfile.mkdtemp(prefix="sluice-spark-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return {
        **settings,
        "spark.local.dir": scratch,
        "spark.driver.extraJavaOptions": f"{java_options} -Djava.io.tmpdir={scratch}".strip(),
    }


def archive_frame(messages: DataFrame) -> DataFrame:
    """The archive's rows: the message columns plus ``date``, the UTC day of ``timestamp``
    (computed from the epoch, whatever the session's time zone)."""
    day = F.floor(F.unix_micros("timestamp") / F.lit(_MICROS_PER_DAY)).cast("int")
    return messages.withColumn("date", F.date_from_unix_date(day))


@dataclass(frozen=True)
class ArchiveRun:
    """What a one-shot run archived."""

    messages: int
    batches: int


def archive(
    spark: SparkSession,
    *,
    bootstrap: str,
    output: str,
    checkpoint: str,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    continuous: bool = False,
    trigger_interval: str = "10 seconds",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
) -> ArchiveRun | StreamingQuery:
    """Archive ``topics`` (or the topics matching ``pattern``) to Parquet under ``output``.

    One-shot: blocks until everything there is now is archived; returns an ``ArchiveRun``.
    Continuous: returns the running ``StreamingQuery`` (``stop()`` it to end).
    ``starting_offsets`` applies to the first run of a checkpoint only.
    """
    if bool(topics) == bool(pattern):
        raise ConfigError("archive needs topics or a pattern (not both)")
    selection = {"topicPattern": pattern} if pattern else {"topics": ",".join(topics)}
    planner = Planner(ReadOptions.parse({"bootstrap": bootstrap, **selection}))
    try:
        planner.partitions()  # a clear UnknownTopic now rather than from the query
    finally:
        planner.close()
    reader = (
        spark.readStream.format("sluice")
        .option("bootstrap", bootstrap)
        .option("includeHeaders", "true")
        .option("startingOffsets", starting_offsets)
    )
    for key, value in selection.items():
        reader = reader.option(key, value)
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (
        archive_frame(reader.load())
        .writeStream.format("parquet")
        .partitionBy("topic", "date")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .queryName("sluice-archive")
    )
    if continuous:
        return writer.trigger(processingTime=trigger_interval).start()
    counter = _ProgressCounter()
    spark.streams.addListener(counter)
    try:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        last = query.lastProgress
        if last is not None:  # progress events arrive asynchronously: wait for the last one
            counter.wait_for(str(query.id), last["batchId"], timeout=30)
    finally:
        spark.streams.removeListener(counter)
    return ArchiveRun(*counter.totals(str(query.id)))


def archived_files(output: str | Path) -> list[Path]:
    """The Parquet files of the committed micro-batches of a local archive, from the file
    sink's log ``<output>/_spark_metadata`` (batch files, from the newest ``.compact`` on)."""
    log_dir = Path(output) / "_spark_metadata"
    entries = sorted(
        (int(p.name.split(".")[0]), p) for p in log_dir.iterdir() if p.name[0].isdigit()
    )
    newest_compact = max((n for n, p in entries if p.suffix == ".compact"), default=-1)
    files: dict[str, None] = {}
    for n, p in entries:
        if n < newest_compact:
            continue
        version, *lines = p.read_text().splitlines()
        if version != "v1":
            raise ConfigError(f"{p}: file sink log version {version!r} is not v1")
        for line in lines:
            entry = json.loads(line)
            if entry["action"] == "add":
                files[entry["path"]] = None
            else:
                files.pop(entry["path"], None)
    return [Path(unquote(urlparse(uri).path)) for uri in files]


class _ProgressCounter(StreamingQueryListener):
    """Adds up the input rows and non-empty micro-batches of each query."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seen: dict[str, tuple[int, int, int]] = {}  # id: (rows, batches, last batch)

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        p = event.progress
        with self._cond:
            rows, batches, _ = self._seen.get(str(p.id), (0, 0, -1))
            rows += p.numInputRows
            self._seen[str(p.id)] = (rows, batches + (1 if p.numInputRows else 0), p.batchId)
            self._cond.notify_all()

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def wait_for(self, query_id: str, batch_id: int, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._seen.get(query_id, (0, 0, -1))[2] >= batch_id, timeout)

    def totals(self, query_id: str) -> tuple[int, int]:
        rows, batches, _ = self._seen.get(query_id, (0, 0, -1))
        return rows, batches
