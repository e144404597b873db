"""``sluice group …``: consumer groups, as ``kafka-consumer-groups`` and ``rpk group`` show them.

A group is the offsets committed under its name: the broker has no membership protocol, so
it cannot tell whether a consumer of the group is running.  ``describe`` shows, per
partition, the committed offset, the log start and end (as the partition's leader has
them), the lag and when and from which client address the last commit came.
``reset-offsets`` and ``delete`` act at once; a consumer of the group that is still running
overwrites a reset (or recreates a deleted group) with its next commit, so stop it first.
"""

from __future__ import annotations

import dataclasses

import click

from sluice.cli.output import data_options, echo_json, iso_ms, or_dash, table, wants_json
from sluice.cli.params import iso_time


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


@click.group()
def group() -> None:
    """List, describe, reset and delete consumer groups."""


@group.command("list")
@data_options
@click.pass_context
def group_list(ctx, as_json: bool) -> None:
    """List groups with committed offsets: topics, partitions, total lag, last commit.

    The lag is summed over the committed partitions from each partition's leader; a
    partition with no leader now adds nothing, and the lag shows how many were left out
    ("40 + 2 unknown"; lag_unknown in JSON).
    """
    with _admin(ctx) as admin:
        groups = admin.list_groups()
    if as_json:
        echo_json(groups)
        return
    table(
        "Groups",
        ["group", "topics", "partitions", "lag", "last commit"],
        [[g.name, ",".join(g.topics), g.partitions, _total_lag(g.lag, g.lag_unknown), iso_ms(g.last_commit_ms)]
         for g in groups],
    )


def _total_lag(lag: int, unknown: int) -> str:
    """A summed lag, with how many partitions it leaves out (their lag is unknown)."""
    return f"{lag} + {unknown} unknown" if unknown else str(lag)


@group.command("describe")
@click.argument("name")
@data_options
@click.pass_context
def group_describe(ctx, name: str, as_json: bool) -> None:
    """Show committed offset, log start, log end and lag per partition of every topic GROUP
    committed to.

    Log start and log end come from each partition's leader, whichever broker coordinates
    the group.  "-" (-1 in JSON) means unknown: committed, for a partition the group never
    committed; log start and log end, for a partition with no leader now (or one that
    cannot be reached); lag, where either the committed offset or the log end is unknown.
    """
    with _admin(ctx) as admin:
        desc = admin.describe_group(name)
    if wants_json(as_json):
        echo_json(desc)
        return
    lag = sum(p.lag for p in desc.partitions if p.lag > 0)
    unknown = sum(p.lag < 0 and p.committed_offset >= 0 and not p.error for p in desc.partitions)
    table(
        f"Group {name}: total lag {_total_lag(lag, unknown)}",
        ["topic", "partition", "committed", "log start", "log end", "lag", "last commit", "client"],
        [
            [p.topic, p.partition, or_dash(p.committed_offset), or_dash(p.log_start_offset),
             or_dash(p.high_watermark), or_dash(p.lag), iso_ms(p.commit_time_ms), p.committed_by or "-"]
            for p in desc.partitions
        ],
    )


@group.command("delete")
@click.argument("name")
@click.pass_context
def group_delete(ctx, name: str) -> None:
    """Delete GROUP's committed offsets.

    Nothing checks for running consumers (there is no membership): one still running
    creates the group again with its next commit.
    """
    with _admin(ctx) as admin:
        admin.delete_group(name)
    click.echo(f"deleted group {name}")


_TARGETS = ("--to-earliest", "--to-latest", "--to-datetime", "--to-offset", "--shift-by")


@group.command("reset-offsets")
@click.argument("name")
@click.option("-t", "--topic", required=True, help="Topic whose committed offsets move.")
@click.option("-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Only this partition (repeatable; default: every partition).")
@click.option("--to-earliest", is_flag=True, help="To the log start.")
@click.option("--to-latest", is_flag=True, help="To the log end (skip everything there now).")
@click.option("--to-datetime", metavar="ISO-TIME",
              help="To the first message at or after this time (UTC unless a zone is given).")
@click.option("--to-offset", type=click.IntRange(min=0), help="To this offset (clamped to the log).")
@click.option("--shift-by", type=int, help="Committed offset plus N (negative: back), clamped to the log.")
@click.option("--dry-run", is_flag=True, help="Show the new offsets, commit nothing.")
@data_options
@click.pass_context
def group_reset_offsets(ctx, name, topic, partitions, to_earliest, to_latest, to_datetime, to_offset,
                        shift_by, dry_run, as_json) -> None:
    """Move GROUP's committed offsets of a topic; prints old -> new per partition.

    Give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset and
    --shift-by.  A group that does not exist yet is created.  Stop the group's consumers
    first: there is no membership to check, and a running consumer overwrites the reset
    with its next commit.
    """
    given = [to_earliest, to_latest, to_datetime is not None, to_offset is not None, shift_by is not None]
    if sum(given) != 1:
        raise click.UsageError(f"give exactly one of {', '.join(_TARGETS)}")
    if to_earliest:
        target = {"to": "earliest"}
    elif to_latest:
        target = {"to": "latest"}
    elif to_datetime is not None:
        target = {"to": iso_time(to_datetime, "--to-datetime")}
    elif to_offset is not None:
        target = {"to": to_offset}
    else:
        target = {"shift_by": shift_by}
    with _admin(ctx) as admin:
        resets = admin.reset_group_offsets(
            name, topic, partitions=partitions or None, dry_run=dry_run, **target
        )
    if as_json:
        echo_json([dataclasses.asdict(r) for r in resets])
    else:
        table(
            f"Group {name}: offsets of {topic}",
            ["topic", "partition", "old", "new"],
            [[r.topic, r.partition, or_dash(r.old), r.new] for r in resets],
        )
    if dry_run:
        click.echo("dry run: nothing committed", err=True)
