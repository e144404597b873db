"""Faults of a three-broker cluster under acks=all producers: broker crashes, stalls and the
metadata store's outage.  Every test ends by reading every partition back from its leader
and checking the producers' history: no acknowledged message lost (each is at the offset it
was acknowledged with), failed sends where their ``maybe_stored`` says, offsets dense, each
producer's messages in order (checker.py).  Producers are not idempotent: a send retried
after a failover may be stored twice when its first attempt survived on the new leader;
such duplicates are allowed and printed."""

from __future__ import annotations

import os
import signal

from checker import read_logs
from replicated import Workload, eventually

TOPIC = "orders"
MAX_COPIES = 3  # a send is attempted again after each failover its answer was lost in


async def _finish(cluster, workload: Workload) -> None:
    await workload.stop()
    report = workload.history.check(await read_logs(cluster.bootstrap, TOPIC), max_acked_copies=MAX_COPIES,
                                      max_unsure_copies=MAX_COPIES)
    print(f"{report}; errors {dict(workload.errors)}")
    assert report.acked > 0


async def test_leader_sigkilled_five_times(three_brokers):
    cluster = await three_brokers.start()
    await cluster.create_topic(TOPIC)
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1, 2]).start()
    await workload.progress(200, 20, "before the first kill")
    for round in range(5):
        victim, epoch = await cluster.leader_of(TOPIC, 0)
        cluster.brokers[victim].kill()

        async def moved(victim=victim, epoch=epoch):
            leader, new_epoch = await cluster.leader_of(TOPIC, 0, cluster.bootstrap_without(victim))
            return leader not in (-1, victim) and new_epoch > epoch

        await eventually(moved, 10, f"a new leader of {TOPIC}-0 (round {round})")
        await workload.progress(200, 20, f"after kill {round}")
        await cluster.start_broker(victim)
        await cluster.fully_replicated(TOPIC)  # it rejoined every ISR
        await workload.progress(100, 20, f"after restart {round}")
    await _finish(cluster, workload)
