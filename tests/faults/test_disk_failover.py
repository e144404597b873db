"""Disks that fail under a three-broker cluster, through the storage fault injector
(storage/faults.py: every broker is started armed, and only the victim's control file
holds rules): fail fast, never stall (seed 000).

- a follower that cannot roll a segment reports a storage error, so its leader drops it
  from the ISR at once, not after the lag time;
- a leader whose disk fails hands its leadership to an in-sync follower within a second;
- a leader whose fsync fails after followers could copy the group does not cut its tail
  in the same epoch: it gives the partition up, and the new leader's epoch is above;
- a follower whose file system is frozen (a real ``fsfreeze`` of a loop-mounted ext4:
  root only, else skipped) holds its leaders up for at most ``DISK_STALL_S`` and the
  partitions it does not host not at all.

Every test ends with the producers' history checked against the partitions' logs."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path

import pytest
from replicated import LAG_MS, NODES, Workload, eventually, ext4_image, inject

from sluice.client import Admin
from sluice.storage import faults

TOPIC = "events"


@pytest.fixture(autouse=True)
def _armed(monkeypatch):
    monkeypatch.setenv(faults.ENV, faults.ARMED)  # inherited by the brokers started here


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
    await workload.finish(cluster.bootstrap)


@pytest.mark.parametrize(
    "rules", [{"write": "EIO"}, {"write": "EROFS", "roll": "EROFS", "fsync": "EROFS"}, {"write": "hang"}],
    ids=["EIO", "read-only", "hung"],
)
async def test_a_leader_whose_disk_fails_hands_its_leadership_over(three_brokers, rules):
    """The disk of partition 0's leader fails (I/O errors, read-only, or writes that hang):
    within a second an in-sync follower leads partition 0 in a new epoch, the old leader
    out of its ISR, and the producers' sends go on being acknowledged.  Once its disk
    works again the old leader catches up (a write that hung lands in the old epoch, and
    is cut away) and rejoins the ISR."""
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
    inject(cluster, victim)  # the disk works again
    await cluster.fully_replicated(TOPIC, timeout=15)
    await workload.progress(100, 10, "with the old leader back in sync")
    await workload.finish(cluster.bootstrap)


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
    await workload.finish(cluster.bootstrap)
    for value, exc in workload.history.failed.items():
        assert exc.maybe_stored, (value, exc)


async def test_a_frozen_follower_disk_holds_nothing_up(three_brokers, tmp_path):
    """A follower's file system is frozen (``fsfreeze``: every write to it hangs) for 4 s,
    with the session timeout and lag time at their defaults.  Its writes hang off its
    event loop, so it goes on heartbeating and answering; after ``DISK_STALL_S`` it reports
    the stalled writes to its leaders, which drop it from their ISRs: producers on the
    partitions it follows are answered within 1.5 s, and those on partitions it does not
    host are not held at all.  Thawed, it catches up and rejoins."""
    disks = {n: tmp_path / f"disk{n}" for n in NODES}
    with contextlib.ExitStack() as mounts:
        for n, d in disks.items():
            mounts.enter_context(ext4_image(tmp_path / f"disk{n}.img", d))
        frozen: Path | None = None
        try:
            cluster = await three_brokers.start(
                data_dirs={n: d / "data" for n, d in disks.items()},
                extra_args=["--session-timeout-ms", "6000", "--replica-lag-time-max-ms", "10000"],
            )
            [hosted] = await cluster.create_topic(TOPIC, partitions=1)
            victim = next(n for n in NODES if n != hosted.leader)
            async with Admin(cluster.bootstrap) as admin:
                await admin.create_topic("other", 3, {"min.insync.replicas": "1"}, replication_factor=2)
            others = [p.partition for p in await cluster.partitions("other") if victim not in p.replicas]
            assert others, "every partition of the other topic is on the victim"
            followed = await Workload(cluster.bootstrap, TOPIC, [0], name="f").start()
            elsewhere = await Workload(cluster.bootstrap, "other", others, name="o").start()
            await followed.progress(300, 20, "before the freeze")
            await elsewhere.progress(300, 20, "before the freeze")

            loop = asyncio.get_running_loop()
            subprocess.run(["fsfreeze", "-f", str(disks[victim])], check=True)
            frozen, at = disks[victim], loop.time()
            await asyncio.sleep(4)
            subprocess.run(["fsfreeze", "-u", str(frozen)], check=True)
            frozen = None
            thawed = loop.time()
            # every send made before the thaw is answered by now, in time or late
            await followed.progress(100, 15, "after the thaw")
            await elsewhere.progress(100, 15, "after the thaw")

            for name, w, bound in (("followed", followed, 1.5), ("not hosted", elsewhere, 0.5)):
                during = [lat for t0, lat in w.latencies if t0 + lat >= at and t0 <= thawed]
                worst = max(during)
                print(f"{name}: {len(during)} sends answered during the freeze, max latency {worst * 1000:.0f} ms")
                assert worst <= bound, f"a send to the {name} partitions waited {worst:.3f} s:\n{w.timeline(at)}"
                assert not w.errors, f"sends to the {name} partitions failed: {w.errors}"
                early = [lat for t0, lat in w.latencies if at + bound <= t0 + lat <= thawed]
                assert len(early) >= 50, f"the {name} partitions took {len(early)} sends while frozen"
            assert "stalls" in cluster.brokers[victim].log()
            await cluster.fully_replicated(TOPIC)
            await elsewhere.stop()
            await followed.finish(cluster.bootstrap)
        finally:
            if frozen is not None:
                subprocess.run(["fsfreeze", "-u", str(frozen)], check=False)
            three_brokers.kill_brokers()  # before the file systems are unmounted
