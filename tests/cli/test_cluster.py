"""``sluice cluster status`` and ``rebalance``: rows, JSON shapes and exit statuses."""

from __future__ import annotations

import json

from sluice.cli import cluster
from sluice.client.status import BrokerStatus, ClusterStatus, PartitionStatus
from sluice.protocol import messages as m

SHRUNK = PartitionStatus("orders", 0, 1, (1, 2, 3), (1, 3), 4)
OFFLINE = PartitionStatus("audit", 2, -1, (2,), (), 7)


def status(under=(), offline=(), controller=1, store_error="") -> ClusterStatus:
    return ClusterStatus(
        brokers=(BrokerStatus(1, "h1:7401", True), BrokerStatus(2, "", False)),
        controller=controller,
        under_replicated=tuple(under),
        offline=tuple(offline),
        store_error=store_error,
    )


def test_exit_status_offline_before_under_replicated():
    assert cluster.exit_status(status()) == cluster.HEALTHY == 0
    assert cluster.exit_status(status(under=[SHRUNK])) == cluster.UNDER_REPLICATED == 3
    assert cluster.exit_status(status(under=[SHRUNK, OFFLINE], offline=[OFFLINE])) == cluster.OFFLINE == 4


def test_an_unreachable_metadata_store_is_not_healthy():
    """A broker that cannot reach etcd answers from what it last saw: not a healthy cluster."""
    down = status(under=[SHRUNK], store_error="etcd did not answer (for 7 s; ...)")
    assert not down.healthy
    assert cluster.exit_status(down) == cluster.STORE_UNREACHABLE == 5
    assert cluster.exit_status(status(offline=[OFFLINE], store_error="x")) == cluster.OFFLINE
    assert cluster.status_json(down)["store_error"] == "etcd did not answer (for 7 s; ...)"
    assert cluster.summary(down).splitlines() == [
        "NOT healthy: 1 of 2 brokers alive, controller 1, 1 under-replicated, 0 offline partitions",
        "metadata store unreachable: etcd did not answer (for 7 s; ...)",
    ]
    response = m.MetadataResponse(brokers=[m.BrokerInfo(node_id=1, host="h", port=1)], controller_id=1,
                                  store_error="etcd did not answer")
    assert ClusterStatus.from_metadata(response).store_error == "etcd did not answer"
    assert ClusterStatus.from_metadata(m.MetadataResponse(controller_id=1)).healthy


def test_status_json_shape():
    shown = cluster.status_json(status(under=[SHRUNK], offline=[OFFLINE]))
    assert json.loads(json.dumps(shown)) == {
        "brokers": [{"node_id": 1, "address": "h1:7401", "alive": True, "answers": True, "no_answer": ""},
                    {"node_id": 2, "address": "", "alive": False, "answers": False, "no_answer": ""}],
        "controller": 1,
        "under_replicated": [{"topic": "orders", "partition": 0, "leader": 1, "replicas": [1, 2, 3],
                              "isr": [1, 3], "leader_epoch": 4, "replication_factor": 3}],
        "offline": [{"topic": "audit", "partition": 2, "leader": -1, "replicas": [2], "isr": [],
                     "leader_epoch": 7, "replication_factor": 1}],
        "store_error": "",
        "healthy": False,
    }


def test_status_rows_and_summary():
    s = status(under=[SHRUNK], offline=[OFFLINE])
    assert cluster.broker_rows(s) == [[1, "h1:7401", "yes", "controller"], [2, "-", "NO", ""]]
    assert cluster.partition_rows(s.under_replicated + s.offline) == [
        ["orders", 0, 1, "1,2,3", "1,3", 4],
        ["audit", 2, "none", "2", "-", 7],
    ]
    assert cluster.summary(s) == (
        "NOT healthy: 1 of 2 brokers alive, controller 1, 1 under-replicated, 1 offline partitions"
    )
    assert cluster.summary(status(controller=-1)).startswith("healthy: 1 of 2 brokers alive, controller none,")


def test_election_json_splits_moves_from_failures():
    results = [
        m.ElectionResult(topic="a", partition=0, leader=3, error=19, message="preferred replica 1 is not in sync"),
        m.ElectionResult(topic="b", partition=1, leader=2),
    ]
    assert cluster.election_json(results) == {
        "moved": [{"topic": "b", "partition": 1, "leader": 2}],
        "failed": [{"topic": "a", "partition": 0, "leader": 3, "error": "NOT_LEADER", "code": 19,
                    "message": "preferred replica 1 is not in sync"}],
    }
    assert cluster.election_json([]) == {"moved": [], "failed": []}


def test_moves_json_splits_replacements_from_pending_moves_and_failures():
    moves = [
        m.ReplicaMove(topic="a", partition=0, old=[3, 1], new=[4, 1]),
        m.ReplicaMove(topic="a", partition=1, old=[1, 2], new=[1, 4], pending=True),
        m.ReplicaMove(topic="b", partition=2, old=[3, 2], new=[4, 2], error=23, message="etcd unreachable"),
    ]
    shown = cluster.moves_json(moves)
    assert shown["replaced"] == [{"topic": "a", "partition": 0, "old": [3, 1], "new": [4, 1]}]
    assert shown["moving"] == [{"topic": "a", "partition": 1, "old": [1, 2], "new": [1, 4]}]
    [failed] = shown["not_replaced"]
    assert (failed["topic"], failed["partition"], failed["old"], failed["code"]) == ("b", 2, [3, 2], 23)
    assert (failed["error"], failed["message"]) == ("METADATA_UNAVAILABLE", "etcd unreachable")
    assert cluster.moves_json([]) == {"replaced": [], "moving": [], "not_replaced": []}


def _metadata(replicas: list[int], factor: int, brokers=(1, 2, 3)) -> m.MetadataResponse:
    part = m.PartitionMetadata(partition=0, leader=replicas[0], replicas=replicas, isr=replicas, leader_epoch=1)
    return m.MetadataResponse(
        brokers=[m.BrokerInfo(node_id=n, host="h", port=7400 + n) for n in brokers], controller_id=1,
        topics=[m.TopicMetadata(name="__txn_discarded", partitions=[part], internal=True, replication_factor=factor)],
    )


def test_an_internal_topic_short_of_its_replication_factor_is_under_replicated():
    """``__txn_discarded`` created while broker 2 was down: replicas [1,3] of 3, all in sync."""
    short = ClusterStatus.from_metadata(_metadata([1, 3], 3))
    [p] = short.under_replicated
    assert (p.missing, p.full_factor) == (1, 3)
    assert not short.healthy and cluster.exit_status(short) == cluster.UNDER_REPLICATED
    assert cluster.partition_rows(short.under_replicated) == [["__txn_discarded", 0, 1, "1,3 (of 3)", "1,3", 1]]
    assert cluster.status_json(short)["under_replicated"][0]["replication_factor"] == 3
    assert ClusterStatus.from_metadata(_metadata([1, 3, 2], 3)).healthy
    # a cluster of two brokers has none to add: the factor counts up to the brokers it has
    assert ClusterStatus.from_metadata(_metadata([1, 2], 3, brokers=(1, 2))).healthy
    # an older broker says no factor (0): replicas are all there is to judge
    assert ClusterStatus.from_metadata(_metadata([1, 3], 0)).healthy


def test_a_live_broker_that_does_not_answer_is_not_healthy():
    """Registered (its session has not lapsed) but dead or paused: exit status 6."""
    s = status().with_probes({1: "no answer within 1 s"})
    assert [b.node_id for b in s.silent] == [1]
    assert not s.healthy and cluster.exit_status(s) == cluster.NOT_ANSWERING == 6
    assert cluster.exit_status(status(under=[SHRUNK]).with_probes({1: "x"})) == cluster.NOT_ANSWERING
    assert cluster.exit_status(status(offline=[OFFLINE]).with_probes({1: "x"})) == cluster.OFFLINE
    assert cluster.broker_rows(s)[0] == [1, "h1:7401", "NO ANSWER: no answer within 1 s", "controller"]
    assert cluster.summary(s).startswith("NOT healthy: 1 of 2 brokers alive (1 not answering), controller 1,")
    assert cluster.status_json(s)["brokers"][0] == {
        "node_id": 1, "address": "h1:7401", "alive": True, "answers": False, "no_answer": "no answer within 1 s"}
    assert status().with_probes({}).healthy
