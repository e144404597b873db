"""``sluice topic …``: create, list, describe, delete, alter and grow topics.

``describe`` shows each partition's replication (leader, replicas, ISR, leader epoch) beside
its log (log start, high watermark, log end, size); ``create --replication-factor`` sets how
many brokers hold each partition.  Thin: one ``SyncAdmin`` call per command.
"""

from __future__ import annotations

import click

from sluice.cli import output
from sluice.cli.output import node_list, or_dash
from sluice.cli.params import key_values
from sluice.config import MAX_PARTITIONS
from sluice.protocol.messages import TopicDescription


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


@click.group()
def topic() -> None:
    """Create, list, describe, alter, grow (add-partitions) and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("-p", "--partitions", type=click.IntRange(1, MAX_PARTITIONS), default=1, show_default=True,
              help=f"Partitions of the topic, 1-{MAX_PARTITIONS}.")
@click.option("-r", "--replication-factor", type=click.IntRange(min=1), default=None,
              help="Replicas of each partition, on as many brokers  [default: the brokers' default].")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config (repeatable).")
@click.pass_context
def topic_create(ctx, name: str, partitions: int, replication_factor: int | None, configs: tuple[str, ...]) -> None:
    """Create topic NAME.

    Each partition gets --replication-factor replicas on distinct brokers; more than the
    live brokers is refused (INVALID_REPLICATION_FACTOR).
    """
    config = key_values(configs, "--config")
    with _admin(ctx) as admin:
        admin.create_topic(name, partitions=partitions, config=config, replication_factor=replication_factor or 0)
    done = f"created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}"
    if replication_factor:
        done += f", {replication_factor} replica{'s' if replication_factor != 1 else ''} each"
    click.echo(done)


@topic.command("list")
@output.data_options
@click.pass_context
def topic_list(ctx, as_json: bool) -> None:
    """List topics: name and partition count (JSON: name and partitions, a number)."""
    with _admin(ctx) as admin:
        topics = admin.list_topics()
    if as_json:
        output.echo_json([{"name": t.name, "partitions": len(t.partitions)} for t in topics])
        return
    output.table("Topics", ["topic", "partitions"], [[t.name, len(t.partitions)] for t in topics])


@topic.command("describe")
@click.argument("name")
@output.data_options
@click.pass_context
def topic_describe(ctx, name: str, as_json: bool) -> None:
    """Show a topic's config and, per partition, its leader, replicas, in-sync replicas
    (ISR), leader epoch, log start, high watermark, log end, size and segments.

    A leader of -1 means the partition is offline.  Offsets and sizes show "-" where the
    broker that answered is not the partition's leader.  JSON (--json, or when piped) has
    every field of every partition.

    Offsets count records, and a subscription's bookkeeping records (cursor and ack
    records, kept in the topic's partitions) take offsets too: a partition that never got
    a message shows a log end above 0 once a subscription has read it.
    """
    with _admin(ctx) as admin:
        desc = admin.describe_topic(name)
    if output.wants_json(as_json):
        output.echo_json(desc)
        return
    from sluice.config import TopicConfig

    policy = TopicConfig.parse(desc.config).flush_policy
    output.table(f"Topic {name}: config (flush {policy})", ["key", "value"], sorted(desc.config.items()))
    output.table(
        f"Topic {name}: partitions (replication factor {desc.replication_factor})",
        PARTITION_COLUMNS, partition_rows(desc),
    )


PARTITION_COLUMNS = ["partition", "leader", "replicas", "isr", "epoch", "log start",
                     "high watermark", "log end", "bytes", "segments"]


def partition_rows(desc: TopicDescription) -> list[list]:
    """One table row per partition of ``desc`` (columns ``PARTITION_COLUMNS``): node lists
    comma-separated, unknown (-1) offsets and sizes as "-"."""
    return [
        [p.partition, p.leader, node_list(p.replicas), node_list(p.isr), p.leader_epoch,
         *(or_dash(n) for n in (p.log_start_offset, p.high_watermark, p.log_end_offset,
                                p.size_bytes, p.segments))]
        for p in desc.partitions
    ]


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
    twice = sorted({k for k in deletes if deletes.count(k) > 1})
    if twice:
        raise click.BadParameter(f"{twice[0]} is given twice", param_hint="--delete")
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
