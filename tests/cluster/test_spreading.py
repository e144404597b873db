"""Spreading replicas onto brokers that joined: pure planning (``spread_replicas``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.cluster.assignment import assign_replicas, replica_load, spread_replicas


def apply(assignments, plan):
    return {n: [plan.get(n, {}).get(p, r) for p, r in enumerate(a)] for n, a in assignments.items()}


def test_nothing_moves_when_the_load_is_even():
    assert spread_replicas({"t": [[1, 2], [2, 3], [3, 1]]}, {1, 2, 3}) == {}


def test_a_joined_broker_takes_its_share_and_leaders_stay_where_possible():
    before = {"t": assign_replicas(6, 2, [1, 2, 3])}  # 4 replicas each
    leaders = {"t": [r[0] for r in before["t"]]}
    plan = spread_replicas(before, {1, 2, 3, 4}, leaders=leaders)
    after = apply(before, plan)
    assert replica_load(after.values()) == {1: 3, 2: 3, 3: 3, 4: 3}
    for p, new in plan["t"].items():
        old = before["t"][p]
        assert sum(a != b for a, b in zip(old, new, strict=True)) == 1  # one replica, in place
        assert new[0] == old[0]  # followers moved, not leaders: there were enough of them


def test_leaders_move_when_nothing_else_can():
    # broker 1 leads both partitions and holds nothing else
    plan = spread_replicas({"t": [[1], [1], [1]]}, {1, 2}, leaders={"t": [1, 1, 1]})
    assert sum(len(v) for v in plan.values()) == 1


def test_each_topic_is_spread_and_then_the_whole():
    # every topic is even over {1, 2, 3, 4} (one replica apart), but 1 holds three in all
    before = {"a": [[1], [2], [3]], "b": [[1]], "c": [[1]]}
    after = apply(before, spread_replicas(before, {1, 2, 3, 4}))
    assert replica_load(after.values()) == {1: 2, 2: 1, 3: 1, 4: 1}


def test_dead_kept_and_unnamed_partitions_do_not_move():
    before = {"a": [[1, 2], [1, 2], [1, 3]], "b": [[1, 2], [2, 1]]}
    assert spread_replicas(before, {1, 2, 4}) == {"a": {0: [4, 2], 1: [4, 2]}, "b": {0: [1, 4]}}
    # a-2 names dead broker 3, a-0 is kept, b is not named: only a-1 can move
    assert spread_replicas(before, {1, 2, 4}, topics=["a"], keep=[("a", 0)]) == {"a": {1: [4, 2]}}


@st.composite
def clusters(draw):
    brokers = draw(st.integers(1, 6))
    factor = draw(st.integers(1, brokers))
    topics = {
        f"t{i}": assign_replicas(draw(st.integers(1, 8)), factor, range(draw(st.integers(factor, brokers))))
        for i in range(draw(st.integers(1, 3)))
    }
    joined = draw(st.integers(0, 3))
    return topics, set(range(brokers + joined))


@given(clusters(), st.randoms())
def test_spread_evens_out_the_load_and_keeps_replicas_distinct(cluster, rnd):
    before, live = cluster
    leaders = {n: [rnd.choice(r) for r in a] for n, a in before.items()}
    plan = spread_replicas(before, live, leaders=leaders)
    after = apply(before, plan)
    load = {b: 0 for b in live} | replica_load(after.values())
    assert max(load.values()) - min(load.values()) <= 1
    for name, a in after.items():  # each topic on its own too
        mine = {b: 0 for b in live} | replica_load([a])
        assert max(mine.values()) - min(mine.values()) <= 1, name
    for name, a in after.items():
        for p, replicas in enumerate(a):
            assert len(set(replicas)) == len(replicas) == len(before[name][p])
            if p in plan.get(name, {}):
                assert replicas != before[name][p]
    assert sum(load.values()) == sum(replica_load(before.values()).values())
