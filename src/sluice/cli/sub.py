"""``sluice sub …``: durable subscriptions with per-message acks.

``create`` puts a subscription on every partition of a topic; ``list`` / ``describe``
show them (describe: per partition the cursor, backlog, in flight, retrying and
dead-lettered counts); ``seek`` replays from (or skips to) an offset, a time, the earliest
or the latest message; ``delete`` removes one; ``redrive`` copies a subscription's dead
letters back into its topic.  ``sluice consume TOPIC --sub NAME`` reads through one (the
consume loop is ``consume_subscription`` below).
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from sluice.cli.output import data_options, echo_json, iso_ms, stdout_bytes, table, wants_json
from sluice.cli.params import StartPosition
from sluice.protocol.subscriptions import (
    MAX_ATTEMPTS_LIMIT,
    MAX_TIMEOUT_MS,
    MODES,
    SubscriptionConfig,
    config_differences,
)

_SUBSCRIPTION = SubscriptionConfig()  # the options' defaults


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


def start_arg(start) -> str | int:
    """A ``params.Start`` as the clients take it."""
    if start is None:
        return "earliest"
    if start.kind in ("earliest", "latest"):
        return start.kind
    if start.kind == "offset":
        return start.arg
    return f"time:{start.arg}"


@click.group()
def sub() -> None:
    """Durable subscriptions: per-message acks, redelivery, dead letters, replay."""


@sub.command("create")
@click.argument("topic")
@click.argument("name")
@click.option("--from", "start", type=StartPosition(), default=None, metavar="POSITION",
              help="earliest | latest | OFFSET | ISO-TIME.  [default: earliest]")
@click.option("--mode", type=click.Choice(MODES), default=_SUBSCRIPTION.mode, show_default=True,
              help="ordered: a partition's next message only after the previous one is acked; "
                   "key-ordered: the same, per key (a failing message holds back only its key).")
@click.option("--max-attempts", type=click.IntRange(0, MAX_ATTEMPTS_LIMIT), default=_SUBSCRIPTION.max_attempts,
              show_default=True,
              help="Deliveries before a message goes to TOPIC.NAME.dlq (0: never).")
@click.option("--ack-timeout-ms", type=click.IntRange(1, MAX_TIMEOUT_MS), default=_SUBSCRIPTION.ack_timeout_ms,
              show_default=True,
              help="A delivery not acked by then is redelivered.")
@click.option("--backoff-ms", type=click.IntRange(0, MAX_TIMEOUT_MS), default=_SUBSCRIPTION.backoff_initial_ms,
              show_default=True,
              help="Wait before the first redelivery after a failure; doubles each time.")
@click.option("--backoff-max-ms", type=click.IntRange(1, MAX_TIMEOUT_MS), default=_SUBSCRIPTION.backoff_max_ms,
              show_default=True)
@click.option("--tag", "tags", multiple=True, help="Deliver only messages with this tag (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="Succeed if it exists already.")
@click.pass_context
def sub_create(ctx, topic, name, start, mode, max_attempts, ack_timeout_ms, backoff_ms, backoff_max_ms,
               tags, if_not_exists) -> None:
    """Create subscription NAME on every partition of TOPIC."""
    if backoff_ms > backoff_max_ms and ctx.get_parameter_source("backoff_max_ms") is not ParameterSource.DEFAULT:
        raise click.BadParameter(
            f"--backoff-ms {backoff_ms} is above --backoff-max-ms {backoff_max_ms}", param_hint="'--backoff-ms'"
        )
    config = SubscriptionConfig(
        mode=mode, max_attempts=max_attempts, ack_timeout_ms=ack_timeout_ms,
        # a --backoff-ms above the default longest wait raises it
        backoff_initial_ms=backoff_ms, backoff_max_ms=max(backoff_max_ms, backoff_ms or 1), tags=list(tags),
    )
    from sluice.errors import SubscriptionAlreadyExists

    with _admin(ctx) as admin:
        try:
            admin.create_subscription(topic, name, config, start=start_arg(start))
        except SubscriptionAlreadyExists:
            if not if_not_exists:
                raise
            # on the partitions that lack it (added since) it is created; the others keep theirs
            admin.create_subscription(topic, name, config, start=start_arg(start), if_not_exists=True)
            infos = admin.describe_subscription(topic, name)
        else:
            click.echo(f"created subscription {name} on {topic}")
            return
    click.echo(f"subscription {name} on {topic} already exists")
    changed = config_differences(config, [i.config for i in infos if i.config is not None])
    if changed:
        click.echo(f"its settings were not changed: {changed}")


@sub.command("list")
@click.argument("topic", required=False)
@data_options
@click.pass_context
def sub_list(ctx, topic, as_json) -> None:
    """Subscriptions of TOPIC (of every topic when none is named)."""
    with _admin(ctx) as admin:
        found = admin.list_subscriptions(topic)
    if wants_json(as_json):
        echo_json(found)
        return
    rows = [[t, n] for t, names in sorted(found.items()) for n in names]
    table(f"Subscriptions: {len(rows)}", ["topic", "subscription"], rows)


@sub.command("describe")
@click.argument("topic")
@click.argument("name")
@data_options
@click.pass_context
def sub_describe(ctx, topic, name, as_json) -> None:
    """Per partition: cursor, backlog, in flight, retrying, dead-lettered, consumers.

    Offsets (confirmed, end) count records, and the subscription's own bookkeeping
    records (cursor and ack records, kept in the topic's partitions) take offsets too: a
    partition that never got a message can show an end of 3.  The backlog counts
    messages only.
    """
    with _admin(ctx) as admin:
        infos = admin.describe_subscription(topic, name)
    if wants_json(as_json):
        echo_json([
            {"partition": i.partition, "confirmed": i.confirmed, "next_read": i.next_read,
             "high_watermark": i.high_watermark, "backlog": i.backlog, "in_flight": i.in_flight,
             "retrying": i.retrying, "waiting": i.waiting, "dead_lettered": i.dead_lettered, "expired": i.expired,
             "acked_ranges": i.acked_ranges, "consumers": i.consumers, "stalled": i.stalled,
             "mode": i.config.mode if i.config else None,
             "max_attempts": i.config.max_attempts if i.config else None,
             "ack_timeout_ms": i.config.ack_timeout_ms if i.config else None}
            for i in infos
        ])
        return
    cfg = infos[0].config if infos and infos[0].config else SubscriptionConfig()
    table(
        f"Subscription {name} on {topic}: mode {cfg.mode}, max attempts {cfg.max_attempts or 'unlimited'}, "
        f"ack timeout {cfg.ack_timeout_ms} ms" + (f", tags {', '.join(cfg.tags)}" if cfg.tags else ""),
        ["partition", "confirmed", "end", "backlog", "in flight", "retrying", "dead-lettered", "expired",
         "consumers", "note"],
        [[i.partition, i.confirmed, i.high_watermark, i.backlog, i.in_flight, i.retrying, i.dead_lettered,
          i.expired, i.consumers, i.stalled] for i in infos],
    )


@sub.command("seek")
@click.argument("topic")
@click.argument("name")
@click.argument("position", type=StartPosition(), metavar="POSITION")
@click.pass_context
def sub_seek(ctx, topic, name, position) -> None:
    """Move NAME's cursor on every partition to POSITION (earliest | latest | OFFSET |
    ISO-TIME): messages from there on are delivered (again); acks, retries and
    deliveries in flight are forgotten."""
    with _admin(ctx) as admin:
        moved = admin.seek_subscription(topic, name, start_arg(position))
    where = ", ".join(f"{p} at {o}" for p, o in moved.items())
    click.echo(f"moved subscription {name} on {topic} to {_show(position)}: partition {where}")


def _show(position) -> str:
    if position.kind == "time":
        return iso_ms(position.arg)
    return str(position.arg) if position.kind == "offset" else position.kind


@sub.command("delete")
@click.argument("topic")
@click.argument("name")
@click.pass_context
def sub_delete(ctx, topic, name) -> None:
    """Delete subscription NAME of TOPIC (its consumers stop)."""
    with _admin(ctx) as admin:
        admin.delete_subscription(topic, name)
    click.echo(f"deleted subscription {name} of {topic}")


@sub.command("redrive")
@click.argument("topic")
@click.argument("name")
@click.pass_context
def sub_redrive(ctx, topic, name) -> None:
    """Copy the dead letters of subscription NAME (topic TOPIC.NAME.dlq) back into TOPIC.

    The copies are new messages of TOPIC: every reader of it (other subscriptions, consumer
    groups) sees them too.  At least once: a re-drive cut short by a broker crash may copy
    some messages twice."""
    import asyncio

    from sluice.client.redrive import redrive

    n = asyncio.run(redrive(ctx.obj["bootstrap"], topic, name))
    click.echo(f"re-drove {n} message(s) from {topic}.{name}.dlq into {topic}")


def consume_subscription(ctx, topic: str, name: str, start, render, *, max_messages, timeout_ms,
                         exit_at_end: bool) -> None:
    """``sluice consume TOPIC --sub NAME``: print messages, acking each once written.
    Creates the subscription (from ``start``, default earliest) when missing."""
    import time

    from sluice.client.sync import SyncSubscriber

    out = stdout_bytes()
    count = 0
    idle_since = time.monotonic()
    with SyncSubscriber(ctx.obj["bootstrap"], topic, name, start=start_arg(start)) as subscriber:
        if subscriber.created:
            click.echo(f"created subscription {name} on {topic} (from {_show(start) if start else 'earliest'}); "
                       f"it stays until: sluice sub delete {topic} {name}", err=True)
        elif start is not None:
            click.echo(f"warning: subscription {name} of {topic} exists: it goes on from its own cursor, not "
                       f"--from {_show(start)} (to move it: sluice sub seek {topic} {name} POSITION)", err=True)
        while max_messages is None or count < max_messages:
            want = 1000 if max_messages is None else min(1000, max_messages - count)
            wait = 0.5 if timeout_ms is None else max(0.001, min(0.5, timeout_ms / 1000))
            messages = subscriber.getmany(want, wait)
            if messages:
                out.write(b"".join(map(render, messages)))
                out.flush()
                for msg in messages:
                    msg.ack()
                count += len(messages)
                idle_since = time.monotonic()
                continue
            if timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= timeout_ms:
                break
            if exit_at_end and _drained(ctx, subscriber, topic, name):
                break


def _drained(ctx, subscriber, topic: str, name: str) -> bool:
    subscriber.flush()
    with _admin(ctx) as admin:
        infos = admin.describe_subscription(topic, name)
    return all(i.backlog == 0 and i.retrying == 0 for i in infos)
