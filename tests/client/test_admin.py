"""``Admin``'s cluster surface over the in-memory broker: what goes on the wire for a
replicated topic, leader election and its refusal by an older broker, cluster status."""

from __future__ import annotations

import pytest

from sluice import errors
from sluice.client import Admin, SyncAdmin
from sluice.client.status import BrokerStatus
from sluice.protocol import messages as m

from .fakebroker import FakeBroker


class ElectingBroker(FakeBroker):
    """Answers ELECT_LEADERS with fixed results, and keeps the requests."""

    def __init__(self, results: list[m.ElectionResult], moves: list[m.ReplicaMove] = ()):
        super().__init__({"b": 2, "a": 1})
        self.results = results
        self.moves = list(moves)

    async def handle(self, req, attachments):
        if isinstance(req, m.ElectLeadersRequest):
            self.requests.append(req)
            return m.ElectLeadersResponse(partitions=self.results, moves=self.moves), memoryview(b"")
        return await super().handle(req, attachments)


def admin(broker) -> Admin:
    return Admin("fake:1", connection_factory=broker.factory)


async def test_create_topic_sends_the_replication_factor():
    broker = FakeBroker()
    async with admin(broker) as a:
        await a.create_topic("r", 2, {"retention.ms": 5}, replication_factor=3)
        await a.create_topic("d")
    sent = [t for r in broker.requests if isinstance(r, m.CreateTopicsRequest) for t in r.topics]
    assert sent == [
        m.NewTopic(name="r", partitions=2, config={"retention.ms": "5"}, replication_factor=3),
        m.NewTopic(name="d", partitions=1, replication_factor=0),  # 0: the broker's default
    ]


@pytest.mark.parametrize("bad", ["3", 2.0, True, None])
async def test_create_topic_refuses_a_replication_factor_that_is_not_an_int(bad):
    broker = FakeBroker()
    async with admin(broker) as a:
        with pytest.raises(errors.ConfigError, match="replication_factor must be an int"):
            await a.create_topic("r", replication_factor=bad)
    assert broker.requests == []


async def test_elect_leaders_returns_moves_and_failures_by_partition():
    moved_b1 = m.ElectionResult(topic="b", partition=1, leader=2)
    failed_a0 = m.ElectionResult(topic="a", partition=0, leader=3, error=19, message="preferred replica 1 not in sync")
    broker = ElectingBroker([moved_b1, failed_a0])
    async with admin(broker) as a:
        assert await a.elect_leaders() == [failed_a0, moved_b1]
        await a.elect_leaders(["b", "a", "b"])
    assert [r.topics for r in broker.requests if isinstance(r, m.ElectLeadersRequest)] == [None, ["a", "b"]]


async def test_rebalance_asks_for_replicas_replaced_and_returns_both_by_partition():
    moved_b1 = m.ElectionResult(topic="b", partition=1, leader=2)
    replaced_b0 = m.ReplicaMove(topic="b", partition=0, old=[3, 1], new=[4, 1])
    replaced_a2 = m.ReplicaMove(topic="a", partition=2, old=[1, 3], new=[1, 4])
    broker = ElectingBroker([moved_b1], [replaced_b0, replaced_a2])
    async with admin(broker) as a:
        done = await a.rebalance()
        await a.rebalance(["a"], reassign=False)
        await a.elect_leaders()
    assert done.moves == [replaced_a2, replaced_b0] and done.elections == [moved_b1]
    sent = [(r.topics, r.reassign) for r in broker.requests if isinstance(r, m.ElectLeadersRequest)]
    assert sent == [(None, True), (["a"], False), (None, False)]


def test_an_older_peer_reads_the_new_request_and_response_fields_as_absent():
    class OldRequest(m.Struct):  # ElectLeadersRequest before ``reassign``
        topics: list[str] | None = None

    old = m.decode(m.encode(m.ElectLeadersRequest(topics=["a"], reassign=True)), OldRequest)
    assert old.topics == ["a"]
    assert m.decode(m.encode(OldRequest(topics=None)), m.ElectLeadersRequest).reassign is False
    # a response from an older broker has no moves
    assert m.decode(m.encode(m.ElectLeadersResponse()), m.ElectLeadersResponse).moves == []


async def test_elect_leaders_on_an_older_broker_says_so():
    broker = FakeBroker({"t": 1})  # answers UNSUPPORTED_VERSION to what it does not know
    async with admin(broker) as a:
        with pytest.raises(errors.UnsupportedVersion, match="does not support leader election") as info:
            await a.elect_leaders()
    assert isinstance(info.value.__cause__, errors.UnsupportedVersion)


def test_sync_admin_cluster_status_and_elect_leaders():
    broker = ElectingBroker([])
    with SyncAdmin("fake:1", connection_factory=broker.factory) as a:
        status = a.cluster_status()
        assert a.elect_leaders(["a"]) == []
        a.create_topic("c", 1, None, 1)
    # the fake's partitions name no replicas: nothing under-replicated, nothing offline
    assert status.brokers == (BrokerStatus(0, "fake:1", True),)
    assert (status.controller, status.under_replicated, status.offline) == (0, (), ())
    assert broker.requests[-1].topics == [m.NewTopic(name="c", partitions=1, replication_factor=1)]
