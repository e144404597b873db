"""``ClusterStatus.from_metadata``: liveness, controller, under-replicated and offline
partitions, from metadata responses written out by hand."""

from __future__ import annotations

from sluice.client.status import BrokerStatus, ClusterStatus, PartitionStatus
from sluice.protocol import messages as m


def meta(brokers, topics, controller=1):
    return m.MetadataResponse(
        brokers=[m.BrokerInfo(node_id=n, host=h, port=p) for n, h, p in brokers],
        controller_id=controller,
        topics=topics,
    )


def topic(name, *partitions, error=0):
    return m.TopicMetadata(
        name=name,
        error=error,
        partitions=[
            m.PartitionMetadata(partition=i, leader=leader, replicas=replicas, isr=isr, leader_epoch=epoch)
            for i, (leader, replicas, isr, epoch) in enumerate(partitions)
        ],
    )


def test_one_broker_with_everything_in_sync_is_healthy():
    status = ClusterStatus.from_metadata(
        meta([(0, "127.0.0.1", 7400)], [topic("t", (0, [0], [0], 0), (0, [0], [0], 0))], controller=0)
    )
    assert status == ClusterStatus(
        brokers=(BrokerStatus(0, "127.0.0.1:7400", True),), controller=0, under_replicated=(), offline=()
    )
    assert status.healthy


def test_a_replica_missing_from_the_live_brokers_is_shown_dead():
    status = ClusterStatus.from_metadata(
        meta(
            [(1, "h1", 7401), (3, "h3", 7403)],
            [
                topic("orders", (1, [1, 2, 3], [1, 3], 4), (3, [2, 3, 1], [3, 1], 2)),
                topic("audit", (-1, [2], [2], 7), (3, [3, 1], [3, 1], 1)),
            ],
        )
    )
    assert status.brokers == (
        BrokerStatus(1, "h1:7401", True),
        BrokerStatus(2, "", False),
        BrokerStatus(3, "h3:7403", True),
    )
    assert status.controller == 1
    assert status.under_replicated == (
        PartitionStatus("orders", 0, 1, (1, 2, 3), (1, 3), 4),
        PartitionStatus("orders", 1, 3, (2, 3, 1), (3, 1), 2),
    )
    # offline but the ISR still names its last member (as Kafka keeps it): not under-replicated
    assert status.offline == (PartitionStatus("audit", 0, -1, (2,), (2,), 7),)
    assert not status.healthy


def test_offline_and_shrunk_is_listed_twice():
    status = ClusterStatus.from_metadata(meta([(1, "h", 1)], [topic("t", (-1, [2, 1], [], 3))]))
    [p] = status.offline
    assert status.under_replicated == (p,) and p.offline and p.under_replicated


def test_topics_answered_with_an_error_are_left_out_and_no_controller_is_minus_one():
    status = ClusterStatus.from_metadata(
        meta([(1, "::1", 9)], [topic("gone", (-1, [5], [], 0), error=4)], controller=-1)
    )
    assert status.brokers == (BrokerStatus(1, "[::1]:9", True),)
    assert status.controller == -1 and status.healthy
