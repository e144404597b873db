"""Replacing the replicas of brokers that left: pure planning, every case."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.cluster.assignment import grow_replicas, replace_lost_replicas, replica_load


def test_load_counts_every_replica_of_every_topic():
    assert replica_load([[[1, 2], [2, 3]], [[3, 1]]]) == {1: 2, 2: 2, 3: 2}


def test_nothing_moves_while_every_replica_is_alive():
    assert replace_lost_replicas({"t": [[1, 2], [2, 3]]}, {1, 2, 3}) == {}


def test_a_dead_replica_is_replaced_in_place_by_the_least_loaded_live_broker():
    # broker 3 is gone; 4 holds nothing, 1 and 2 hold two each
    plan = replace_lost_replicas({"t": [[1, 2], [3, 1], [2, 3]]}, {1, 2, 4})
    assert plan == {"t": {1: [4, 1], 2: [2, 4]}}


def test_replacements_count_in_the_load_of_the_next():
    # brokers 4 and 5 are both empty: they take turns; then 2, 4 and 5 hold one each
    # (ties go to the lower id)
    plan = replace_lost_replicas({"a": [[3, 1], [3, 2]], "b": [[1, 3]]}, {1, 2, 4, 5})
    assert plan == {"a": {0: [4, 1], 1: [5, 2]}, "b": {0: [1, 2]}}


def test_a_broker_already_in_the_list_is_never_chosen():
    plan = replace_lost_replicas({"t": [[9, 1, 2]]}, {1, 2, 3})
    assert plan == {"t": {0: [3, 1, 2]}}


def test_a_dead_replica_stays_when_no_live_broker_can_take_it():
    assert replace_lost_replicas({"t": [[1, 2, 3]]}, {1, 2}) == {}
    # one of two dead replicas can be replaced: that one is
    assert replace_lost_replicas({"t": [[1, 7, 8]]}, {1, 2}) == {"t": {0: [1, 2, 8]}}


def test_several_dead_brokers_in_one_list():
    plan = replace_lost_replicas({"t": [[7, 8]]}, {1, 2})
    assert plan == {"t": {0: [1, 2]}}


@st.composite
def clusters(draw):
    nodes = draw(st.integers(2, 7))
    factor = draw(st.integers(1, nodes))
    topics = draw(st.dictionaries(
        st.sampled_from("abc"),
        st.lists(st.permutations(range(nodes)).map(lambda p: p[:factor]), min_size=1, max_size=6),
        min_size=1,
    ))
    live = draw(st.sets(st.integers(0, nodes + 2), min_size=1))
    return topics, live


@given(clusters())
def test_plans_keep_the_factor_distinct_replicas_and_every_live_one(cluster):
    topics, live = cluster
    plan = replace_lost_replicas(topics, live)
    for name, changes in plan.items():
        for p, new in changes.items():
            old = topics[name][p]
            assert len(new) == len(old) and len(set(new)) == len(new)
            assert new != list(old)
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                assert a == b if a in live else (b == a or b in live), (old, new, i)
    for name, assignment in topics.items():
        for p, old in enumerate(assignment):
            new = plan.get(name, {}).get(p, list(old))
            spare = set(live) - set(new)
            assert all(r in live for r in new) or not spare  # replaced as far as brokers allow


def test_only_the_named_topics_move_but_all_count_in_the_load():
    assignments = {"a": [[3, 1]], "b": [[2, 4], [2, 4], [3, 4]]}  # b loads 2 and 4, and lost 3 too
    assert replace_lost_replicas(assignments, {1, 2, 4, 5}, topics=["a", "nope"]) == {"a": {0: [5, 1]}}


def test_kept_partitions_do_not_move():
    plan = replace_lost_replicas({"t": [[3, 1], [3, 2]]}, {1, 2, 4}, keep={("t", 0)})
    assert plan == {"t": {1: [4, 2]}}


def test_a_short_topic_grows_onto_the_least_loaded_live_brokers_old_replicas_first():
    # __txn_discarded was created while broker 2 was down: [1, 3], meant to have 3
    plan = grow_replicas({"__txn_discarded": [[1, 3]], "__groups": [[1, 2, 3]] * 3}, {"__txn_discarded": 3}, {1, 2, 3})
    assert plan == {"__txn_discarded": {0: [1, 3, 2]}}


def test_nothing_grows_without_a_live_broker_to_hold_the_replica():
    assert grow_replicas({"t": [[1, 3]]}, {"t": 3}, {1, 3}) == {}
    assert grow_replicas({"t": [[1, 3]]}, {"t": 2}, {1, 2, 3}) == {}  # at its factor already
    assert grow_replicas({"t": [[1, 3]]}, {"t": 3}, {1, 2, 3}, keep={"t"}) == {}


def test_every_partition_grows_to_one_factor_as_far_as_the_live_brokers_allow():
    # one replica each, meant to have 3, brokers 1, 2 and 4 alive (3 is dead): partition 1
    # holds dead broker 3, so it can reach only 3 with both 2 and 4; both grow to 3
    plan = grow_replicas({"t": [[1], [3]]}, {"t": 3}, {1, 2, 4})
    assert plan == {"t": {0: [1, 2, 4], 1: [3, 1, 2]}}
    # with only brokers 1 and 2 alive, partition 1 ([3]) reaches 3 and partition 0 ([1]) 2:
    # the factor is one for the topic, so both grow to 2
    assert grow_replicas({"t": [[1], [3]]}, {"t": 3}, {1, 2}) == {"t": {0: [1, 2], 1: [3, 1]}}


def test_added_replicas_count_in_the_load_of_the_next():
    plan = grow_replicas({"a": [[1], [1]], "b": [[2, 3]]}, {"a": 2}, {1, 2, 3, 4})
    assert plan == {"a": {0: [1, 4], 1: [1, 2]}}


@given(
    lists=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=3, unique=True), min_size=1, max_size=6)
    .filter(lambda ls: len({len(r) for r in ls}) == 1),
    wanted=st.integers(1, 6),
    live=st.sets(st.integers(1, 6), min_size=1),
)
def test_growth_keeps_each_list_a_prefix_adds_live_distinct_brokers_and_one_factor(lists, wanted, live):
    plan = grow_replicas({"t": lists}, {"t": wanted}, live)
    if not plan:
        return
    grown = plan["t"]
    assert sorted(grown) == list(range(len(lists)))
    factors = {len(r) for r in grown.values()}
    assert len(factors) == 1 and len(lists[0]) < factors.pop() <= wanted
    for p, new in grown.items():
        assert new[: len(lists[p])] == lists[p] and len(set(new)) == len(new)
        assert set(new[len(lists[p]):]) <= live
