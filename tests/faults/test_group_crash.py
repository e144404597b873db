"""Acknowledged commits survive ``kill -9`` of the broker (real broker process).

Several groups commit offsets in a tight loop, each commit awaited before the next, while
the broker is killed with SIGKILL.  After a restart, every partition's committed offset is
its last acknowledged commit or the one in flight when the broker died: never older (an
acknowledged commit lost) and never anything else.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from sluice import errors
from sluice.client import Admin
from sluice.client.cluster import Cluster
from sluice.protocol import messages as m

pytestmark = pytest.mark.timeout(120)

GROUPS = [f"crash-{i}" for i in range(6)]
PARTITIONS = 3


async def _committer(cluster: Cluster, group: str, acked: dict, in_flight: dict) -> None:
    """Commit offsets 1, 2, 3, ... to every partition of ``t`` until the broker dies."""
    offset = 0
    while True:
        offset += 1
        in_flight[group] = offset
        req = m.OffsetCommitRequest(
            group=group, offsets=[m.CommitOffset(topic="t", partition=p, offset=offset) for p in range(PARTITIONS)]
        )
        try:
            resp = await cluster.coordinator_request(group, req)
        except errors.SluiceError:
            return  # the broker is gone: this commit's fate is unknown
        assert all(r.error == 0 for r in resp.partitions), resp
        acked[group] = offset


async def _committed(cluster: Cluster, group: str) -> set[int]:
    resp = await cluster.coordinator_request(group, m.OffsetFetchRequest(group=group))
    return {r.offset for r in resp.offsets if r.topic == "t"}


@pytest.mark.parametrize("run", range(2))
async def test_acknowledged_commits_survive_kill_9(broker, run):
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic("t", partitions=PARTITIONS)
    acked: dict[str, int] = {}
    in_flight: dict[str, int] = {}
    cluster = Cluster(broker.bootstrap, request_timeout=10)
    try:
        tasks = [asyncio.ensure_future(_committer(cluster, g, acked, in_flight)) for g in GROUPS]
        while min((acked.get(g, 0) for g in GROUPS), default=0) < 20:
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            await asyncio.sleep(0.01)
        await asyncio.sleep(random.uniform(0, 0.2))
        await asyncio.to_thread(broker.kill)
        await asyncio.gather(*tasks)
    finally:
        await cluster.close()
    broker.start()
    cluster = Cluster(broker.bootstrap, request_timeout=10)
    try:
        for group in GROUPS:
            committed = await _committed(cluster, group)
            assert committed <= {acked[group], in_flight[group]} and len(committed) == 1, (
                f"group {group}: committed {committed}, last acknowledged {acked[group]}, "
                f"in flight {in_flight[group]}"
            )
    finally:
        await cluster.close()
