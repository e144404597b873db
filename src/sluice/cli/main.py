"""The ``sluice`` command line: thin commands over the client and the server.

Documented forms (more options are welcome, these must not change)::

    sluice serve [--data-dir D] [--host H] [--port P] [--node-id N] [--cluster etcd://HOST:PORT]
                 [--advertise HOST:PORT]
    sluice [--bootstrap HOST:PORT[,HOST:PORT...]] topic create NAME [--partitions N]
                 [--replication-factor R] | list | describe NAME | delete NAME
    sluice cluster status [--json] | rebalance [--topic T] [--json]
    sluice produce TOPIC [--key K | --key-separator SEP] [-H K=V] [--file PATH]
                         [--delimiter SEP | --raw]        one message per line, sent as read
    sluice consume TOPIC [--from earliest|latest|OFFSET|ISO-TIME] [--group G]
                         [--max-messages N] [--timeout-ms T] [-e]
                         [--json | --raw | --format FMT] [--print-keys]
    sluice bench --workload P1-100B|P1-1KiB|P2-1KiB|C1|L1|all|S1|S2|spark|R3|F1|cluster|P1-1KiB-plain|TX-1KiB|P1-send-100B|P1-send-1KiB|P1-syncsend-100B|per-record [--json]
    sluice pipeline archive --topic T|--pattern RE --output DIR --checkpoint DIR [--continuous]

Commands that print data follow one output contract (``output.data_options``): a table
on a terminal, JSON when piped or with ``--json``, ``--output table|json|plain``.  ``-h``
works everywhere and ``--bootstrap`` may follow the command.  Every failure is one line
on stderr, ``error: NAME (code): message`` (``errors.describe``), and exit status 2 for
bad usage (``USAGE_ERRORS``), 1 for anything else.  Ctrl-C stops a command with status
130 and no error line (``produce`` says how far it got); a reader that closes the pipe
early ends it quietly with status 0.
``cluster status`` alone also exits 3 to 6 for a cluster that answered but is degraded
(see ``cli/cluster.py``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from sluice import errors
from sluice.cli import output
from sluice.cli.params import (
    LOG_LEVELS,
    Bootstrap,
    Checked,
    Escaped,
    StartPosition,
    header_pairs,
    key_values,
)
from sluice.client.config import ACKS, ConsumerConfig, ProducerConfig
from sluice.config import ServerConfig
from sluice.protocol.subscriptions import MAX_TAG_CHARS, TAG_HEADER, tag_ok

DEFAULT_BOOTSTRAP = "127.0.0.1:7400"
# The options' defaults: the settings' own (client/config.py, config.py)
_SERVER = ServerConfig()
_PRODUCER = ProducerConfig()
_CONSUMER = ConsumerConfig()


def _fail(message: str, code: int = 1):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# Refusals of a value the command was given, whichever side checks it: bad usage (status 2).
USAGE_ERRORS = (errors.UsageError, errors.InvalidTopicName, errors.InvalidPartitions, errors.InvalidConfig,
                errors.InvalidGroup, errors.InvalidSubscription)


def _fail_with(exc: errors.SluiceError):
    """One line for ``exc``; exit status 2 for bad usage (``USAGE_ERRORS``), else 1."""
    _fail(errors.describe(exc), 2 if isinstance(exc, USAGE_ERRORS) else 1)


class _Group(click.Group):
    """Turns every SluiceError (and a stray OSError, or text that cannot be encoded) into
    one line and a non-zero exit."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:  # `sluice --help | head -1`: click would exit 1
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # the reader left (`| head`): stop quietly, as Unix tools do
            _quiet_stdout()
            sys.exit(0)
        except errors.SluiceError as exc:
            _fail_with(exc)
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            _fail_with(errors.SluiceError(f"{exc.strerror or exc}{where}"))
        except UnicodeError as exc:  # a name, key or header sent as UTF-8 (or a host as IDNA)
            bad = [arg for arg in sys.argv[1:] if not _utf8(arg)]
            if not bad or ctx.invoked_subcommand == "serve":  # serve's paths may be any bytes
                raise
            shown = ", ".join(repr(os.fsencode(arg))[1:] for arg in bad)
            _fail_with(errors.UsageError(f"not UTF-8 text: {shown} ({exc})"))


def _utf8(arg: str) -> bool:
    """Whether a command-line argument was valid UTF-8 (Python keeps invalid bytes as
    lone surrogates, which cannot be encoded)."""
    try:
        arg.encode()
    except UnicodeEncodeError:
        return False
    return True


HELP = {"help_option_names": ["-h", "--help"]}  # inherited by every command


@click.group(cls=_Group, context_settings=HELP)
@click.option(
    "-b", "--bootstrap", envvar="SLUICE_BOOTSTRAP", type=Bootstrap(), default=DEFAULT_BOOTSTRAP, show_default=True,
    help="Brokers to start from, HOST[:PORT] or a comma-separated list of them: any one that answers is enough, "
         "it names the others (port 7400 if left out; env SLUICE_BOOTSTRAP).",
)
@click.option(
    "--log-level", envvar="SLUICE_LOG_LEVEL", type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING", show_default=True, help="Logging level (env SLUICE_LOG_LEVEL).",
)
@click.version_option(package_name="sluice")
@click.pass_context
def cli(ctx: click.Context, bootstrap: str, log_level: str) -> None:
    """Sluice: a durable message queue.

    Commands that print data print a table on a terminal and JSON when piped
    (-o table|json|plain, --json).  Errors are one line on stderr, error: NAME (code):
    message.  Exit status: 0 done, 1 failed, 2 bad usage, 3-6 cluster status (degraded),
    130 interrupted (Ctrl-C).  --bootstrap may also follow the command.
    """
    handler = logging.StreamHandler(sys.stderr)
    if ctx.invoked_subcommand in LOGGING_COMMANDS:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_Said())
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    ctx.obj = {"bootstrap": bootstrap}


# A service's log keeps time and source; a command a person runs says ``warning: ...``,
# in the form of its ``error:`` line.
LOGGING_COMMANDS = {"serve", "pipeline"}


class _Said(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return f"{record.levelname.lower()}: {record.message}"


# --------------------------------------------------------------------------- serve


def _data_dir(path: Path) -> Path:
    """``--data-dir``: a directory, or a path where one can be created."""
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{path} exists and is not a directory")
    return path


def _listen_host(ctx, param, host: str) -> str:
    """``--host``: a name or address this machine can listen on (checked by binding a
    throwaway socket to a free port of it)."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise click.BadParameter(f"cannot resolve {host!r}: {getattr(exc, 'strerror', exc)}") from None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(addr)
        except OSError as exc:
            raise click.BadParameter(f"cannot listen on {host!r}: {exc.strerror or exc}") from None
    return host


@cli.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=_SERVER.data_dir, show_default=True,
              callback=lambda ctx, param, path: _data_dir(path),
              help="Directory of the logs and metadata (created if missing).")
@click.option("--host", default=_SERVER.host, show_default=True, callback=_listen_host,
              help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=_SERVER.port, show_default=True)
@click.option("--node-id", type=click.IntRange(min=0), default=_SERVER.node_id, show_default=True)
@click.option(
    "--topic-default", "topic_defaults", multiple=True, metavar="KEY=VALUE",
    help="Default topic config, e.g. flush.messages=0 (repeatable).",
)
@click.option("--retention-check-ms", type=click.IntRange(min=10), default=_SERVER.retention_check_ms, show_default=True,
              help="How often segments past retention are deleted.")
@click.option("--hw-checkpoint-ms", type=click.IntRange(min=1), default=_SERVER.hw_checkpoint_ms, show_default=True,
              help="How often high watermarks are written to replication-offset-checkpoint.")
@click.option("--max-connections", type=click.IntRange(min=1), default=_SERVER.max_connections, show_default=True)
@click.option("--max-partitions", type=click.IntRange(min=1), default=_SERVER.max_partitions, show_default=True,
              help="Partitions this broker holds at most, over every topic (internal ones too); "
                   "each keeps files open, so mind the open-files limit (ulimit -n).")
@click.option("--max-frame-bytes", type=click.IntRange(min=1024), default=_SERVER.max_frame_bytes, show_default=True,
              help="Largest request accepted; larger length prefixes close the connection.")
@click.option("--advertise", default=None, metavar="HOST[:PORT]",
              help="Address clients and other brokers are told to connect to (default: the listening "
                   "address; the port defaults to --port), for a broker reached through NAT, a proxy or "
                   "a published container port.")
@click.option("--advertised-address", default=None, hidden=True)  # the old name of --advertise
@click.option("--cluster", default=None, metavar="etcd://HOST:PORT[,HOST:PORT][/NAME]",
              help="Join the cluster whose metadata is in etcd (brokers with distinct "
                   "--node-id); default: a cluster of one, metadata in the data directory.")
@click.option("--session-timeout-ms", type=click.IntRange(min=1000), default=_SERVER.session_timeout_ms, show_default=True,
              help="With --cluster: how long the registration outlives a broker that stopped "
                   "answering; its partitions get new leaders after that.")
@click.option("--replica-lag-time-max-ms", type=click.IntRange(min=1), default=_SERVER.replica_lag_time_max_ms, show_default=True,
              help="A follower that has not caught up for this long leaves the ISR.")
@click.option("--default-replication-factor", type=click.IntRange(min=0), default=_SERVER.default_replication_factor, show_default=True,
              help="Replicas of a topic created without --replication-factor; 0: min(3, live brokers).")
@click.option("--leader-rebalance-interval-ms", type=click.IntRange(min=0), default=_SERVER.leader_rebalance_interval_ms, show_default=True,
              help="How often the controller gives leadership back to preferred replicas; 0: never.")
@click.option("--groups-partitions", type=click.IntRange(1, 10_000), default=_SERVER.groups_partitions, show_default=True,
              help="Partitions of the internal topic __groups (group offsets), when it is created.")
@click.option("--txn-check-timeout-ms", type=click.IntRange(min=1), default=_SERVER.txn_check_timeout_ms, show_default=True,
              help="A half message unresolved this long is checked back with a producer of its group.")
@click.option("--txn-check-interval-ms", type=click.IntRange(min=1), default=_SERVER.txn_check_interval_ms, show_default=True,
              help="How often an unresolved half message is checked back.")
@click.option("--txn-max-checks", type=click.IntRange(min=0), default=_SERVER.txn_max_checks, show_default=True,
              help="Checks before an unresolved half message is rolled back and copied to __txn_discarded.")
@click.pass_context
def serve(ctx, data_dir: Path, host: str, port: int, node_id: int, topic_defaults: tuple[str, ...],
          retention_check_ms: int, hw_checkpoint_ms: int, max_connections: int, max_partitions: int,
          max_frame_bytes: int, advertise: str | None, advertised_address: str | None, cluster: str | None,
          session_timeout_ms: int, replica_lag_time_max_ms: int, default_replication_factor: int,
          leader_rebalance_interval_ms: int, groups_partitions: int, txn_check_timeout_ms: int,
          txn_check_interval_ms: int, txn_max_checks: int) -> None:
    """Run a broker: data in --data-dir, metadata there too unless --cluster names etcd.

    Brokers of one cluster share the --cluster URL and each has its own --node-id and
    data directory.
    """
    from sluice.client.transport import parse_bootstrap
    from sluice.server.app import run

    if logging.getLogger().level > logging.INFO:
        logging.getLogger("sluice").setLevel(logging.INFO)
    try:
        _exclusive(ctx, "advertise", "advertised_address")
        advertise = advertise if advertise is not None else advertised_address
        adv_host = adv_port = None
        if advertise is not None:
            try:
                addresses = parse_bootstrap(advertise)
            except errors.ConfigError as exc:
                raise errors.ConfigError(f"--advertise: {exc}") from None
            if len(addresses) != 1:
                raise errors.ConfigError(f"--advertise takes one HOST[:PORT], got {advertise!r}")
            [(adv_host, adv_port)] = addresses
            if not _has_port(advertise):  # the listening port, as with no --advertise
                adv_port = None
        config = ServerConfig(
            data_dir=data_dir, host=host, port=port, node_id=node_id,
            advertised_host=adv_host, advertised_port=adv_port,
            topic_defaults=key_values(topic_defaults, "--topic-default"),
            retention_check_ms=retention_check_ms, hw_checkpoint_ms=hw_checkpoint_ms,
            max_connections=max_connections, max_partitions=max_partitions,
            max_frame_bytes=max_frame_bytes, cluster=cluster, session_timeout_ms=session_timeout_ms,
            replica_lag_time_max_ms=replica_lag_time_max_ms,
            default_replication_factor=default_replication_factor,
            leader_rebalance_interval_ms=leader_rebalance_interval_ms,
            groups_partitions=groups_partitions, txn_check_timeout_ms=txn_check_timeout_ms,
            txn_check_interval_ms=txn_check_interval_ms, txn_max_checks=txn_max_checks,
        )
    except errors.ConfigError as exc:
        raise errors.UsageError(str(exc)) from None
    try:
        run(config)
    except OSError as exc:
        raise errors.storage_error_from_os(exc, f"data directory {data_dir}") from exc


# --------------------------------------------------------------------------- topics


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


# --------------------------------------------------------------------------- produce / consume

PARTITION = click.IntRange(0, 2**31 - 1)


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line or by the environment."""
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _has_port(address: str) -> bool:
    """Does ``host:port`` / ``[v6]:port`` name a port (a bare host or IPv6 address does not)?"""
    address = address.strip()
    if address.startswith("["):
        return "]:" in address
    return address.count(":") == 1


def _exclusive(ctx: click.Context, *names: str) -> None:
    """A usage error when more than one of the options ``names`` was given."""
    given = [n for n in names if _given(ctx, n)]
    if len(given) > 1:
        spelled = {p.name: p.opts[-1] for p in ctx.command.params}
        raise click.UsageError(f"{' and '.join(spelled[n] for n in given)} cannot be used together")


def _check_tag(tag: str) -> None:
    """A message tag: what a subscription's tags may be (``tag_ok``)."""
    if not tag_ok(tag):
        raise ValueError(f"a tag has 1-{MAX_TAG_CHARS} characters, got {len(tag)}")


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("-k", "--key", default=None, help="Key of every message.")
@click.option("--key-separator", type=Escaped(), default=None,
              help="Split each message at the first SEP into key and value (a message without SEP fails).")
@click.option("-p", "--partition", type=PARTITION, default=None, help="Send to this partition.")
@click.option("--acks", type=click.Choice(list(ACKS)), default=_PRODUCER.acks, show_default=True,
              help="all: acknowledged once every in-sync replica has the message; leader: once the "
                   "leader appended it; none: not acknowledged (no offsets shown).")
@click.option("-H", "--header", "headers", multiple=True, metavar="KEY=VALUE",
              help="Header on every message (repeatable; a key given twice is sent twice; not sluice.*).")
@click.option("--tag", default=None, type=Checked("TAG", _check_tag, ValueError),
              help="Tag of every message (header sluice.tag, 1-100 characters; subscriptions can filter on it).")
@click.option("--delay-ms", type=click.IntRange(1, 30 * 24 * 3600 * 1000), default=None,
              help="Delayed messages: stored now, delivered (visible to consumers) MS after they are read.")
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, readable=True, allow_dash=True),
              default="-", help="Read this file instead of standard input.")
@click.option("--delimiter", type=Escaped(), default="\\n", show_default=True,
              help="What ends a message in the input (escapes: \\n \\t \\r \\0 \\xHH).")
@click.option("--raw", is_flag=True, help="Send the whole input as one message, byte for byte.")
@click.option("--delivery-timeout-ms", type=click.IntRange(1, 24 * 3600 * 1000), default=_PRODUCER.delivery_timeout_ms,
              show_default=True,
              help="Give up on a message not acknowledged by then (retrying meanwhile: no leader, too few "
                   "in-sync replicas, a broker down).")
@click.pass_context
def produce(ctx, topic_name: str, key: str | None, key_separator: bytes | None, partition: int | None,
            acks: str, headers, tag: str | None, delay_ms: int | None, path: str, delimiter: bytes,
            raw: bool, delivery_timeout_ms: int) -> None:
    """Send each line of standard input (or --file) as one message.

    Messages go out as they are read, a few milliseconds apart at most: `tail -f app.log |
    sluice produce logs` streams.  Only the delimiter is removed: a message's bytes are
    sent as they are (a \\r before the newline stays).  When the input is a terminal, where
    each message went (partition and offset) is printed on stderr.

    Ctrl-C stops reading, waits for the messages already sent, says on stderr how many
    were sent and acknowledged, and exits with status 130.
    """
    from sluice.cli.producing import Sender, produce_delayed, read_available, split_messages
    from sluice.client.sync import SyncProducer

    _exclusive(ctx, "key", "key_separator")
    _exclusive(ctx, "raw", "delimiter")
    hdrs = header_pairs(headers)
    if tag is not None:
        hdrs.append((TAG_HEADER, tag.encode()))
    hdrs = hdrs or None
    if path == "-" and sys.stdin is None:
        raise errors.UsageError("standard input is closed: pipe the messages in, or give --file")
    fd = os.open(path, os.O_RDONLY) if path != "-" else sys.stdin.fileno()
    sender = None
    try:
        with _admin(ctx) as admin:
            admin.describe_topic(topic_name)  # UNKNOWN_TOPIC now, not after a metadata wait
        if delay_ms is not None:
            n, failure, status = produce_delayed(
                ctx.obj["bootstrap"], topic_name, split_messages(read_available(fd), None if raw else delimiter),
                delay_ms=delay_ms, key=key.encode() if key is not None else None, key_separator=key_separator,
                headers=hdrs, partition=partition, timeout_ms=delivery_timeout_ms,
            )
            if failure:
                _fail(failure, status)
            if sys.stderr.isatty():
                click.echo(f"stored {n} delayed message{'s' if n != 1 else ''} for {topic_name}", err=True)
            return
        report = None
        if os.isatty(fd):
            def report(line: str) -> None:
                click.echo(f"{topic_name}: {line}", err=True)

        with SyncProducer(ctx.obj["bootstrap"], acks=acks, delivery_timeout_ms=delivery_timeout_ms) as producer:
            sender = Sender(producer, topic_name, key=key.encode() if key is not None else None,
                            headers=hdrs, partition=partition, report=report)
            for values in split_messages(read_available(fd), None if raw else delimiter):
                if key_separator is None:
                    sender.send(values)
                else:
                    _send_keyed(sender, values, key_separator)
            producer.flush()
    except KeyboardInterrupt:  # the producer was closed on the way out: every send is settled
        if sender is not None:
            _interrupted(sender)
        sys.exit(130)
    finally:
        if path != "-":
            os.close(fd)
    failure = sender.summary_error()
    if failure:
        _fail(failure, sender.exit_status())
    if sys.stderr.isatty() and report is None:
        click.echo(f"sent {sender.sent} message{'s' if sender.sent != 1 else ''} to {topic_name}", err=True)


def _interrupted(sender) -> None:
    """Ctrl-C in ``produce``: how far it got, so that the user knows where to resume."""
    failed = f", {sender.failed} failed" if sender.failed else ""
    unsettled = sender.sent - sender.acked - sender.failed
    lost = f", {unsettled} not acknowledged" if unsettled else ""
    start = "\n" if sys.stderr.isatty() else ""  # after the terminal's ^C
    click.echo(f"{start}interrupted: {sender.sent} message{'s' if sender.sent != 1 else ''} sent, "
               f"{sender.acked} acknowledged{failed}{lost}", err=True)


def _send_keyed(sender, messages: list[bytes], separator: bytes) -> None:
    """Split each message at its first ``separator`` into key and value and send those;
    a message without the separator is refused (and counted as failed)."""
    from sluice.cli.producing import key_separator_missing

    keys, values = [], []
    for m in messages:
        k, sep, v = m.partition(separator)
        if sep:
            keys.append(k)
            values.append(v)
            continue
        if values:
            sender.send(values, keys)
            keys, values = [], []
        sender.refuse(key_separator_missing(separator, m))
    if values:
        sender.send(values, keys)


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that the exit flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--from", "start", type=StartPosition(), default=None, metavar="POSITION",
    help="earliest | latest | OFFSET | ISO-TIME (a time without a zone is UTC).  Default: with "
         "--group, the group's committed offsets, and earliest where it has none; without "
         "--group, latest.",
)
@click.option("-g", "--group", default=None,
              help="Consumer group: start from its committed offsets and commit as messages are printed; "
                   "the starting positions are committed at once, even if nothing is read (a partition "
                   "that has no leader yet: once it has one).")
@click.option("-p", "--partition", type=PARTITION, default=None, help="Only this partition.")
@click.option("--sub", "subscription", default=None, metavar="NAME",
              help="Read through subscription NAME (created from --from, default earliest, when missing), "
                   "acking each message once printed.")
@click.option("-n", "--max-messages", type=click.IntRange(min=1), default=None, help="Stop after N messages.")
@click.option("--timeout-ms", type=click.IntRange(min=0), default=None, help="Stop when no message arrives for T ms.")
@click.option("--retry-timeout-ms", type=click.IntRange(1, 365 * 24 * 3600 * 1000), default=_CONSUMER.retry_timeout_ms,
              show_default=True, help="Fail once the brokers have been unreachable this long (not with --sub, "
                                      "which retries for as long as it runs).")
@click.option("-e", "--exit-at-end", is_flag=True,
              help="Stop once every partition is read up to the end it had when the command started "
                   "(messages arriving meanwhile may be printed too).  A partition that has no leader is "
                   "waited for (up to 60 s, or --timeout-ms without a message) while the others are read.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per message; keys and values that are not UTF-8 are base64.")
@click.option("--output", "output_mode", type=click.Choice(["plain", "json"]), default=None,
              help="plain: the values as text (the default, on a terminal and when piped); json: as --json.")
@click.option("--raw", is_flag=True,
              help="Write each value byte for byte, then --delimiter (default: text mode, where bytes "
                   "that are not UTF-8 are written as \\xNN escapes).")
@click.option("--format", "fmt", type=Escaped(), default=None, metavar="FMT",
              help=f"Write each message per FMT, keys and values byte for byte: {output.FORMAT_HELP}.")
@click.option("--print-keys", is_flag=True, help="Write the key and --key-separator before each value.")
@click.option("--key-separator", type=Escaped(), default="\\t", show_default=True,
              help="Between key and value with --print-keys.")
@click.option("--delimiter", type=Escaped(allow_empty=True), default="\\n", show_default=True,
              help="Written after each message in text and raw mode (escapes: \\n \\t \\r \\0 \\xHH).")
@click.pass_context
def consume(ctx, topic_name, start, group, partition, subscription, max_messages, timeout_ms, retry_timeout_ms,
            exit_at_end, as_json, output_mode, raw, fmt, print_keys, key_separator, delimiter) -> None:
    """Print messages of TOPIC, one per line.

    By default (text mode) values are written as UTF-8 text, one per line, and bytes that
    are not UTF-8 become \\xNN escapes; --raw and --format write bytes exactly as stored,
    --json encodes them (base64 when not UTF-8).  The messages are the data: piped, they
    stay text unless --json is given.

    Without --from, reading starts at the end (new messages only) or, with --group, at the
    group's committed offsets; on a terminal this is said on stderr.  With --group, into
    a pipe, only what the reader took from the pipe is committed, not what still waited
    in it when the reader left (`| head -1`).

    Partitions are read independently: one that cannot be read (no leader, its broker
    down) is warned about on stderr and retried in the background while the messages of
    the others are printed.  When the command stops (--timeout-ms, -e) while a partition
    could not be read at all, it says which on stderr and exits with status 1, after
    printing everything it could read.
    """
    from sluice.client.sync import SyncConsumer

    if output_mode == "json":
        _exclusive(ctx, "output_mode", "raw", "fmt")
        as_json = True
    elif output_mode == "plain":
        _exclusive(ctx, "output_mode", "as_json")
    _exclusive(ctx, "as_json", "raw", "fmt")
    for mode in ("as_json", "fmt"):
        for extra in ("print_keys", "key_separator", "delimiter"):
            _exclusive(ctx, mode, extra)
    if group is not None and not group:
        raise click.BadParameter("must not be empty", param_hint="--group")
    try:
        render = output.formatter(as_json=as_json, raw=raw, fmt=fmt, print_keys=print_keys,
                                  delimiter=delimiter, key_separator=key_separator)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--format") from None
    if subscription is not None:
        _exclusive(ctx, "subscription", "group")
        _exclusive(ctx, "subscription", "partition")
        try:
            consume_subscription(ctx, topic_name, subscription, start, render, max_messages=max_messages,
                                 timeout_ms=timeout_ms, exit_at_end=exit_at_end)
        except BrokenPipeError:
            _quiet_stdout()
        return
    admin = _admin(ctx)
    consumer = None
    try:
        desc = admin.describe_topic(topic_name)  # UNKNOWN_TOPIC is an error, not an empty wait
        partitions = [p.partition for p in desc.partitions]
        bounds = {p.partition: (p.log_start_offset, p.high_watermark) for p in desc.partitions}
        if partition is not None:
            if partition not in partitions:
                raise errors.unknown_partition(topic_name, partition, len(partitions))
            partitions = [partition]
        ends = _EndOffsets(admin, topic_name, partitions) if exit_at_end else None
        consumer = SyncConsumer(ctx.obj["bootstrap"], group=group, retry_timeout_ms=retry_timeout_ms,
                                auto_offset_reset="earliest" if group else "latest", enable_auto_commit=False)
        consumer.assign([(topic_name, p) for p in partitions])
        _seek(consumer, start, bounds)
        if start is None and sys.stderr is not None and sys.stderr.isatty():
            click.echo(_where_it_starts(topic_name, group), err=True)
        unread = _print_records(consumer, render, group=group, max_messages=max_messages,
                                timeout_ms=timeout_ms, ends=ends)
    except BrokenPipeError:
        _quiet_stdout()
        return
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()
    if unread:
        names = ", ".join(f"{t}-{p}" for t, p in unread)
        _fail_with(errors.NotLeader(
            f"{names} could not be read (no leader, or its broker down, for the whole run); "
            "the messages of the other partitions were printed"
        ))


def _where_it_starts(topic: str, group: str | None) -> str:
    """For a person at a terminal who gave no ``--from``: where reading starts."""
    if group is None:
        return (f"reading {topic} from its end: new messages only (--from earliest for those "
                "stored already; Ctrl-C stops)")
    return f"reading {topic} from group {group}'s committed offsets (earliest where it has none; Ctrl-C stops)"


def _seek(consumer, start, bounds: dict[int, tuple[int, int]]) -> None:
    """Apply ``--from`` (a ``params.Start``; None: the consumer's own default).  An OFFSET
    outside a partition's log (``bounds``: log start and end by partition, -1 unknown)
    starts at its nearer end, said on stderr, with or without --group."""
    if start is None:
        return
    if start.kind == "earliest":
        consumer.seek_to_beginning()
    elif start.kind == "latest":
        consumer.seek_to_end()
    elif start.kind == "offset":
        for topic, p in consumer.assignment():
            offset = start.arg
            first, end = bounds.get(p, (-1, -1))
            if 0 <= end < offset:
                click.echo(f"{topic}-{p} ends at offset {end}: starting there, not at {offset}", err=True)
                offset = end
            elif offset < first:
                click.echo(f"{topic}-{p} starts at offset {first}: starting there, not at {offset}", err=True)
                offset = first
            consumer.seek(topic, p, offset)
    else:
        consumer.seek_to_time(start.arg)


UNREADABLE_WAIT_S = 60.0  # -e: how long a partition with no leader is waited for (the client's retry_timeout_ms)


class _EndOffsets:
    """-e: the end offset of each partition, from its leader when the command starts; a
    partition whose leader cannot answer then is asked again once the consumer has a
    position for it (its leader is back)."""

    def __init__(self, admin, topic: str, partitions: list[int]) -> None:
        self.admin, self.topic = admin, topic
        self.ends: dict[tuple[str, int], int | None] = dict.fromkeys(((topic, p) for p in partitions), None)
        self.learn(partitions)

    def learn(self, partitions: list[int]) -> None:
        """Ask the leaders for the ends of ``partitions``: all at once, else one by one so
        that a partition with no leader now leaves the others known."""
        try:
            found = self.admin.list_offsets(self.topic, partitions)
        except errors.SluiceError as exc:
            if not exc.retriable or len(partitions) == 1:
                if not exc.retriable:
                    raise
                return
            for p in partitions:
                self.learn([p])
            return
        for p, off in found.items():
            self.ends[(self.topic, p)] = off

    @property
    def unknown(self) -> list[tuple[str, int]]:
        return [tp for tp, end in self.ends.items() if end is None]


def _readable(consumer, ends: _EndOffsets | None) -> set:
    """The assigned partitions with a position (and, with -e, a known end)."""
    out = {tp for tp in consumer.assignment() if consumer.position(tp) is not None}
    return out if ends is None else out - set(ends.unknown)


def _print_records(consumer, render, *, group, max_messages, timeout_ms, ends: _EndOffsets | None) -> list:
    """The consume loop: write records as they come, commit a group's positions.

    The first poll only establishes the starting positions, which a group commits at once
    (those of partitions with no leader yet once they have one); later commits follow each
    batch written.  Stops after ``max_messages``, after ``timeout_ms`` without a record, or
    (``ends``) once every position reached its end; partitions whose end is not known (no
    leader) are waited for ``UNREADABLE_WAIT_S`` past the others.  Returns the partitions
    that could not be read at all (none when it stopped at ``max_messages``).

    Into a pipe, a group commits only what the reader took (``delivered.Delivered``): at
    the end it waits for the reader to take the rest, and when the reader leaves
    (``BrokenPipeError``) it commits what was taken before re-raising.
    """
    import time

    from sluice.cli.delivered import Delivered

    out = output.stdout_bytes()
    delivered = Delivered(out.fileno()) if group is not None else None
    count = 0
    wait = 0  # the first poll returns at once
    commit_due = group is not None
    uncommitted = set(consumer.assignment()) if group is not None else set()  # starting positions
    idle_since = started = time.monotonic()
    while max_messages is None or count < max_messages:
        records = consumer.getmany(timeout_ms=wait, max_records=(max_messages - count) if max_messages else 10000)
        wait = 500 if timeout_ms is None else max(1, min(500, timeout_ms))
        if records:
            rendered = [render(r) for r in records]
            try:
                out.write(b"".join(rendered))
                out.flush()
            except BrokenPipeError:
                if delivered is not None:
                    _commit(consumer, delivered)
                raise
            if delivered is not None:
                delivered.wrote(records, [len(b) for b in rendered])
            count += len(records)
            idle_since = time.monotonic()
            commit_due = group is not None
        positioned = {tp for tp in uncommitted if consumer.position(tp) is not None}
        if positioned:
            commit_due = True
        if commit_due:
            commit_due = not _commit(consumer, delivered) or (delivered is not None and delivered.unread_bytes() > 0)
            if not commit_due:
                uncommitted -= positioned
        if ends is not None and _reached(consumer, ends, time.monotonic() - started):
            break
        if not records and timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= timeout_ms:
            break
    else:
        _last_commit(consumer, delivered)
        return []
    _last_commit(consumer, delivered)
    readable = _readable(consumer, ends)
    return [tp for tp in consumer.assignment() if tp not in readable]


def _last_commit(consumer, delivered) -> None:
    """Into a pipe: once the reader took the rest (or left), commit what it took."""
    if delivered is not None and delivered.pipe:
        delivered.wait_read()
        _commit(consumer, delivered)


def _commit(consumer, delivered=None) -> bool:
    """Commit the consumer's positions (held back to what the reader took, with
    ``delivered``); False (to try again later) on a retriable error."""
    offsets = None
    if delivered is not None and delivered.pipe:
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
        positions = {tp: p for tp, p in positions.items() if p is not None}
        offsets = delivered.committable(positions)
        if not offsets:
            return True
        if offsets == positions:
            offsets = None  # all taken: the positions, as without a pipe
    try:
        consumer.commit(offsets)
    except errors.SluiceError as exc:
        if not exc.retriable:
            raise
        logging.getLogger("sluice.cli").warning("commit failed, will retry: %s", exc)
        return False
    return True


def _reached(consumer, ends: _EndOffsets, elapsed: float) -> bool:
    """Drop from ``ends`` the partitions whose position reached their end; True when none
    is left, or when only partitions with no known end are, waited for long enough."""
    waiting = [tp[1] for tp in ends.unknown if consumer.position(tp) is not None]
    if waiting:  # a leader is back: learn the end it has now
        ends.learn(waiting)
    for tp, end in list(ends.ends.items()):
        position = consumer.position(tp)
        if end is not None and position is not None and position >= end:
            del ends.ends[tp]
    return not ends.ends or (len(ends.unknown) == len(ends.ends) and elapsed >= UNREADABLE_WAIT_S)


# --------------------------------------------------------------------------- bench


@cli.command()
@click.option(
    "--workload", default="all", show_default=True,
    type=click.Choice(
        ["P1-100B", "P1-1KiB", "P2-1KiB", "C1", "L1", "L1-fsync", "all", "S1", "S2", "spark", "R3", "F1", "cluster",
         "P1-1KiB-plain", "TX-1KiB", "P1-send-100B", "P1-send-1KiB", "P1-syncsend-100B", "per-record", "C2", "D1"],
        case_sensitive=False
    ),
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per workload.")
@click.option("--bootstrap", "bench_bootstrap", type=Bootstrap(), default=None,
              help="Use this broker instead of starting one.")
@click.pass_context
def bench(ctx, workload: str, as_json: bool, bench_bootstrap: str | None) -> None:
    """Run the benchmark workloads specified in docs/benchmarks.md (all), the Spark
    connector's (S1: batch read throughput, S2: streaming latency; spark: both), or the
    cluster's on 3 local brokers + etcd (R3: P2-1KiB replicated 3 ways with acks=all; F1:
    failover time; cluster: both), what idempotence costs (P1-1KiB-plain: P1-1KiB with a
    producer that is not idempotent; compare separate runs), or transactional messages
    (TX-1KiB: sends per second, latency from half message to visible), or P1 sent one
    record per call (P1-send-100B, P1-send-1KiB: Producer.send; P1-syncsend-100B:
    SyncProducer.send from a plain loop; per-record: all three).

    Each workload prints its row; one that fails prints a row saying FAILED, the others
    still run, and the command then ends with an error line and exit status 1."""
    from sluice.bench.runner import run_workloads

    _, failure = run_workloads(workload, as_json=output.wants_json(as_json), bootstrap=bench_bootstrap)
    if failure:
        _fail(failure)


from sluice.cli.cluster import cluster  # noqa: E402 - a group of its own module
from sluice.cli.group import group  # noqa: E402 - a group of its own module
from sluice.cli.pipeline import pipeline  # noqa: E402 - a group of its own module
from sluice.cli.sub import consume_subscription, sub  # noqa: E402 - a group of its own module
from sluice.cli.topic import topic  # noqa: E402 - a group of its own module
from sluice.cli.txn import txn  # noqa: E402 - a group of its own module

cli.add_command(topic)
cli.add_command(cluster)
cli.add_command(pipeline)
cli.add_command(group)
cli.add_command(txn)
cli.add_command(sub)


def _late_bootstrap(ctx: click.Context, param, value: str | None) -> None:
    """``--bootstrap`` given after the command: it wins over the one before (and the env)."""
    if value is not None:
        ctx.obj["bootstrap"] = value


def _accept_bootstrap_after(group: click.Group) -> None:
    """Give every command that talks to brokers its own ``-b/--bootstrap`` (``serve`` is
    a broker; ``bench`` has its own, which starts none)."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            _accept_bootstrap_after(command)
        elif name not in ("serve", "bench"):
            command.params.append(click.Option(
                ["-b", "--bootstrap", "late_bootstrap"], type=Bootstrap(), default=None, expose_value=False,
                callback=_late_bootstrap, metavar="HOST:PORT",
                help="Brokers to start from (as sluice --bootstrap, which it overrides).",
            ))


_accept_bootstrap_after(cli)


def _reserve_standard_fds() -> None:
    """Open /dev/null on standard descriptors the command was started without, so that no
    socket or file takes their numbers (the event loop refuses to close descriptors 0-2).
    Without stderr, warnings and errors go nowhere; without stdin or stdout, a command
    that needs one says so."""
    for fd in (0, 1, 2):  # in order: the lowest free descriptor, which open takes, is fd
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process


def main() -> None:
    """The ``sluice`` entry point: click's parsing with Sluice's one-line errors."""
    _reserve_standard_fds()
    try:
        code = cli.main(prog_name="sluice", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # `sluice` / `sluice topic` alone: the help, as click does
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)  # Ctrl-C: click already ended the line
    except click.ClickException as exc:
        # one line, like every other error; `--help` shows the usage
        _fail(errors.describe(errors.UsageError(exc.format_message())), exc.exit_code)
    except BrokenPipeError:  # `sluice --help | head -1`
        _quiet_stdout()
        sys.exit(0)
    try:
        sys.stdout.flush()  # now, not at exit, where a reader that left is a traceback
    except BrokenPipeError:
        _quiet_stdout()
    except (AttributeError, ValueError):  # no stdout, or closed
        pass
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
