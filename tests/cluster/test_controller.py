"""The controller's decisions and the replica assignment: pure functions, every case."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.cluster.assignment import assign_replicas
from sluice.cluster.controller import decide, move_step, preferred
from sluice.cluster.store import PartitionState, TopicRecord
from sluice.errors import InvalidReplicationFactor


def record(config: dict | None = None) -> TopicRecord:
    return TopicRecord("t", 1, config or {}, replication_factor=3, assignment=[[1, 2, 3]])


def test_a_live_leader_with_a_full_isr_is_left_alone():
    assert decide(record(), 0, PartitionState(1, 4, [1, 2, 3]), {1, 2, 3}) is None


def test_a_dead_follower_leaves_the_isr_in_the_same_epoch():
    assert decide(record(), 0, PartitionState(1, 4, [1, 2, 3]), {1, 3}) == PartitionState(1, 4, [1, 3])


def test_a_dead_leader_is_replaced_by_the_first_live_in_sync_replica_in_a_new_epoch():
    assert decide(record(), 0, PartitionState(1, 4, [1, 2, 3]), {2, 3}) == PartitionState(2, 5, [2, 3])
    # assignment order, among the in-sync ones: 2 is alive but out of sync
    assert decide(record(), 0, PartitionState(1, 4, [1, 3]), {2, 3}) == PartitionState(3, 5, [3])


def test_no_live_in_sync_replica_takes_the_partition_offline_keeping_the_isr():
    offline = decide(record(), 0, PartitionState(1, 4, [1]), {2, 3})
    assert offline == PartitionState(-1, 5, [1])
    assert decide(record(), 0, offline, {2, 3}) is None  # stays offline, no epoch churn
    assert decide(record(), 0, offline, {1, 2}) == PartitionState(1, 6, [1])  # the last in-sync returns


def test_unclean_election_is_a_per_topic_switch():
    unclean = record({"unclean.leader.election.enable": "true"})
    assert decide(unclean, 0, PartitionState(1, 4, [1]), {2, 3}) == PartitionState(2, 5, [2])
    assert decide(unclean, 0, PartitionState(1, 4, [1]), set()) == PartitionState(-1, 5, [1])


def test_preferred_leader_comes_back_only_when_alive_and_in_sync():
    moved = PartitionState(2, 5, [2, 3, 1])
    assert preferred(record(), 0, moved, {1, 2, 3}) == PartitionState(1, 6, [2, 3, 1])
    assert preferred(record(), 0, PartitionState(2, 5, [2, 3]), {1, 2, 3}) is None  # not in sync
    assert preferred(record(), 0, moved, {2, 3}) is None  # not alive
    assert preferred(record(), 0, PartitionState(1, 5, [1, 2]), {1, 2, 3}) is None  # leads already


@given(
    partitions=st.integers(1, 60),
    brokers=st.lists(st.integers(0, 50), min_size=1, max_size=7, unique=True),
    data=st.data(),
)
def test_assignment_spreads_replicas_and_leaders(partitions, brokers, data):
    factor = data.draw(st.integers(1, len(brokers)))
    out = assign_replicas(partitions, factor, brokers)
    assert len(out) == partitions
    assert all(len(r) == factor == len(set(r)) and set(r) <= set(brokers) for r in out)
    leaders = Counter(r[0] for r in out)
    held = Counter(b for r in out for b in r)
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in brokers) <= 1
    assert max(held.values()) - min(held.get(b, 0) for b in brokers) <= 1


def test_assignment_fills_the_least_loaded_brokers_first():
    assert assign_replicas(1, 2, [1, 2, 3], {1: 5, 2: 0, 3: 1}) == [[2, 3]]


def test_assignment_needs_enough_brokers():
    with pytest.raises(InvalidReplicationFactor):
        assign_replicas(1, 4, [1, 2, 3])
    with pytest.raises(InvalidReplicationFactor):
        assign_replicas(1, 0, [1])


def moving() -> TopicRecord:  # 3 leaves partition 0 for 4: 4 was added, 3 still listed
    return TopicRecord("t", 1, replication_factor=2, assignment=[[1, 4, 3]], moving={0: [3]})


def test_a_pending_move_waits_until_the_kept_replicas_are_in_sync():
    assert move_step(moving(), 0, PartitionState(1, 2, [1, 3]), {1, 3, 4}) is False
    assert move_step(moving(), 0, PartitionState(1, 2, [1, 3, 4]), {1, 3, 4}) is True


def test_a_leaving_leader_hands_over_to_a_kept_in_sync_replica_first():
    assert move_step(moving(), 0, PartitionState(3, 2, [1, 3, 4]), {1, 3, 4}) == PartitionState(1, 3, [1, 3, 4])
    assert move_step(moving(), 0, PartitionState(3, 2, [1, 3, 4]), {3, 4}) == PartitionState(4, 3, [1, 3, 4])
    assert move_step(moving(), 0, PartitionState(3, 2, [1, 3, 4]), {3}) is False
