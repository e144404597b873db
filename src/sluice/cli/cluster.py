"""``sluice cluster …``: the state of a cluster of brokers; replacing the replicas of
brokers that left, spreading replicas onto brokers that joined, and moving leadership
back to the preferred replicas.

``status`` reads one metadata answer (``client.status.ClusterStatus``): the brokers, alive
or not, the controller, and the partitions that are under-replicated (fewer in-sync
replicas than replicas, or fewer replicas than their topic's replication factor) or
offline (no leader), and whether the broker asked can reach the metadata store; then it
asks each live broker directly (a short timeout), since a broker that died or is paused
stays listed until its registration lapses.  Its exit status says the same, for scripts
and health checks: ``HEALTHY`` (0), ``UNDER_REPLICATED`` (3), ``OFFLINE`` (4),
``STORE_UNREACHABLE`` (5), ``NOT_ANSWERING`` (6).

``rebalance`` asks a broker (``ELECT_LEADERS``) to replace the replicas of brokers that are
not alive and to spread replicas onto live brokers holding fewer (unless
``--leaders-only``), then to give offline partitions a leader where a replica is eligible,
then for a preferred-leader election, and prints what moved, and what could not (an
offline partition that has no eligible replica among them, and why).

The pure functions here (rows, JSON objects, exit status) are what the commands print.
"""

from __future__ import annotations

import click

from sluice import errors
from sluice.cli.output import data_options, echo_json, node_list, table, wants_json
from sluice.client.status import ClusterStatus, PartitionStatus
from sluice.protocol.messages import ElectionResult, ReplicaMove

HEALTHY = 0
UNDER_REPLICATED = 3  # some partition has fewer in-sync replicas than replicas, none is offline
OFFLINE = 4  # some partition has no leader: it can be neither written nor read
STORE_UNREACHABLE = 5  # the broker asked cannot reach the metadata store (etcd): no elections
NOT_ANSWERING = 6  # a broker listed as alive does not answer (died or paused; still registered)

PARTITION_COLUMNS = ["topic", "partition", "leader", "replicas", "isr", "leader epoch"]


def _admin(ctx):
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


@click.group()
def cluster() -> None:
    """Show the brokers and partition health of a cluster; move leaders back."""


# --------------------------------------------------------------------------- status


def exit_status(status: ClusterStatus) -> int:
    """``OFFLINE`` if any partition is offline, else ``STORE_UNREACHABLE`` if the metadata
    store is, else ``NOT_ANSWERING`` if a broker listed as alive did not answer, else
    ``UNDER_REPLICATED`` if any partition is under-replicated, else ``HEALTHY``."""
    if status.offline:
        return OFFLINE
    if status.store_error:
        return STORE_UNREACHABLE
    if status.silent:
        return NOT_ANSWERING
    return UNDER_REPLICATED if status.under_replicated else HEALTHY


def _partition_json(p: PartitionStatus) -> dict:
    return {"topic": p.topic, "partition": p.partition, "leader": p.leader,
            "replicas": list(p.replicas), "isr": list(p.isr), "leader_epoch": p.leader_epoch,
            "replication_factor": max(p.full_factor, len(p.replicas))}


def status_json(status: ClusterStatus) -> dict:
    """``cluster status --json``: brokers (node_id, address, alive, answers: false when
    alive but silent when asked directly, no_answer: why), controller (-1: none),
    under_replicated and offline (partitions: topic, partition, leader, replicas, isr,
    leader_epoch, replication_factor: what the topic is meant to have, at most the
    brokers known), store_error (``""``: the metadata store answers), healthy."""
    return {
        "brokers": [{"node_id": b.node_id, "address": b.address, "alive": b.alive,
                     "answers": b.alive and not b.no_answer, "no_answer": b.no_answer} for b in status.brokers],
        "controller": status.controller,
        "under_replicated": [_partition_json(p) for p in status.under_replicated],
        "offline": [_partition_json(p) for p in status.offline],
        "store_error": status.store_error,
        "healthy": status.healthy,
    }


def broker_rows(status: ClusterStatus) -> list[list]:
    """Rows of node id, address (``-`` when not alive), alive (``NO ANSWER: why`` when
    listed but silent when asked) and role (``controller``)."""
    return [
        [b.node_id, b.address or "-", _alive(b), "controller" if b.node_id == status.controller else ""]
        for b in status.brokers
    ]


def _alive(b) -> str:
    if not b.alive:
        return "NO"
    return f"NO ANSWER: {b.no_answer}" if b.no_answer else "yes"


def partition_rows(partitions) -> list[list]:
    """Rows (``PARTITION_COLUMNS``) of partition statuses; leader -1 shows as ``none``;
    replicas short of the topic's replication factor say so (``1,3 (of 3)``)."""
    return [
        [p.topic, p.partition, p.leader if p.leader >= 0 else "none",
         node_list(p.replicas) + (f" (of {p.full_factor})" if p.missing else ""), node_list(p.isr), p.leader_epoch]
        for p in partitions
    ]


def summary(status: ClusterStatus) -> str:
    """One line: healthy or not, with the counts (and a second when the metadata store
    cannot be reached)."""
    alive = sum(b.alive for b in status.brokers)
    word = "healthy" if status.healthy else "NOT healthy"
    controller = status.controller if status.controller >= 0 else "none"
    silent = f" ({len(status.silent)} not answering)" if status.silent else ""
    line = (f"{word}: {alive} of {len(status.brokers)} brokers alive{silent}, controller {controller}, "
            f"{len(status.under_replicated)} under-replicated, {len(status.offline)} offline partitions")
    if status.store_error:
        line += f"\nmetadata store unreachable: {status.store_error}"
    return line


@cluster.command("status")
@data_options
@click.pass_context
def cluster_status(ctx, as_json: bool) -> None:
    """Show the brokers (alive or not, address), the controller, and the under-replicated
    and offline partitions.

    A broker is alive when it is registered; one that some partition names as a replica
    but that is not registered is shown as not alive.  Each live broker is also asked
    directly (1 s timeout): one that died or is paused stays registered for the session
    timeout, and is shown as NO ANSWER meanwhile.  Under-replicated: fewer in-sync
    replicas (ISR) than replicas, or fewer replicas than the topic's replication factor
    (an internal topic created while brokers were down, until they return).  Offline: no
    leader.

    Exit status: 0 healthy, 3 some partition under-replicated (none offline), 4 some
    partition offline, 5 the broker asked cannot reach the metadata store (etcd: nothing
    can be elected or changed, and what is shown may be stale), 6 a broker listed as
    alive does not answer; 1 when the cluster cannot be asked, as for every command.
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


def moves_json(moves: list[ReplicaMove]) -> dict:
    """``cluster rebalance --json``, replicas: replaced (topic, partition, old, new: the
    replica lists), moving (the same: moves recorded onto brokers holding fewer, pending
    until the new replicas are in sync) and not_replaced (either, with error: NAME, code,
    message)."""
    replaced = [{"topic": r.topic, "partition": r.partition, "old": list(r.old), "new": list(r.new)}
                for r in moves if not r.error and not r.pending]
    moving = [{"topic": r.topic, "partition": r.partition, "old": list(r.old), "new": list(r.new)}
              for r in moves if not r.error and r.pending]
    failed = []
    for r in moves:
        if r.error:
            exc = errors.error_for_code(r.error, r.message)
            failed.append({"topic": r.topic, "partition": r.partition, "old": list(r.old), "new": list(r.new),
                           "error": exc.name, "code": exc.code, "message": exc.message})
    return {"replaced": replaced, "moving": moving, "not_replaced": failed}


@cluster.command("rebalance")
@click.option("--topic", "topics", multiple=True, help="Only this topic's partitions (repeatable; default: all).")
@click.option("--leaders-only", is_flag=True, help="Only move leaders back; replace no replicas.")
@data_options
@click.pass_context
def cluster_rebalance(ctx, topics: tuple[str, ...], leaders_only: bool, as_json: bool) -> None:
    """Replace the replicas of brokers that are gone, then move each partition's
    leadership back to its preferred replica (the first of its replicas) where that
    replica is alive and in sync, and print what changed.

    Replicas: in each partition with a live leader, a replica on a broker that is not
    alive (its registration lapsed) is replaced by the least loaded live broker not
    holding the partition yet; the new replica copies the partition from its leader and
    joins the in-sync replicas once caught up (watch ``sluice cluster status``).  The
    replication factor stays.  A partition without a live leader keeps its replicas.
    Then, when live brokers hold uneven numbers of replicas (a broker joined), replicas
    move from the most to the least loaded, in two phases: the new replica is added now
    (``sluice topic describe`` lists it beside the old one) and the old one leaves once
    the new one is in sync (the controller does that; leaders move last).
    ``--leaders-only`` skips this.

    Leaders: a partition without a live leader gets one where a replica is eligible (in
    sync, or any live one when the topic sets unclean.leader.election.enable=true; the
    controller does the same on its own within seconds); one with no eligible replica is
    listed as failed, saying why.  After a broker comes back, the partitions it led stay
    with the brokers that took over; this gives them back.  Partitions already led by
    their preferred replica do not move and are not listed.

    Partitions that could not change are listed with the reason, and the exit status is
    then 1.  A broker too old to know leader election answers UNSUPPORTED_VERSION; one too
    old to replace replicas moves leaders only.
    """
    with _admin(ctx) as admin:
        result = admin.rebalance(list(topics) or None, reassign=not leaders_only)
    results = result.elections
    shown = election_json(results)
    replicas = moves_json(result.moves)
    if wants_json(as_json):
        echo_json({**shown, "replicas": replicas})
    else:
        if replicas["replaced"]:
            table("Replicas replaced", ["topic", "partition", "old replicas", "new replicas"],
                  [[r["topic"], r["partition"], node_list(r["old"]), node_list(r["new"])]
                   for r in replicas["replaced"]])
        if replicas["moving"]:
            table("Replicas moving (old ones leave once the new ones are in sync)",
                  ["topic", "partition", "old replicas", "new replicas"],
                  [[r["topic"], r["partition"], node_list(r["old"]), node_list(r["new"])]
                   for r in replicas["moving"]])
        if replicas["not_replaced"]:
            table("Replicas kept", ["topic", "partition", "replicas", "why"],
                  [[r["topic"], r["partition"], node_list(r["old"]), f"{r['error']}: {r['message']}"]
                   for r in replicas["not_replaced"]])
        if shown["moved"]:
            table("Leaders moved", ["topic", "partition", "new leader"],
                  [[m["topic"], m["partition"], m["leader"]] for m in shown["moved"]])
        if shown["failed"]:
            table("Leaders kept", ["topic", "partition", "leader", "why"],
                  [[f["topic"], f["partition"], f["leader"], f"{f['error']}: {f['message']}"]
                   for f in shown["failed"]])
        if not results and not result.moves:
            click.echo("nothing moved: every replica is on a live broker and every partition is led "
                       "by its preferred replica" if not leaders_only else
                       "nothing moved: every partition is led by its preferred replica")
    failures = [*replicas["not_replaced"], *shown["failed"]]
    if failures:
        first = failures[0]
        exc = errors.error_for_code(first["code"], f"{first['topic']} partition {first['partition']}: "
                                                   f"{first['message']}")
        n = len(failures)
        click.echo(f"error: {n} partition{'s' if n != 1 else ''} could not change; first: "
                   f"{errors.describe(exc)}", err=True)
        ctx.exit(1)
