"""A fenced leader with no heir: the fsync of a group it already published fails while no
other in-sync replica can take the partition over, so it leads again in a new epoch of
its own and cuts first (broker/replication/stepdown.py, ``DiskHealth.fence``).

flush.messages=1: a leader with followers in its ISR publishes a group before its own
fsync returns.  Here both followers are paused (SIGSTOP) long enough that neither counts
as an heir (``handoff.RECENT_FETCH_S`` without a fetch) but short of the session and lag
time, so they stay in the ISR and the group is published; then the leader's fsync fails
(the storage fault injector, storage/faults.py).  The leader must not write in that epoch
again: the sends waiting in it are answered as maybe stored, and it starts a new epoch
with itself as leader, cuts the unsynced tail there, and takes ``acks=all`` writes again
once its followers are back.  The producers' history is checked against the log: nothing
acknowledged lost or duplicated."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import pytest
from checker import read_logs
from replicated import NODES, Workload, eventually, inject

from sluice.client import Producer
from sluice.errors import LeadershipLost
from sluice.harness import freeze
from sluice.storage import faults

pytestmark = pytest.mark.timeout(180)

TOPIC = "alone"
# Long enough that the paused followers stay live and in the ISR while the test runs its
# fault (a few seconds on a loaded machine); the heir check needs a fetch within 1 s.
SLOW = ["--session-timeout-ms", "15000", "--replica-lag-time-max-ms", "15000"]
NO_HEIR_S = 1.5  # > handoff.RECENT_FETCH_S: no paused follower fetched lately


@pytest.fixture(autouse=True)
def _armed(monkeypatch):
    monkeypatch.setenv(faults.ENV, faults.ARMED)  # inherited by the brokers started here


async def test_a_fenced_leader_without_heir_leads_again_in_a_new_epoch(three_brokers):
    cluster = await three_brokers.start(extra_args=SLOW)
    [part] = await cluster.create_topic(TOPIC, partitions=1, config={"flush.messages": "1"})
    victim, epoch = part.leader, part.leader_epoch
    followers = [n for n in NODES if n != victim]
    workload = await Workload(cluster.bootstrap, TOPIC, [0], name="p").start()
    await workload.progress(200, 20, "before the fault")
    await workload.stop()
    history = workload.history

    only_victim = cluster.address(victim)  # the paused brokers would not answer metadata
    options = dict(acks="all", linger_ms=0, retry_backoff_ms=50, metadata_max_age_ms=1000)
    once = Producer(only_victim, retries=0, delivery_timeout_ms=30_000, **options)  # says what it got
    patient = Producer(only_victim, delivery_timeout_ms=30_000, **options)  # retries until stored
    await once.start()
    await patient.start()
    paused: list[int] = []
    try:
        for name, producer in (("once", once), ("patient", patient)):  # both know the leader
            value = history.value(name, 0)
            history.ack(value, await (await producer.send(TOPIC, value, partition=0)))

        for n in followers:
            freeze(cluster.brokers[n].proc.pid, group=True)
            paused.append(n)
        await asyncio.sleep(NO_HEIR_S)
        # written and fsynced in the old epoch, waiting for the paused followers
        waiting = [(history.value(name, 1), producer) for name, producer in (("once", once), ("patient", patient))]
        waits = [await producer.send(TOPIC, value, partition=0) for value, producer in waiting]
        await asyncio.sleep(1.0)  # written and fsynced long since: only the followers are awaited
        assert not any(w.done() for w in waits), "acknowledged while both followers are paused"

        inject(cluster, victim, fsync="EIO", only=f"{TOPIC}-0")
        await asyncio.sleep(5 * faults.POLL_S)  # the broker reads the rule again
        fenced_value = history.value("once", 2)
        fenced = await once.send(TOPIC, fenced_value, partition=0)  # its group's fsync fails
        with pytest.raises(LeadershipLost) as info:
            await asyncio.wait_for(fenced, 20)
        history.fail(fenced_value, info.value)
        assert info.value.maybe_stored is True, info.value
        inject(cluster, victim)  # the disk works again: the new epoch's cut and writes need it

        with pytest.raises(LeadershipLost) as info:  # the waiting write of the fenced epoch
            await asyncio.wait_for(waits[0], 20)
        history.fail(waiting[0][0], info.value)
        assert info.value.maybe_stored is True, info.value

        async def leads_again():
            [p] = await cluster.partitions(TOPIC, only_victim)
            return p if p.leader_epoch > epoch else None

        p = await eventually(leads_again, 10, f"a new leader epoch of {TOPIC}-0 after {epoch}")
        print(f"broker {p.leader} leads {TOPIC}-0 in epoch {p.leader_epoch} (ISR {p.isr}), was epoch {epoch}")
        assert p.leader == victim, f"broker {p.leader} leads, but no other replica was in sync and fetching"
        log = cluster.brokers[victim].log()
        assert "no more writes as leader in epoch" in log
        assert "no other in-sync replica: a new leader epoch after" in log

        for n in followers:
            os.killpg(cluster.brokers[n].proc.pid, signal.SIGCONT)
        paused.clear()
        # the patient producer's waiting write, answered by the fenced epoch's end as maybe
        # stored, is retried under its sequence and acknowledged once
        history.ack(waiting[1][0], await asyncio.wait_for(waits[1], 30))
        for name, producer in (("once", once), ("patient", patient)):
            value = history.value(name, 3)
            history.ack(value, await asyncio.wait_for(await producer.send(TOPIC, value, partition=0), 30))
    finally:
        for n in paused:
            os.killpg(cluster.brokers[n].proc.pid, signal.SIGCONT)
        await once.close()
        await patient.close()

    after = await Workload(cluster.bootstrap, TOPIC, [0], name="q", history=history).start()
    await after.progress(200, 20, "in the new epoch")
    await after.finish(cluster.bootstrap)
    [p] = await cluster.partitions(TOPIC)
    assert p.leader_epoch > epoch
    for value, exc in history.failed.items():
        assert exc.maybe_stored, (value, exc)
    # the new epoch began with the cut back to what was fsynced: the fenced group is gone
    # (the injected fault left its bytes in the file), the fsynced write before it stays
    stored = Counter(r.value for r in (await read_logs(cluster.bootstrap, TOPIC))[0])
    assert stored[fenced_value] == 0, "the unsynced tail of the fenced epoch was not cut"
    assert stored[waiting[0][0]] == 1, "a write fsynced before the fault was cut"
