"""The ``sluice`` command line: thin commands over the client and the server.

Documented forms (more options are welcome, these must not change)::

    sluice serve [--data-dir D] [--host H] [--port P]
    sluice [--bootstrap HOST:PORT] topic create NAME [--partitions N] | list | describe NAME | delete NAME
    sluice produce TOPIC [--key K]                  one message per stdin line
    sluice consume TOPIC [--from earliest|latest|OFFSET|ISO-TIME] [--group G]
                         [--max-messages N] [--timeout-ms T] [--json]
    sluice bench --workload P1-100B|P1-1KiB|P2-1KiB|C1|L1|all|S1|S2|spark [--json]
    sluice pipeline archive --topic T|--pattern RE --output DIR --checkpoint DIR [--continuous]

Tables on a terminal, plain lines / JSON when piped.  Every failure is one line on stderr,
``error: NAME (code): message``, and a non-zero exit status.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from sluice.cli.params import key_values
from sluice.errors import BrokerError, SluiceError

DEFAULT_BOOTSTRAP = "127.0.0.1:7400"
PRODUCE_CHUNK = 1000  # stdin lines per bulk send


def _fail(message: str, code: int = 1):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Turns every SluiceError into one clear line and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokerError as exc:
            _fail(str(exc))
        except SluiceError as exc:
            _fail(f"{type(exc).__name__}: {exc}")
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc}{where}")


def _plain(obj):
    """A protocol struct as plain data, every field included (the wire omits defaults)."""
    import msgspec

    if isinstance(obj, msgspec.Struct):
        return {k: _plain(v) for k, v in msgspec.structs.asdict(obj).items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _is_tty() -> bool:
    return sys.stdout.isatty()


def _table(title: str, columns: list[str], rows: list[list]) -> None:
    if _is_tty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for c in columns:
            table.add_column(c)
        for r in rows:
            table.add_row(*(str(x) for x in r))
        Console().print(table)
    else:
        for r in rows:
            click.echo("\t".join(str(x) for x in r))


@click.group(cls=_Group)
@click.option(
    "--bootstrap", envvar="SLUICE_BOOTSTRAP", default=DEFAULT_BOOTSTRAP, show_default=True,
    help="Broker address HOST:PORT (env SLUICE_BOOTSTRAP).",
)
@click.option("--log-level", default="WARNING", envvar="SLUICE_LOG_LEVEL", help="Logging level.")
@click.version_option(package_name="sluice")
@click.pass_context
def cli(ctx: click.Context, bootstrap: str, log_level: str) -> None:
    """Sluice: a durable message queue."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    ctx.obj = {"bootstrap": bootstrap}


# --------------------------------------------------------------------------- serve


@cli.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=7400, show_default=True)
@click.option("--node-id", type=int, default=0, show_default=True)
@click.option(
    "--topic-default", "topic_defaults", multiple=True, metavar="KEY=VALUE",
    help="Default topic config, e.g. flush.messages=0 (repeatable).",
)
@click.option("--retention-check-ms", type=click.IntRange(min=10), default=30_000, show_default=True,
              help="How often segments past retention are deleted.")
@click.option("--hw-checkpoint-ms", type=click.IntRange(min=1), default=5_000, show_default=True,
              help="How often high watermarks are written to replication-offset-checkpoint.")
@click.option("--max-connections", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--max-frame-bytes", type=click.IntRange(min=1024), default=64 * 1024 * 1024, show_default=True,
              help="Largest request accepted; larger length prefixes close the connection.")
@click.option("--advertised-address", default=None, metavar="HOST:PORT",
              help="Address clients are told to connect to (default: the listening address).")
def serve(data_dir: Path, host: str, port: int, node_id: int, topic_defaults: tuple[str, ...],
          retention_check_ms: int, hw_checkpoint_ms: int, max_connections: int,
          max_frame_bytes: int, advertised_address: str | None) -> None:
    """Run a single-node broker (embedded metadata, data in DATA_DIR)."""
    from sluice.client.transport import parse_bootstrap
    from sluice.config import ServerConfig
    from sluice.server.app import run

    if logging.getLogger().level > logging.INFO:
        logging.getLogger("sluice").setLevel(logging.INFO)
    adv_host = adv_port = None
    if advertised_address is not None:
        [(adv_host, adv_port)] = parse_bootstrap(advertised_address)[:1]
    config = ServerConfig(
        data_dir=data_dir, host=host, port=port, node_id=node_id,
        advertised_host=adv_host, advertised_port=adv_port,
        topic_defaults=key_values(topic_defaults, "--topic-default"),
        retention_check_ms=retention_check_ms, hw_checkpoint_ms=hw_checkpoint_ms,
        max_connections=max_connections,
        max_frame_bytes=max_frame_bytes,
    )
    run(config)


# --------------------------------------------------------------------------- topics


@cli.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


@topic.command("create")
@click.argument("name")
@click.option("--partitions", type=int, default=1, show_default=True)
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config (repeatable).")
@click.pass_context
def topic_create(ctx, name: str, partitions: int, configs: tuple[str, ...]) -> None:
    """Create topic NAME."""
    with _admin(ctx) as admin:
        admin.create_topic(name, partitions=partitions, config=key_values(configs, "--config"))
    click.echo(f"created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}")


@topic.command("list")
@click.pass_context
def topic_list(ctx) -> None:
    """List topics."""
    with _admin(ctx) as admin:
        topics = admin.list_topics()
    _table("Topics", ["topic", "partitions"], [[t.name, len(t.partitions)] for t in topics])


@topic.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def topic_describe(ctx, name: str, as_json: bool) -> None:
    """Show a topic's config and partitions."""
    with _admin(ctx) as admin:
        desc = admin.describe_topic(name)
    if as_json or not _is_tty():
        click.echo(json.dumps(_plain(desc)))
        return
    from sluice.config import TopicConfig

    policy = TopicConfig.parse(desc.config).flush_policy
    _table(f"Topic {name}: config (flush {policy})", ["key", "value"], sorted(desc.config.items()))
    _table(
        f"Topic {name}: partitions",
        ["partition", "leader", "log start", "high watermark", "bytes", "segments"],
        [[p.partition, p.leader, p.log_start_offset, p.high_watermark, p.size_bytes, p.segments] for p in desc.partitions],
    )


@topic.command("delete")
@click.argument("name")
@click.pass_context
def topic_delete(ctx, name: str) -> None:
    """Delete topic NAME and its data."""
    with _admin(ctx) as admin:
        admin.delete_topic(name)
    click.echo(f"deleted topic {name}")


@topic.command("alter")
@click.argument("name")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Set a topic config (repeatable).")
@click.option("--delete", "deletes", multiple=True, metavar="KEY",
              help="Drop an override: back to the broker default (repeatable).")
@click.option("--dry-run", is_flag=True, help="Validate only, change nothing.")
@click.pass_context
def topic_alter(ctx, name: str, configs: tuple[str, ...], deletes: tuple[str, ...], dry_run: bool) -> None:
    """Change topic NAME's config on the running broker, all or nothing, no restart."""
    if not configs and not deletes:
        raise click.UsageError("give at least one --config KEY=VALUE or --delete KEY")
    changes = key_values(configs, "--config")
    with _admin(ctx) as admin:
        admin.alter_topic_config(name, changes, delete=deletes, validate_only=dry_run)
    done = ", ".join([f"{k}={v}" for k, v in changes.items()] + [f"{k} reset to default" for k in deletes])
    click.echo(f"{'dry run, nothing changed: would alter' if dry_run else 'altered'} topic {name}: {done}")


@topic.command("add-partitions")
@click.argument("name")
@click.option("--num", type=int, default=None, help="Partitions to add (as rpk).")
@click.option("--total", type=int, default=None, help="Partition count to grow to (as kafka-topics).")
@click.option("--dry-run", is_flag=True, help="Validate only, change nothing.")
@click.pass_context
def topic_add_partitions(ctx, name: str, num: int | None, total: int | None, dry_run: bool) -> None:
    """Add partitions to topic NAME: --num N more, or up to --total N.  New partitions start
    empty; partitions are never removed."""
    if (num is None) == (total is None):
        raise click.UsageError("give exactly one of --num and --total")
    with _admin(ctx) as admin:
        total = admin.add_partitions(name, total=total, count=num, validate_only=dry_run)
    click.echo(f"{'dry run, nothing changed: would grow' if dry_run else 'grew'} topic {name} to {total} partitions")


# --------------------------------------------------------------------------- produce / consume


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--key", default=None, help="Key of every message.")
@click.option("--partition", type=int, default=None, help="Send to this partition.")
@click.option("--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True)
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="Header on every message.")
@click.pass_context
def produce(ctx, topic_name: str, key: str | None, partition: int | None, acks: str, headers) -> None:
    """Send each line of standard input as one message."""
    from sluice.client.sync import SyncProducer

    hdrs = [(k, v.encode()) for k, v in key_values(headers, "--header").items()] or None
    key_bytes = key.encode() if key is not None else None
    counts = {"acked": 0, "failed": 0}
    errors: list[BaseException] = []

    def done(fut) -> None:  # runs on the producer's loop thread; the main thread only reads
        exc = fut.exception()
        if exc is None:
            counts["acked"] += 1
        else:
            counts["failed"] += 1
            errors.append(exc)

    with _admin(ctx) as admin:
        admin.describe_topic(topic_name)  # UNKNOWN_TOPIC now, not after a metadata wait
    def send_one(producer, value: bytes) -> None:
        try:
            producer.send(topic_name, value, key=key_bytes, headers=hdrs, partition=partition).add_done_callback(done)
        except SluiceError as exc:
            counts["failed"] += 1
            errors.append(exc)

    def send_chunk(producer, values: list[bytes]) -> None:
        """The bulk path (one call per chunk); per message only with headers or on a refusal."""
        if hdrs:
            for v in values:
                send_one(producer, v)
            return
        try:
            fut = producer.send_many(topic_name, values, key=key_bytes, partition=partition)
        except SluiceError:
            for v in values:  # find which message is refused, send the others
                send_one(producer, v)
            return

        n = len(values)

        def chunk_done(f) -> None:
            if f.exception() is None:
                counts["acked"] += n
            else:
                counts["failed"] += n
                errors.append(f.exception())

        fut.add_done_callback(chunk_done)

    sent = 0
    chunk: list[bytes] = []
    with SyncProducer(ctx.obj["bootstrap"], acks=acks) as producer, _status(f"producing to {topic_name}") as status:
        for line in sys.stdin.buffer:
            chunk.append(line.rstrip(b"\r\n"))
            if len(chunk) == PRODUCE_CHUNK:
                send_chunk(producer, chunk)
                sent += len(chunk)
                chunk = []
                if status is not None:
                    status.update(f"{topic_name}: sent {sent:,}, acknowledged {counts['acked']:,}")
        if chunk:
            send_chunk(producer, chunk)
            sent += len(chunk)
        producer.flush()
    if counts["failed"]:
        _fail(f"{counts['failed']} of {sent} messages failed; first: {errors[0]}")
    if _is_tty() or sys.stderr.isatty():
        click.echo(f"sent {sent} message{'s' if sent != 1 else ''} to {topic_name}", err=True)


@contextlib.contextmanager
def _status(text: str):
    """A live spinner on stderr when it is a terminal; yields it (or None when piped)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console

    with Console(stderr=True).status(text) as status:
        yield status


def _text_or_b64(data: bytes | None, field: str) -> dict:
    if data is None:
        return {field: None}
    try:
        return {field: data.decode()}
    except UnicodeDecodeError:
        return {field: base64.b64encode(data).decode(), f"{field}_encoding": "base64"}


def record_json(rec) -> str:
    """One consumed record as a JSON object (text fields when UTF-8, else base64)."""
    obj = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp}
    obj.update(_text_or_b64(rec.key, "key"))
    obj.update(_text_or_b64(rec.value, "value"))
    obj["headers"] = {
        k: (None if v is None else v.decode("utf-8", "backslashreplace")) for k, v in rec.headers
    }
    return json.dumps(obj, ensure_ascii=False)


def parse_from(value: str):
    """``--from``: 'earliest', 'latest', an offset, or an ISO-8601 time (-> ms)."""
    v = value.strip().lower()
    if v in ("earliest", "latest"):
        return v, None
    if v.lstrip("-").isdigit():
        n = int(v)
        if n < 0:
            raise click.BadParameter(f"offset must be ≥ 0, got {n}", param_hint="--from")
        return "offset", n
    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected earliest, latest, an offset or an ISO time, got {value!r}", param_hint="--from"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return "time", int(dt.timestamp() * 1000)


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--from", "start", default=None, help="earliest | latest | OFFSET | ISO-TIME (default: group's committed offsets, else latest).")
@click.option("--group", default=None, help="Consumer group: start from and commit its offsets.")
@click.option("--partition", type=int, default=None, help="Only this partition.")
@click.option("--max-messages", type=click.IntRange(min=1), default=None, help="Stop after N messages.")
@click.option("--timeout-ms", type=click.IntRange(min=0), default=None, help="Stop when no message arrives for T ms.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.pass_context
def consume(ctx, topic_name, start, group, partition, max_messages, timeout_ms, as_json) -> None:
    """Print messages of TOPIC, one per line."""
    import time

    from sluice.client.sync import SyncConsumer
    from sluice.errors import UnknownPartition

    mode = parse_from(start) if start else (None, None)
    reset = "earliest" if mode[0] == "earliest" else "latest"
    with _admin(ctx) as admin:
        desc = admin.describe_topic(topic_name)  # UNKNOWN_TOPIC is an error, not an empty wait
    partitions = [p.partition for p in desc.partitions]
    if partition is not None:
        if partition not in partitions:
            raise UnknownPartition(f"topic {topic_name!r} has partitions 0-{len(partitions) - 1}, not {partition}")
        partitions = [partition]
    consumer = SyncConsumer(ctx.obj["bootstrap"], group=group, auto_offset_reset=reset, enable_auto_commit=False)
    count = 0
    out = sys.stdout
    try:
        consumer.assign([(topic_name, p) for p in partitions])
        kind, arg = mode
        if kind == "earliest":
            consumer.seek_to_beginning()
        elif kind == "latest":
            consumer.seek_to_end()
        elif kind == "offset":
            for tp in consumer.assignment():
                consumer.seek(tp[0], tp[1], arg)
        elif kind == "time":
            consumer.seek_to_time(arg)
        idle_since = time.monotonic()
        while max_messages is None or count < max_messages:
            wait = 500 if timeout_ms is None else max(1, min(500, timeout_ms))
            records = consumer.getmany(timeout_ms=wait, max_records=(max_messages - count) if max_messages else 10000)
            if not records:
                if timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= timeout_ms:
                    break
                continue
            idle_since = time.monotonic()
            for rec in records:
                if as_json:
                    out.write(record_json(rec) + "\n")
                else:
                    out.write((rec.value or b"").decode("utf-8", "backslashreplace") + "\n")
            out.flush()
            count += len(records)
            if group:
                consumer.commit()
    except BrokenPipeError:
        pass
    finally:
        consumer.close()


# --------------------------------------------------------------------------- bench


@cli.command()
@click.option(
    "--workload", default="all", show_default=True,
    type=click.Choice(
        ["P1-100B", "P1-1KiB", "P2-1KiB", "C1", "L1", "all", "S1", "S2", "spark"], case_sensitive=False
    ),
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per workload.")
@click.option("--bootstrap", "bench_bootstrap", default=None, help="Use this broker instead of starting one.")
@click.pass_context
def bench(ctx, workload: str, as_json: bool, bench_bootstrap: str | None) -> None:
    """Run the benchmark workloads of shared/bench/WORKLOADS.md (all), or the Spark
    connector's (S1: batch read throughput, S2: streaming latency; spark: both)."""
    from sluice.bench.runner import run_workloads

    run_workloads(workload, as_json=as_json or not _is_tty(), bootstrap=bench_bootstrap)


from sluice.cli.group import group  # noqa: E402 - a group of its own module
from sluice.cli.pipeline import pipeline  # noqa: E402 - a group of its own module

cli.add_command(pipeline)
cli.add_command(group)


def main() -> None:
    try:
        cli.main(prog_name="sluice", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        _fail("aborted", 130)
    except click.ClickException as exc:
        # one line, like every other error; `--help` shows the usage
        _fail(exc.format_message(), exc.exit_code)


if __name__ == "__main__":
    main()
