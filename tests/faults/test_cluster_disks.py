"""Disk faults in a three-broker cluster under acks=all producers: a follower's file system
turned read-only, the leader's disk full, a torn segment tail on one replica.  As in
test_cluster_faults.py, every test ends by reading every partition back from its leader
and checking the producers' history (checker.py): no acknowledged message lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re

from checker import read_logs
from replicated import (
    LAG_MS,
    NODES,
    Workload,
    eventually,
    ext4_image,
    make_read_only,
    percentile,
    tmpfs,
)

from sluice.errors import DiskFull

TOPIC = "events"
MAX_COPIES = 1  # producers are idempotent: a send retried after a failover is stored once
DELIVERY_TIMEOUT_MS = 8000



async def test_follower_file_system_turns_read_only(three_brokers, tmp_path):
    """Seed 000: a replica that cannot write must not hold up the leader's acknowledgements
    until producers time out.  It reports the storage error in its next fetch and the
    leader drops it from the ISR at once: producers go on being answered within 1 s."""
    disks = {n: tmp_path / f"disk{n}" for n in NODES}
    with contextlib.ExitStack() as mounts:
        for n, d in disks.items():
            mounts.enter_context(ext4_image(tmp_path / f"disk{n}.img", d))
        try:
            cluster = await three_brokers.start(data_dirs={n: d / "data" for n, d in disks.items()})
            # two partitions over three brokers: one broker leads none, and is the victim
            parts = await cluster.create_topic(TOPIC, partitions=2)
            [victim] = [n for n in NODES if n not in {p.leader for p in parts}]
            workload = await Workload(
                cluster.bootstrap, TOPIC, [0, 1], delivery_timeout_ms=DELIVERY_TIMEOUT_MS
            ).start()
            await workload.progress(300, 20, "before the disk turns read-only")

            loop = asyncio.get_running_loop()
            at = loop.time()
            make_read_only(disks[victim])

            async def shrunk():
                return all(victim not in p.isr and len(p.isr) == 2 for p in await cluster.partitions(TOPIC))

            await eventually(shrunk, 5, f"broker {victim} out of every ISR")
            await asyncio.sleep(2 * LAG_MS / 1000)  # well past the lag timeout: nothing waits for it
            await workload.progress(300, 5, "with the shrunk ISR")
            assert not workload.errors, f"sends failed: {workload.errors}"
            during = [lat for t0, lat in workload.latencies if t0 + lat >= at]
            p99, worst = percentile(during, 0.99), max(during)
            print(f"{len(during)} sends answered after the file system turned read-only: "
                  f"p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms")
            assert p99 <= 1.0, f"p99 latency {p99:.3f} s"
            # the follower tells the leader in its very next fetch: no wait for a retry timer
            assert worst <= 0.5, f"max latency {worst:.3f} s (delivery timeout {DELIVERY_TIMEOUT_MS} ms)"
            assert "cannot write" in "".join(cluster.brokers[n].log() for n in NODES if n != victim)
            await workload.finish(cluster.bootstrap)
        finally:
            three_brokers.kill_brokers()  # before the file systems are unmounted


async def test_leader_disk_full_then_space_freed(three_brokers, tmp_path):
    """The leader of partition 0 runs out of space: its producers are told so, each failed
    send saying whether it may have been stored, and nothing acknowledged is lost; once
    space is freed, writes to it succeed again and its followers are back in sync."""
    disks = {n: tmp_path / f"disk{n}" for n in NODES}
    with contextlib.ExitStack() as mounts:
        for d in disks.values():
            mounts.enter_context(tmpfs(d, "24m"))
        try:
            cluster = await three_brokers.start(data_dirs={n: d / "data" for n, d in disks.items()})
            parts = await cluster.create_topic(TOPIC, config={"segment.bytes": "1048576"})
            victim = parts[0].leader
            workload = await Workload(
                cluster.bootstrap, TOPIC, [0, 1, 2], delivery_timeout_ms=3000, value_size=512
            ).start()
            await workload.progress(300, 20, "before the disk fills")

            ballast = disks[victim] / "ballast"
            free = os.statvfs(disks[victim])
            ballast.write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 512 * 1024))

            def full():
                return [e for v, e in workload.history.failed.items() if "DISK_FULL" in str(e) or
                        isinstance(e, DiskFull)]

            await eventually(full, 30, "sends refused for a full disk")
            await asyncio.sleep(1)  # a while with the disk full
            for value, exc in workload.history.failed.items():
                assert "[not stored]" in str(exc) or "[may have been stored]" in str(exc), (value, exc)
            print(f"{len(full())} sends failed for the full disk, e.g. {full()[0]}")

            ballast.unlink()
            before = sum(1 for p, _ in workload.history.acked.values() if p == 0)

            def resumed():
                return sum(1 for p, _ in workload.history.acked.values() if p == 0) >= before + 100

            await eventually(resumed, 15, f"writes to {TOPIC}-0 after freeing space")
            await cluster.fully_replicated(TOPIC)
            assert cluster.brokers[victim].alive
            await workload.finish(cluster.bootstrap)
        finally:
            three_brokers.kill_brokers()



async def test_torn_tail_on_a_follower(three_brokers):
    """A follower is SIGKILLed and the tails of its active segments are damaged (garbage
    appended to one, bytes cut from another): restarted, it cuts the torn tails, truncates
    to and catches up with its leaders, and rejoins every ISR.  Then it is left alone: as
    the only live replica it leads every partition, and its logs hold every acknowledged
    message."""
    cluster = await three_brokers.start()
    parts = await cluster.create_topic(TOPIC)
    workload = await Workload(cluster.bootstrap, TOPIC, [0, 1, 2]).start()
    await workload.progress(500, 20, "before the kill")
    victim = next(n for n in NODES if n != parts[0].leader)
    cluster.brokers[victim].kill()
    await workload.progress(300, 20, "without the follower")

    logs = cluster.brokers[victim].data_dir / "logs"
    damaged = [p for p in range(3) if p != [q.partition for q in parts if q.leader == victim][0]]
    garbage, cut = (_active_segment(logs, p) for p in damaged)
    with open(garbage, "ab") as f:
        f.write(os.urandom(300))
    os.truncate(cut, cut.stat().st_size - 25)

    await cluster.start_broker(victim)
    await cluster.fully_replicated(TOPIC)
    await workload.progress(300, 20, "with the follower back")
    assert len(re.findall(r"recovered: cut \d+ bytes", cluster.brokers[victim].log())) >= 2
    await workload.finish(cluster.bootstrap)

    for n in NODES:
        if n != victim:
            cluster.brokers[n].kill()
    alone = cluster.address(victim)

    async def leads_all():
        return all(p.leader == victim for p in await cluster.partitions(TOPIC, alone))

    await eventually(leads_all, 15, f"broker {victim} leading every partition alone")
    report = workload.history.check(
        await read_logs(alone, TOPIC), max_acked_copies=MAX_COPIES, max_unsure_copies=MAX_COPIES
    )
    print(f"the repaired replica alone: {report}")


def _active_segment(logs, partition: int):
    return sorted((logs / f"{TOPIC}-{partition}").glob("*.log"))[-1]
