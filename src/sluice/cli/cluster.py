"""``sluice cluster …``: the state of a cluster of brokers, and moving leadership back to
the preferred replicas.

``status`` reads one metadata answer (``client.status.ClusterStatus``): the brokers, alive
or not, the controller, and the partitions that are under-replicated (fewer in-sync
replicas than replicas) or offline (no leader).  Its exit status says the same, for
scripts and health checks: ``HEALTHY`` (0), ``UNDER_REPLICATED`` (3), ``OFFLINE`` (4).

``rebalance`` asks the controller for a preferred-leader election (``ELECT_LEADERS``) and
prints what moved, and what could not.

The pure functions here (rows, JSON objects, exit status) are what the commands print.
"""

from __future__ import annotations

import click

from sluice import errors
from sluice.cli.output import echo_json, node_list, table, wants_json
from sluice.client.status import ClusterStatus, PartitionStatus
from sluice.protocol.messages import ElectionResult

HEALTHY = 0
UNDER_REPLICATED = 3  # some partition has fewer in-sync replicas than replicas, none is offline
OFFLINE = 4  # some partition has no leader: it can be neither written nor read

PARTITION_COLUMNS = ["topic", "partition", "leader", "replicas", "isr", "leader epoch"]


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


@click.group()
def cluster() -> None:
    """Show the brokers and partition health of a cluster; move leaders back."""


# --------------------------------------------------------------------------- status


def exit_status(status: ClusterStatus) -> int:
    """``OFFLINE`` if any partition is offline, else ``UNDER_REPLICATED`` if any is
    under-replicated, else ``HEALTHY``."""
    if status.offline:
        return OFFLINE
    return UNDER_REPLICATED if status.under_replicated else HEALTHY


def _partition_json(p: PartitionStatus) -> dict:
    return {"topic": p.topic, "partition": p.partition, "leader": p.leader,
            "replicas": list(p.replicas), "isr": list(p.isr), "leader_epoch": p.leader_epoch}


def status_json(status: ClusterStatus) -> dict:
    """``cluster status --json``: brokers (node_id, address, alive), controller (-1: none),
    under_replicated and offline (partitions: topic, partition, leader, replicas, isr,
    leader_epoch), healthy."""
    return {
        "brokers": [{"node_id": b.node_id, "address": b.address, "alive": b.alive} for b in status.brokers],
        "controller": status.controller,
        "under_replicated": [_partition_json(p) for p in status.under_replicated],
        "offline": [_partition_json(p) for p in status.offline],
        "healthy": status.healthy,
    }


def broker_rows(status: ClusterStatus) -> list[list]:
    """Rows of node id, address (``-`` when not alive), alive and role (``controller``)."""
    return [
        [b.node_id, b.address or "-", "yes" if b.alive else "NO", "controller" if b.node_id == status.controller else ""]
        for b in status.brokers
    ]


def partition_rows(partitions) -> list[list]:
    """Rows (``PARTITION_COLUMNS``) of partition statuses; leader -1 shows as ``none``."""
    return [
        [p.topic, p.partition, p.leader if p.leader >= 0 else "none", node_list(p.replicas),
         node_list(p.isr), p.leader_epoch]
        for p in partitions
    ]


def summary(status: ClusterStatus) -> str:
    """One line: healthy or not, with the counts."""
    alive = sum(b.alive for b in status.brokers)
    word = "healthy" if status.healthy else "NOT healthy"
    controller = status.controller if status.controller >= 0 else "none"
    return (f"{word}: {alive} of {len(status.brokers)} brokers alive, controller {controller}, "
            f"{len(status.under_replicated)} under-replicated, {len(status.offline)} offline partitions")


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the default when piped).")
@click.pass_context
def cluster_status(ctx, as_json: bool) -> None:
    """Show the brokers (alive or not, address), the controller, and the under-replicated
    and offline partitions.

    A broker is alive when it is registered; one that some partition names as a replica
    but that is not registered is shown as not alive.  Under-replicated: fewer in-sync
    replicas (ISR) than replicas.  Offline: no leader.

    Exit status: 0 healthy, 3 some partition under-replicated (none offline), 4 some
    partition offline; 1 when the cluster cannot be asked, as for every command.
    """
    with _admin(ctx) as admin:
        status = admin.cluster_status()
    if wants_json(as_json):
        echo_json(status_json(status))
    else:
        table("Brokers", ["node", "address", "alive", "role"], broker_rows(status))
        for title, parts in (("Under-replicated partitions", status.under_replicated),
                             ("Offline partitions", status.offline)):
            if parts:
                table(title, PARTITION_COLUMNS, partition_rows(parts))
        click.echo(summary(status))
    ctx.exit(exit_status(status))


# --------------------------------------------------------------------------- rebalance


def election_json(results: list[ElectionResult]) -> dict:
    """``cluster rebalance --json``: moved (topic, partition, leader: the new one) and
    failed (topic, partition, leader: the one kept, error: NAME, code, message)."""
    moved = [{"topic": r.topic, "partition": r.partition, "leader": r.leader} for r in results if not r.error]
    failed = []
    for r in results:
        if r.error:
            exc = errors.error_for_code(r.error, r.message)
            failed.append({"topic": r.topic, "partition": r.partition, "leader": r.leader,
                           "error": exc.name, "code": exc.code, "message": exc.message})
    return {"moved": moved, "failed": failed}


@cluster.command("rebalance")
@click.option("--topic", "topics", multiple=True, help="Only this topic's partitions (repeatable; default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the default when piped).")
@click.pass_context
def cluster_rebalance(ctx, topics: tuple[str, ...], as_json: bool) -> None:
    """Move each partition's leadership back to its preferred replica (the first of its
    replicas) where that replica is alive and in sync, and print what moved.

    After a broker comes back, the partitions it led stay with the brokers that took over;
    this gives them back.  Partitions already led by their preferred replica do not move
    and are not listed.  Partitions that could not move are listed with the reason, and
    the exit status is then 1.  A broker too old to know leader election answers
    UNSUPPORTED_VERSION.
    """
    with _admin(ctx) as admin:
        results = admin.elect_leaders(list(topics) or None)
    shown = election_json(results)
    if wants_json(as_json):
        echo_json(shown)
    else:
        if shown["moved"]:
            table("Leaders moved", ["topic", "partition", "new leader"],
                  [[m["topic"], m["partition"], m["leader"]] for m in shown["moved"]])
        if shown["failed"]:
            table("Leaders kept", ["topic", "partition", "leader", "why"],
                  [[f["topic"], f["partition"], f["leader"], f"{f['error']}: {f['message']}"]
                   for f in shown["failed"]])
        if not results:
            click.echo("nothing moved: every partition is led by its preferred replica")
    if shown["failed"]:
        first = shown["failed"][0]
        exc = errors.error_for_code(first["code"], f"{first['topic']} partition {first['partition']}: "
                                                   f"{first['message']}")
        n = len(shown["failed"])
        click.echo(f"error: {n} partition{'s' if n != 1 else ''} kept their leader; first: "
                   f"{errors.describe(exc)}", err=True)
        ctx.exit(1)
