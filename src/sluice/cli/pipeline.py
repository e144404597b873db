"""``sluice pipeline …``: the Spark pipelines of ``sluice.spark.pipelines``.

Needs the ``spark`` extra; without it the command says so.  Spark is started here, with
``--master`` (``local[*]`` by default) and any ``--conf KEY=VALUE``.
"""

from __future__ import annotations

import re
import signal
import threading

import click

from sluice.cli.params import key_values
from sluice.errors import ConfigError, SluiceError


@click.group()
def pipeline() -> None:
    """Data pipelines on Spark (needs the spark extra)."""


@pipeline.command("archive")
@click.option("-t", "--topic", "topics", multiple=True, help="Topic to archive (repeatable).")
@click.option("--pattern", default=None, help="Archive every topic matching this regular expression.")
@click.option("--output", required=True, help="Folder (or URI) of the Parquet archive.")
@click.option("--checkpoint", required=True, help="Folder (or URI) of the query's checkpoint.")
@click.option("--continuous", is_flag=True, help="Keep archiving until interrupted (default: one-shot).")
@click.option("--trigger-interval", default="10 seconds", show_default=True,
              help="Continuous mode: time between micro-batches.")
@click.option("--starting-offsets", type=click.Choice(["earliest", "latest"]), default="earliest",
              show_default=True, help="Where a new checkpoint starts.")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=None,
              help="Cap on messages per micro-batch.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Spark setting (repeatable).")
@click.pass_context
def archive_command(ctx, topics, pattern, output, checkpoint, continuous, trigger_interval,
                    starting_offsets, max_offsets_per_trigger, master, confs) -> None:
    """Archive topics to Parquet, partitioned by topic and date, each message exactly once.

    One-shot by default: archives what is there now and stops; a later run with the same
    --checkpoint archives only what came since.
    """
    if bool(topics) == bool(pattern):
        raise click.UsageError("give --topic (repeatable) or --pattern")
    try:
        from sluice.spark import pipelines
    except ImportError as exc:
        raise ConfigError(f"the Spark pipelines need the spark extra: pip install '.[spark]' in a clone of the Sluice repository ({exc})") from None
    from pyspark.errors import PySparkException

    spark = pipelines.session(master, "sluice-archive", key_values(confs, "--conf"))
    spark.sparkContext.setLogLevel("WARN")
    try:
        result = pipelines.archive(
            spark,
            bootstrap=ctx.obj["bootstrap"],
            output=output,
            checkpoint=checkpoint,
            topics=topics,
            pattern=pattern,
            continuous=continuous,
            trigger_interval=trigger_interval,
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_offsets_per_trigger,
        )
        if continuous:
            _run_until_signalled(result)
        else:
            click.echo(f"archived {result.messages} messages in {result.batches} micro-batches to {output}")
    except PySparkException as exc:
        raise SluiceError(f"archive query failed: {_cause(exc)}") from None
    finally:
        spark.stop()


def _run_until_signalled(query) -> None:
    """Wait for the query; SIGINT / SIGTERM stop it (a micro-batch cut short is run again
    by the next run, from the checkpoint)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"archiving continuously (query {query.id}); Ctrl-C stops", err=True)
    while not stop.is_set() and query.isActive:
        stop.wait(0.5)
    query.stop()
    if query.exception() is not None:
        raise SluiceError(f"archive query failed: {_cause(query.exception())}")


def _cause(exc) -> str:
    """The sluice error at the root of a Spark failure, else Spark's first line."""
    text = str(exc)
    found = re.findall(r"sluice\.errors\.(\w+: [^\n]*)", text)
    return found[-1] if found else text.strip().splitlines()[0]
