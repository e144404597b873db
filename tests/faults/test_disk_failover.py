"""Disks that fail under a three-broker cluster, through the storage fault injector
(storage/faults.py: every broker is started armed, and only the victim's control file
holds rules): fail fast, never stall (seed 000).

- a follower that cannot roll a segment reports a storage error, so its leader drops it
  from the ISR at once, not after the lag time;
- a leader whose disk fails hands its leadership to an in-sync follower within a second;
- a leader whose fsync fails after followers could copy the group does not cut its tail
  in the same epoch: it gives the partition up, and the new leader's epoch is above.

Every test ends with the producers' history checked against the partitions' logs."""

from __future__ import annotations

import asyncio
import json

import pytest
from checker import read_logs
from replicated import LAG_MS, NODES, Workload, eventually

from sluice.storage import faults

TOPIC = "events"
MAX_COPIES = 1  # producers are idempotent


@pytest.fixture(autouse=True)
def _armed(monkeypatch):
    monkeypatch.setenv(faults.ENV, faults.ARMED)  # inherited by the brokers started here


def inject(cluster, node: int, **rules) -> None:
    """Give broker ``node``'s disk the fault ``rules`` (storage/faults.py), now."""
    path = cluster.brokers[node].data_dir / faults.CONTROL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rules))
    tmp.replace(path)


async def _finish(cluster, workload: Workload) -> None:
    await workload.stop()
    report = workload.history.check(
        await read_logs(cluster.bootstrap, TOPIC), max_acked_copies=MAX_COPIES, max_unsure_copies=MAX_COPIES
    )
    print(f"{report}; errors {dict(workload.errors)}")
    assert report.acked > 0


def _answered_after(workload: Workload, at: float) -> list[float]:
    return [lat for t0, lat in workload.latencies if t0 + lat >= at]


async def test_a_follower_that_cannot_roll_leaves_the_isr_at_once(three_brokers):
    """The follower's disk turns read-only where it rolls a segment: it reports a storage
    error in its next fetch (not an unknown error, which the leader takes for a refused
    fetch and waits the lag time out), so producers wait for it well under the lag time."""
    cluster = await three_brokers.start()
    parts = await cluster.create_topic(TOPIC, partitions=2, config={"segment.bytes": "8192"})
    [victim] = [n for n in NODES if n not in {p.leader for p in parts}]  # a follower only
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1], value_size=200).start()
    await workload.progress(300, 20, "before the fault")

    at = asyncio.get_running_loop().time()
    inject(cluster, victim, roll="EROFS")

    async def shrunk():
        return all(victim not in p.isr and len(p.isr) == 2 for p in await cluster.partitions(TOPIC))

    await eventually(shrunk, 5, f"broker {victim} out of every ISR")
    await asyncio.sleep(LAG_MS / 1000)
    await workload.progress(300, 10, "with the shrunk ISR")
    assert not workload.errors, f"sends failed: {workload.errors}"
    during = _answered_after(workload, at)
    worst = max(during)
    print(f"{len(during)} sends answered after the fault: max {worst * 1000:.0f} ms")
    assert worst <= 0.6 * LAG_MS / 1000, f"a send waited {worst:.3f} s: the follower left only after the lag time"
    assert "Read-only file system (injected roll fault)" in cluster.brokers[victim].log()
    await _finish(cluster, workload)


@pytest.mark.parametrize("rules", [{"write": "EIO"}, {"write": "EROFS", "roll": "EROFS", "fsync": "EROFS"}])
async def test_a_leader_whose_disk_fails_hands_its_leadership_over(three_brokers, rules):
    """The disk of partition 0's leader fails (I/O errors, or read-only): within a second
    an in-sync follower leads partition 0 in a new epoch, the old leader out of its ISR,
    and the producers' sends go on being acknowledged."""
    cluster = await three_brokers.start()
    parts = await cluster.create_topic(TOPIC, partitions=1)
    victim, epoch = parts[0].leader, parts[0].leader_epoch
    workload = await Workload(cluster.bootstrap, TOPIC, [0]).start()
    await workload.progress(300, 20, "before the fault")

    loop = asyncio.get_running_loop()
    at = loop.time()
    inject(cluster, victim, **rules)

    async def handed_over():
        [p] = await cluster.partitions(TOPIC)
        return p if p.leader not in (victim, -1) and victim not in p.isr else None

    p = await eventually(handed_over, 5, f"partition 0 handed over by broker {victim}")
    took = loop.time() - at
    print(f"broker {p.leader} leads partition 0 in epoch {p.leader_epoch} (ISR {p.isr}) {took:.3f} s after the fault")
    assert p.leader_epoch > epoch
    await workload.progress(300, 10, "after the hand-over")
    assert not workload.errors, f"sends failed: {workload.errors}"
    assert took <= 1.5, f"the leadership moved {took:.3f} s after the fault"
    worst = max(_answered_after(workload, at))
    print(f"max latency of sends answered after the fault: {worst * 1000:.0f} ms")
    assert worst <= 2.0
    await _finish(cluster, workload)


async def test_a_leader_whose_published_fsync_fails_gives_the_partition_up(three_brokers):
    """flush.messages=1: a leader publishes a group to its followers before its own fsync
    returns.  When that fsync fails, the followers may hold the group while the leader's
    disk lost it: the leader must not cut it and write other batches at those offsets in
    the same epoch.  It stops writing and hands the partition over in a new epoch; the
    sends of the failed group are answered as maybe stored, and nothing acknowledged is
    lost or duplicated."""
    cluster = await three_brokers.start()
    parts = await cluster.create_topic(TOPIC, partitions=1, config={"flush.messages": "1"})
    victim, epoch = parts[0].leader, parts[0].leader_epoch
    workload = await Workload(cluster.bootstrap, TOPIC, [0]).start()
    await workload.progress(300, 20, "before the fault")

    loop = asyncio.get_running_loop()
    at = loop.time()
    inject(cluster, victim, fsync="EIO")

    async def handed_over():
        [p] = await cluster.partitions(TOPIC)
        return p if p.leader not in (victim, -1) else None

    p = await eventually(handed_over, 5, f"partition 0 handed over by broker {victim}")
    took = loop.time() - at
    print(f"broker {p.leader} leads in epoch {p.leader_epoch} (ISR {p.isr}) {took:.3f} s after the fault")
    assert p.leader_epoch > epoch and took <= 1.5
    await workload.progress(300, 10, "after the hand-over")
    log = cluster.brokers[victim].log()
    assert "no more writes as leader in epoch" in log
    await _finish(cluster, workload)
    for value, exc in workload.history.failed.items():
        assert exc.maybe_stored, (value, exc)
