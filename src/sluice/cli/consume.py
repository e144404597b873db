"""``sluice consume``: print the messages of a topic, read by offset (a fetch consumer,
optionally in a group) or through a subscription (cli/sub.py's ``consume_subscription``).

Its client settings' defaults are ``ConsumerConfig``'s (client/config.py).
"""

from __future__ import annotations

import logging
import sys

import click

from sluice import errors
from sluice.cli import output
from sluice.cli.common import PARTITION, exclusive, fail_with, quiet_stdout
from sluice.cli.common import admin as admin_client
from sluice.cli.params import Escaped, StartPosition
from sluice.cli.sub import consume_subscription
from sluice.client.config import ConsumerConfig

_CONSUMER = ConsumerConfig()  # the options' defaults


@click.command()
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
        exclusive(ctx, "output_mode", "raw", "fmt")
        as_json = True
    elif output_mode == "plain":
        exclusive(ctx, "output_mode", "as_json")
    exclusive(ctx, "as_json", "raw", "fmt")
    for mode in ("as_json", "fmt"):
        for extra in ("print_keys", "key_separator", "delimiter"):
            exclusive(ctx, mode, extra)
    if group is not None and not group:
        raise click.BadParameter("must not be empty", param_hint="--group")
    try:
        render = output.formatter(as_json=as_json, raw=raw, fmt=fmt, print_keys=print_keys,
                                  delimiter=delimiter, key_separator=key_separator)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--format") from None
    if subscription is not None:
        exclusive(ctx, "subscription", "group")
        exclusive(ctx, "subscription", "partition")
        try:
            consume_subscription(ctx, topic_name, subscription, start, render, max_messages=max_messages,
                                 timeout_ms=timeout_ms, exit_at_end=exit_at_end)
        except BrokenPipeError:
            quiet_stdout()
        return
    admin = admin_client(ctx)
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
        quiet_stdout()
        return
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()
    if unread:
        names = ", ".join(f"{t}-{p}" for t, p in unread)
        fail_with(errors.NotLeader(
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
