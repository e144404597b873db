"""Internal topics at full strength, and ``sluice cluster status`` telling the truth, on
real brokers and a real etcd.

An internal topic created while a broker is down gets the live brokers only: it records
the factor it is meant to have, ``cluster status`` counts it under-replicated, and the
controller adds the missing replicas when the broker returns.  A broker that died or is
paused stays registered until its session lapses: ``cluster status`` asks each broker
directly and says so.
"""

from __future__ import annotations

import json
import os
import signal
import time

from cluster_helpers import eventually
from test_replication import bootstrap_of, cluster_args, metadata

from sluice.cli import cluster as cluster_cli

GROUPS, AUDIT = "__groups", "__txn_discarded"


async def _live_are(boot: str, nodes: list[int]) -> bool:
    return sorted(b.node_id for b in (await metadata(boot)).brokers) == nodes


async def _topic(boot: str, name: str):
    """The topic's metadata once it exists (else None)."""
    [t] = (await metadata(boot, name)).topics
    return t if not t.error else None


async def _full(boot: str, name: str, replicas: int):
    t = await _topic(boot, name)
    ok = t is not None and all(len(p.replicas) == replicas and sorted(p.isr) == sorted(p.replicas)
                               for p in t.partitions)
    return t if ok else None


async def test_an_internal_topic_created_while_a_broker_is_down_grows_when_it_returns(
    etcd, cluster_name, broker_factory, cli
):
    # the audit topic is created at the first check-back tick after __groups exists: 15 s
    # after each broker's start, by when broker 2 is down (README's cluster block: kill $B2)
    late = ["--txn-check-timeout-ms", "15000", "--txn-check-interval-ms", "15000"]
    brokers = [broker_factory(extra_args=cluster_args(etcd, cluster_name, n, *late)).start() for n in (1, 2, 3)]
    boot = bootstrap_of(brokers)
    await eventually(lambda: _full(boot, GROUPS, 3), 20, "__groups with three replicas in sync")
    assert await _topic(boot, AUDIT) is None, "too late: the audit topic exists before broker 2 is down"
    brokers[1].kill()
    boot = bootstrap_of([brokers[0], brokers[2]])
    await eventually(lambda: _live_are(boot, [1, 3]), 15, "broker 2's registration lapsing")

    audit = await eventually(lambda: _topic(boot, AUDIT), 30, "the audit topic created")
    [p] = audit.partitions
    assert sorted(p.replicas) == [1, 3] and audit.replication_factor == 3

    shown = cli("cluster", "status", "--json", bootstrap=boot)
    assert shown.returncode == cluster_cli.UNDER_REPLICATED, shown.stderr.decode()
    short = [q for q in json.loads(shown.stdout)["under_replicated"] if q["topic"] == AUDIT]
    assert [(q["replicas"], q["isr"], q["replication_factor"]) for q in short] == [(p.replicas, p.replicas, 3)]

    brokers[1].start()
    boot = bootstrap_of(brokers)
    audit = await eventually(lambda: _full(boot, AUDIT, 3), 30, "the audit topic with three replicas in sync")
    assert audit.partitions[0].replicas[:2] == p.replicas  # the preferred leader stays
    await eventually(lambda: _full(boot, GROUPS, 3), 30, "__groups in sync again")

    async def healthy():
        return cli("cluster", "status", "--json", bootstrap=boot).returncode == cluster_cli.HEALTHY

    await eventually(healthy, 30, "cluster status healthy")


async def test_cluster_status_says_when_a_live_broker_does_not_answer(etcd, cluster_name, broker_factory, cli):
    # sessions of 20 s: a paused broker stays registered (listed alive) meanwhile
    brokers = [
        broker_factory(extra_args=cluster_args(etcd, cluster_name, n, "--session-timeout-ms", "20000")).start()
        for n in (1, 2, 3)
    ]
    boot = brokers[0].bootstrap
    await eventually(lambda: _live_are(boot, [1, 2, 3]), 15, "three live brokers")

    def status(bootstrap):
        done = cli("cluster", "status", "--json", bootstrap=bootstrap)
        assert done.stdout, done.stderr.decode()
        return done.returncode, {b["node_id"]: b for b in json.loads(done.stdout)["brokers"]}

    controller = json.loads(cli("cluster", "status", "--json", bootstrap=boot).stdout)["controller"]
    assert controller in (1, 2, 3)
    paused, killed = controller, 1 + controller % 3
    # the controller paused: the one the client asks first; the status comes from another
    os.killpg(brokers[paused - 1].proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        code, shown = status(bootstrap_of(brokers))
        took = time.monotonic() - started
    finally:
        os.killpg(brokers[paused - 1].proc.pid, signal.SIGCONT)
    assert code == cluster_cli.NOT_ANSWERING
    assert shown[paused]["alive"] and not shown[paused]["answers"] and "within" in shown[paused]["no_answer"]
    assert all(shown[n]["answers"] for n in (1, 2, 3) if n != paused)
    print(f"cluster status with a paused controller took {took:.1f} s")
    assert took < 15, f"cluster status took {took:.1f} s with a paused controller"

    # a killed broker is not listed alive for long: its refusing port ends its registration
    # (broker/liveness.py), well before its 20 s session would
    brokers[killed - 1].kill()
    await eventually(lambda: _live_are(brokers[paused - 1].bootstrap, sorted({1, 2, 3} - {killed})), 5,
                     "the killed broker's registration ended")
    code, shown = status(bootstrap_of(brokers))
    assert killed not in shown or not shown[killed]["alive"]
    assert shown[paused]["answers"]  # resumed
