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
bad usage (``USAGE_ERRORS``, cli/common.py), 1 for anything else.  Ctrl-C stops a command with status
130 and no error line (``produce`` says how far it got); a reader that closes the pipe
early ends it quietly with status 0.
``cluster status`` alone also exits 3 to 6 for a cluster that answered but is degraded
(see ``cli/cluster.py``).
"""

from __future__ import annotations

import logging
import os
import sys

import click

from sluice import errors
from sluice.cli import output
from sluice.cli.common import PARTITION
from sluice.cli.common import admin as _admin
from sluice.cli.common import exclusive as _exclusive
from sluice.cli.common import fail as _fail
from sluice.cli.common import fail_with as _fail_with
from sluice.cli.common import quiet_stdout as _quiet_stdout
from sluice.cli.params import (
    LOG_LEVELS,
    Bootstrap,
    Checked,
    Escaped,
    header_pairs,
)
from sluice.client.config import ACKS, ConsumerConfig, ProducerConfig
from sluice.config import ServerConfig
from sluice.protocol.subscriptions import MAX_TAG_CHARS, TAG_HEADER, tag_ok

DEFAULT_BOOTSTRAP = "127.0.0.1:7400"
# The options' defaults: the settings' own (client/config.py, config.py)
_SERVER = ServerConfig()
_PRODUCER = ProducerConfig()
_CONSUMER = ConsumerConfig()


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


# --------------------------------------------------------------------------- produce / consume

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
    from sluice.cli.producing import (
        HeldInterrupts,
        Sender,
        produce_delayed,
        read_available,
        split_messages,
    )
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
            interrupts = HeldInterrupts().install()
            try:
                sender = Sender(producer, topic_name, key=key.encode() if key is not None else None,
                                headers=hdrs, partition=partition, report=report, interrupts=interrupts)
                for values in split_messages(read_available(fd), None if raw else delimiter):
                    if key_separator is None:
                        sender.send(values)
                    else:
                        _send_keyed(sender, values, key_separator)
            finally:
                interrupts.uninstall()
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
from sluice.cli.consume import consume  # noqa: E402 - a command of its own module
from sluice.cli.group import group  # noqa: E402 - a group of its own module
from sluice.cli.pipeline import pipeline  # noqa: E402 - a group of its own module
from sluice.cli.serve import serve  # noqa: E402 - a command of its own module
from sluice.cli.sub import sub  # noqa: E402 - a group of its own module
from sluice.cli.topic import topic  # noqa: E402 - a group of its own module
from sluice.cli.txn import txn  # noqa: E402 - a group of its own module

cli.add_command(serve)
cli.add_command(consume)
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
