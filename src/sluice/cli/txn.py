"""``sluice txn …``: transactional messages for an operator.

``list`` shows the unresolved half messages (each partition's leader answers for its own):
id, age, producer group and the check-backs its leader sent so far.  ``commit`` and
``rollback`` end one by id (``topic/partition/offset``, as ``list`` prints it), exactly as
its producer would: ending it again the same way succeeds, the other way fails with
TRANSACTION_ENDED (exit status 1).  A delayed message is a half message too: ``list
--delayed`` shows the pending ones, soonest due first, and ``commit`` delivers one now,
``rollback`` cancels it.
"""

from __future__ import annotations

import time

import click

from sluice.cli.output import data_options, echo_json, iso_ms, table, wants_json
from sluice.cli.params import Checked
from sluice.protocol.transactions import format_id, parse_id


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


# a transaction id, ``topic/partition/offset``: a malformed one is a usage error
TXN_ID = Checked("ID", parse_id, ValueError)


@click.group()
def txn() -> None:
    """List unresolved transactional (half) messages; commit or roll one back."""


@txn.command("list")
@click.option("-t", "--topic", "topics", multiple=True, help="Only these topics (repeatable).")
@click.option("--delayed", is_flag=True,
              help="The pending delayed messages instead, soonest due first: commit delivers one now, rollback "
                   "cancels it.")
@data_options
@click.pass_context
def txn_list(ctx, topics: tuple[str, ...], delayed: bool, as_json: bool) -> None:
    """Unresolved half messages, oldest first: id, topic, age, group, checks so far."""
    with _admin(ctx) as admin:
        found = admin.list_transactions(list(topics) or None, delayed=delayed)
    if delayed:
        _show_delayed(found, wants_json(as_json))
        return
    if wants_json(as_json):
        echo_json([
            {"id": format_id(t.topic, t.partition, t.offset), "topic": t.topic, "partition": t.partition,
             "offset": t.offset, "group": t.group, "timestamp": t.timestamp, "age_ms": t.age_ms,
             "checks": t.checks}
            for t in found
        ])
        return
    table(
        f"Unresolved transactions: {len(found)}",
        ["id", "topic", "age", "group", "checks", "stored"],
        [[format_id(t.topic, t.partition, t.offset), t.topic, f"{t.age_ms / 1000:.1f}s", t.group, t.checks,
          iso_ms(t.timestamp)] for t in found],
    )


def _show_delayed(found: list, as_json: bool) -> None:
    """Pending delayed messages: one row per stored batch (the messages sent together)."""
    if as_json:
        echo_json([
            {"id": format_id(t.topic, t.partition, t.offset), "topic": t.topic, "partition": t.partition,
             "offset": t.offset, "messages": t.count, "deliver_at": t.deliver_at, "timestamp": t.timestamp}
            for t in found
        ])
        return
    now_ms = time.time() * 1000
    table(
        f"Pending delayed messages: {sum(t.count for t in found)} in {len(found)} batch(es)",
        ["id", "topic", "messages", "deliver at", "due in", "stored"],
        [[format_id(t.topic, t.partition, t.offset), t.topic, t.count, iso_ms(t.deliver_at),
          f"{max(t.deliver_at - now_ms, 0) / 1000:.1f}s", iso_ms(t.timestamp)] for t in found],
    )


def _end(ctx, txn_id: str, commit: bool, as_json: bool) -> None:
    with _admin(ctx) as admin:
        resp = admin.end_transaction(txn_id, commit)
    if as_json:
        echo_json({"id": txn_id, "state": resp.state, "offset": resp.offset, "already": resp.already})
        return
    what = "committed" if commit else "rolled back"
    where = f"visible at offset {resp.offset}" if commit else f"marker at offset {resp.offset}"
    click.echo(f"{txn_id} {'was already ' if resp.already else ''}{what} ({where})")


@txn.command("commit")
@click.argument("txn_id", metavar="ID", type=TXN_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def txn_commit(ctx, txn_id: str, as_json: bool) -> None:
    """Commit the half message ID (topic/partition/offset): make it visible, once (a delayed
    message: deliver it now)."""
    _end(ctx, txn_id, True, as_json)


@txn.command("rollback")
@click.argument("txn_id", metavar="ID", type=TXN_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def txn_rollback(ctx, txn_id: str, as_json: bool) -> None:
    """Roll back the half message ID (topic/partition/offset): never visible (a delayed
    message: cancel it)."""
    _end(ctx, txn_id, False, as_json)
