"""A broker restarted within its session (``kill -9`` and a fast start: its registration is
taken over, the controller sees no change).  A leader must not lead on in the epoch whose
tail it may have lost: it starts a new epoch before any write.  A replica whose partition
files were lost must not stay in the ISR with an empty log: it leaves it until it has caught
up again (else the controller could elect it, and the acknowledged records would be gone)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import pytest
from checker import read_logs
from replicated import eventually

from sluice.client import Admin, Producer
from sluice.harness import freeze
from sluice.storage.checkpoint import read_offsets

pytestmark = pytest.mark.timeout(180)

TOPIC = "kept"
SESSION = ["--session-timeout-ms", "15000"]  # the restart comes well within it


async def _setup(cluster) -> tuple[int, list[int]]:
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, 1, {"min.insync.replicas": "2"}, replication_factor=3)
    parts = await cluster.fully_replicated(TOPIC)
    return parts[0].leader, parts[0].replicas


async def _produce(bootstrap: str, values: list[bytes]) -> None:
    async with Producer(bootstrap, acks="all", linger_ms=1, delivery_timeout_ms=60_000) as producer:
        futs = [await producer.send(TOPIC, v, partition=0) for v in values]
        await asyncio.gather(*futs)


async def test_a_leader_restarted_within_its_session_leads_in_a_new_epoch(three_brokers):
    cluster = await three_brokers.start(extra_args=SESSION)
    leader, _ = await _setup(cluster)
    await _produce(cluster.bootstrap, [b"before-%d" % i for i in range(50)])
    _, epoch = await cluster.leader_of(TOPIC, 0)
    cluster.brokers[leader].kill()
    await cluster.start_broker(leader)

    async def new_epoch():
        now, e = await cluster.leader_of(TOPIC, 0)
        return (now, e) if now >= 0 and e > epoch else None

    # well before the old session could end (15 s): the restart itself starts the epoch
    now, e = await eventually(new_epoch, 8, f"{TOPIC}-0 in an epoch after {epoch}")
    await _produce(cluster.bootstrap, [b"after-%d" % i for i in range(50)])
    values = [r.value for r in (await read_logs(cluster.bootstrap, TOPIC))[0]]
    assert values == [b"before-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(50)]
    assert f"a new leader epoch after {epoch}" in cluster.brokers[leader].log() or now != leader


def _lose_files(part_dir) -> None:
    shutil.rmtree(part_dir)


def _tear_tail(part_dir) -> None:
    """A torn write at the end of the newest segment: recovery cuts it."""
    newest = max(part_dir.glob("*.log"))
    with open(newest, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x64\x00\x00\x01\x00" + b"\xff" * 40)


@pytest.mark.parametrize("damage", [_lose_files, _tear_tail], ids=["lost-files", "torn-tail"])
async def test_a_replica_that_lost_records_leaves_the_isr_until_caught_up(three_brokers, damage):
    cluster = await three_brokers.start(extra_args=SESSION)
    leader, replicas = await _setup(cluster)
    follower = next(r for r in replicas if r != leader)
    third = next(r for r in replicas if r not in (leader, follower))
    await _produce(cluster.bootstrap, [b"v-%d" % i for i in range(100)])
    checkpoint = cluster.brokers[follower].data_dir / "logs" / "replication-offset-checkpoint"
    await eventually(
        lambda: read_offsets(checkpoint).get((TOPIC, 0), 0) >= 100, 20, "the follower's high watermark checkpointed"
    )
    cluster.brokers[follower].kill()
    damage(cluster.brokers[follower].data_dir / "logs" / f"{TOPIC}-0")
    freeze(cluster.brokers[leader].proc.pid, group=True)  # nothing to catch up from
    try:
        await cluster.start_broker(follower)

        async def left():
            [p] = await cluster.partitions(TOPIC, cluster.address(third))
            return follower not in p.isr

        await eventually(left, 8, f"broker {follower} out of the ISR of {TOPIC}-0")
    finally:
        os.killpg(cluster.brokers[leader].proc.pid, signal.SIGCONT)
    await cluster.fully_replicated(TOPIC)  # caught up: it is back
    await _produce(cluster.bootstrap, [b"w-%d" % i for i in range(10)])
    values = [r.value for r in (await read_logs(cluster.bootstrap, TOPIC))[0]]
    assert values == [b"v-%d" % i for i in range(100)] + [b"w-%d" % i for i in range(10)]
