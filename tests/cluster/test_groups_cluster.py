"""Consumer groups in a cluster (real etcd and brokers): a group's log state and lag come
from each partition's leader, whichever broker coordinates the group."""

from __future__ import annotations

import pytest
from cluster_helpers import eventually

from sluice.client import Admin, Producer
from sluice.client.cluster import Cluster
from sluice.errors import SluiceError
from sluice.protocol.coordinator import GROUPS_TOPIC, group_partition

pytestmark = pytest.mark.timeout(120)


def cluster_args(etcd, cluster_name: str, node_id: int) -> list[str]:
    return ["--cluster", etcd.url(cluster_name), "--node-id", str(node_id), "--session-timeout-ms", "1000"]


async def leaders(bootstrap: str, topic: str) -> list[int]:
    cluster = Cluster(bootstrap, connect_timeout=2, request_timeout=5)
    try:
        await cluster.refresh([topic])
        info = cluster.topic(topic)
        return [] if info is None else list(info.leaders)
    finally:
        await cluster.close()


async def test_group_lag_comes_from_each_partitions_leader(etcd, cluster_name, broker_factory):
    # Two brokers, one replica per partition: the group's coordinator holds no replica of
    # one of the two partitions, and must not show that one's log state as unknown.
    brokers = {n: broker_factory(extra_args=cluster_args(etcd, cluster_name, n)).start() for n in (1, 2)}
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    async with Admin(bootstrap, request_timeout_ms=5000) as admin:
        await admin.create_topic("gl", 2, replication_factor=1)
        led = await eventually(lambda: _all_led(bootstrap, "gl"), 10, "a leader for every partition of gl")
        assert sorted(led) == [1, 2]  # spread: one partition on each broker
        async with Producer(bootstrap, linger_ms=0) as producer:
            for p in (0, 1):
                for i in range(10):
                    await producer.send("gl", b"%d" % i, partition=p)
            await producer.flush()
        # __groups waits a while for more brokers before a 2-broker cluster creates it
        await eventually(lambda: _reset(admin), 30, "a group coordinator")

        desc = await admin.describe_group("lagg")
        assert [(p.partition, p.committed_offset, p.log_start_offset, p.high_watermark, p.lag)
                for p in desc.partitions] == [(0, 0, 0, 10, 10), (1, 0, 0, 10, 10)]
        [listing] = await admin.list_groups()
        assert (listing.name, listing.partitions, listing.lag, listing.lag_unknown) == ("lagg", 2, 20, 0)

        # the broker leading the partition that the coordinator holds no replica of dies:
        # that partition's log state is unknown now (-1), the other one's is not
        groups_leaders = await eventually(lambda: _all_led(bootstrap, GROUPS_TOPIC), 10, "__groups leaders")
        coordinator = groups_leaders[group_partition("lagg", len(groups_leaders))]
        [other] = [n for n in brokers if n != coordinator]
        gone = led.index(other)
        brokers[other].kill()
        desc = await admin.describe_group("lagg")
        by_partition = {p.partition: (p.committed_offset, p.log_start_offset, p.high_watermark, p.lag)
                        for p in desc.partitions}
        assert by_partition == {gone: (0, -1, -1, -1), 1 - gone: (0, 0, 10, 10)}

    # list_groups asks every live broker: once the dead one's registration lapsed
    async def listed():
        try:
            async with Admin(brokers[coordinator].bootstrap, request_timeout_ms=5000) as fresh:
                return await fresh.list_groups()
        except SluiceError:
            return None

    [listing] = await eventually(listed, 10, "groups listed without the dead broker")
    assert (listing.name, listing.partitions, listing.lag, listing.lag_unknown) == ("lagg", 2, 10, 1)


async def _all_led(bootstrap: str, topic: str) -> list[int] | None:
    found = await leaders(bootstrap, topic)
    return found if found and all(n >= 0 for n in found) else None


async def _reset(admin: Admin) -> bool:
    try:
        await admin.reset_group_offsets("lagg", "gl", to="earliest")
    except SluiceError:
        return False
    return True
