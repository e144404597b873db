"""The ``MetadataStore`` contract, run against both implementations (``store_factory`` is
parametrized: the embedded store on a data directory, and etcd as a real process)."""

from __future__ import annotations

import asyncio

import pytest

from sluice.cluster.store import (
    BrokerRegistration,
    PartitionChange,
    PartitionState,
    TopicRecord,
    initial_states,
)
from sluice.errors import (
    InvalidPartitions,
    InvalidRequest,
    NodeIdInUse,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
)

NODE = 0


def record(name: str, partitions: int = 2, **config: str) -> TopicRecord:
    return TopicRecord(name, partitions, dict(config), assignment=[[NODE] for _ in range(partitions)])


async def create(store, name: str, partitions: int = 2, **config: str) -> TopicRecord:
    r = record(name, partitions, **config)
    await store.create_topic(r, initial_states(r))
    return r


async def test_topics_create_list_delete(store_factory):
    store = await store_factory()
    assert await store.topics() == {}
    orders = await create(store, "orders", 3, **{"retention.ms": "1000"})
    await create(store, "__internal", 1)
    assert set(await store.topics()) == {"orders", "__internal"}
    assert (await store.topics())["orders"] == orders
    states = await store.partition_states("orders")
    assert [(s.leader, s.leader_epoch, s.isr) for s in states] == [(NODE, 0, [NODE])] * 3

    await store.delete_topic("orders")
    assert set(await store.topics()) == {"__internal"}
    with pytest.raises(UnknownTopic):
        await store.partition_states("orders")
    with pytest.raises(UnknownTopic):
        await store.delete_topic("orders")

    reopened = await store_factory()  # a restart (embedded) or another broker (etcd)
    assert set(await reopened.topics()) == {"__internal"}


async def test_duplicate_topic_is_refused_and_keeps_the_first(store_factory):
    store = await store_factory()
    first = await create(store, "t", 2)
    with pytest.raises(TopicAlreadyExists):
        await create(store, "t", 5)
    assert (await store.topics())["t"] == first
    assert len(await store.partition_states("t")) == 2


async def test_records_and_states_must_agree(store_factory):
    store = await store_factory()
    r = record("t", 2)
    with pytest.raises(InvalidRequest):
        await store.create_topic(r, initial_states(r)[:1])
    with pytest.raises(InvalidPartitions):
        await store.create_topic(TopicRecord("t", 3, assignment=[[NODE]]), [])
    with pytest.raises(InvalidRequest):
        await store.create_topic(TopicRecord("t", 1, replication_factor=2, assignment=[[NODE, NODE]]), [])
    assert await store.topics() == {}


async def test_update_topic_config_and_add_partitions(store_factory):
    store = await store_factory()
    r = await create(store, "t", 2)
    before = await store.partition_states("t")

    changed = TopicRecord("t", 2, {"retention.ms": "5"}, assignment=r.assignment)
    await store.update_topic(changed)
    assert (await store.topics())["t"].config == {"retention.ms": "5"}

    grown = TopicRecord("t", 4, changed.config, assignment=[[NODE]] * 4)
    await store.update_topic(grown, initial_states(grown)[2:])
    states = await store.partition_states("t")
    assert len(states) == 4 and states[:2] == before
    assert (await store.topics())["t"] == grown

    with pytest.raises(InvalidPartitions):  # partitions never shrink
        await store.update_topic(r)
    with pytest.raises(InvalidRequest):  # one state per added partition
        five = TopicRecord("t", 5, assignment=[[NODE]] * 5)
        await store.update_topic(five, [])
    with pytest.raises(UnknownTopic):
        await store.update_topic(record("nope"), [])
    assert (await store.topics())["t"] == grown


async def test_cas_succeeds_on_the_current_version_only(store_factory):
    store = await store_factory()
    await create(store, "t", 2)
    s0 = (await store.partition_states("t"))[1]
    bumped = PartitionState(NODE, s0.leader_epoch + 1, [NODE])
    assert await store.cas_partition_state("t", 1, s0.version, bumped)
    s1 = (await store.partition_states("t"))[1]
    assert (s1.leader_epoch, s1.isr) == (1, [NODE]) and s1.version != s0.version

    # a writer that read s0 loses: nothing written
    assert not await store.cas_partition_state("t", 1, s0.version, PartitionState(NODE, 7, [NODE]))
    assert (await store.partition_states("t"))[1] == s1
    # partition 0 untouched
    assert (await store.partition_states("t"))[0].leader_epoch == 0

    with pytest.raises(UnknownPartition):
        await store.cas_partition_state("t", 2, s1.version, bumped)
    with pytest.raises(UnknownTopic):
        await store.cas_partition_state("nope", 0, s1.version, bumped)


async def test_versions_are_not_reused_by_a_recreated_topic(store_factory):
    store = await store_factory()
    await create(store, "t", 1)
    old = (await store.partition_states("t"))[0]
    await store.delete_topic("t")
    await create(store, "t", 1)
    new = (await store.partition_states("t"))[0]
    assert new.version != old.version
    assert not await store.cas_partition_state("t", 0, old.version, PartitionState(NODE, 5, [NODE]))


async def test_producer_id_blocks_never_overlap(store_factory):
    a = await store_factory()
    blocks = [await a.allocate_producer_ids(10), await a.allocate_producer_ids(1)]
    if store_factory.kind == "etcd":
        b = await store_factory()  # another broker, allocating concurrently
        blocks += await asyncio.gather(*(s.allocate_producer_ids(100) for s in (a, b, a, b)))
    else:
        await a.close()
        b = await store_factory()  # the same data directory after a restart
        blocks += [await b.allocate_producer_ids(100), await b.allocate_producer_ids(100)]
    ids = [i for first, last in blocks for i in range(first, last + 1)]
    assert len(ids) == len(set(ids)) == 10 + 1 + 100 * (len(blocks) - 2)
    assert all(last - first + 1 in (1, 10, 100) for first, last in blocks)
    with pytest.raises(InvalidRequest):
        await b.allocate_producer_ids(0)


async def test_watch_partition_states_follows_changes(store_factory):
    store = await store_factory()
    await create(store, "before", 1)
    seen: asyncio.Queue[PartitionChange] = asyncio.Queue()

    async def follow():
        async for change in store.watch_partition_states():
            seen.put_nowait(change)

    task = asyncio.create_task(follow())
    try:
        first = await asyncio.wait_for(seen.get(), 10)  # the current state first
        assert (first.topic, first.partition, first.state.leader) == ("before", 0, NODE)

        await create(store, "t", 2)
        created = [await asyncio.wait_for(seen.get(), 10) for _ in range(2)]
        assert sorted((c.topic, c.partition) for c in created) == [("t", 0), ("t", 1)]

        current = (await store.partition_states("t"))[0]
        assert await store.cas_partition_state("t", 0, current.version, PartitionState(NODE, 3, [NODE]))
        changed = await asyncio.wait_for(seen.get(), 10)
        assert (changed.topic, changed.partition, changed.state.leader_epoch) == ("t", 0, 3)
        assert changed.state == (await store.partition_states("t"))[0]

        await store.delete_topic("t")
        gone = [await asyncio.wait_for(seen.get(), 10) for _ in range(2)]
        assert sorted((c.topic, c.partition, c.state) for c in gone) == [("t", 0, None), ("t", 1, None)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_register_broker_and_refuse_a_duplicate_node_id(store_factory):
    store = await store_factory()
    reg = BrokerRegistration(NODE, "127.0.0.1", 7400)
    await store.register_broker(reg)
    assert await store.brokers() == [reg]
    await store.register_broker(reg)  # the same registration again: fine
    other = store if store_factory.kind == "embedded" else await store_factory()
    with pytest.raises(NodeIdInUse, match="7400"):
        await other.register_broker(BrokerRegistration(NODE, "127.0.0.1", 7401))
    assert await other.brokers() == [reg]


async def test_watch_brokers_sees_registrations(store_factory):
    store = await store_factory()
    seen: asyncio.Queue = asyncio.Queue()

    async def follow():
        async for live in store.watch_brokers():
            seen.put_nowait(live)

    task = asyncio.create_task(follow())
    try:
        assert await asyncio.wait_for(seen.get(), 10) == []
        reg = BrokerRegistration(NODE, "127.0.0.1", 7400)
        await store.register_broker(reg)
        assert await asyncio.wait_for(seen.get(), 10) == [reg]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_campaign_elects_and_resign_ends_the_term(store_factory):
    store = await store_factory()
    lead = await asyncio.wait_for(store.campaign(NODE), 10)
    assert await store.controller() == NODE
    assert not lead.lost.is_set()
    assert await store.campaign(NODE) is lead  # already the controller
    await store.resign()
    assert lead.lost.is_set()
    assert await store.controller() is None
    again = await asyncio.wait_for(store.campaign(NODE), 10)
    assert again.epoch > lead.epoch
    await store.close()
    assert again.lost.is_set()


async def test_watches_end_when_the_store_closes(store_factory):
    store = await store_factory()
    await create(store, "t", 1)
    started: asyncio.Queue = asyncio.Queue()

    async def drain(it):
        async for _ in it:
            started.put_nowait(True)
        return "ended"

    tasks = [asyncio.create_task(drain(store.watch_brokers())),
             asyncio.create_task(drain(store.watch_partition_states()))]
    for _ in tasks:  # both yield the current state first
        await asyncio.wait_for(started.get(), 10)
    await store.close()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == ["ended", "ended"]


async def test_reassign_rewrites_the_touched_states_and_checks_the_lists(store_factory):
    store = await store_factory()
    r = await create(store, "t", 2)
    before = await store.partition_states("t")
    seen: asyncio.Queue[PartitionChange] = asyncio.Queue()

    async def follow():
        async for change in store.watch_partition_states():
            seen.put_nowait(change)

    task = asyncio.create_task(follow())
    try:
        for _ in range(2):  # the current states first
            await asyncio.wait_for(seen.get(), 10)
        await store.reassign("t", {1: [NODE]})  # the only list one node can hold
        change = await asyncio.wait_for(seen.get(), 10)  # its watchers wake
        assert (change.topic, change.partition) == ("t", 1)
    finally:
        task.cancel()
    after = await store.partition_states("t")
    assert after[0] == before[0]
    assert (after[1].leader, after[1].leader_epoch, after[1].isr) == (NODE, 0, [NODE])
    assert after[1].version != before[1].version
    assert (await store.topics())["t"] == r

    with pytest.raises(UnknownTopic):
        await store.reassign("nope", {0: [NODE]})
    with pytest.raises(UnknownPartition):
        await store.reassign("t", {2: [NODE]})
    for bad in ([], [NODE, NODE], [NODE, NODE + 1], [-1]):  # factor 1, distinct ids
        with pytest.raises(InvalidRequest):
            await store.reassign("t", {0: bad})
    assert (await store.topics())["t"] == r
    assert (await store.partition_states("t"))[1] == after[1]


async def test_pending_moves_are_checked_kept_and_cleared(store_factory):
    store = await store_factory()
    await create(store, "t", 2)
    for assignments, moving in (
        ({0: [NODE, NODE + 1]}, {}),  # one replica too many without a pending move
        ({0: [NODE, NODE + 1]}, {0: [NODE + 2]}),  # dropping a replica not listed
        ({0: [NODE, NODE + 1]}, {1: [NODE]}),  # a pending move of a partition not reassigned
        ({0: [NODE]}, {0: [NODE]}),  # dropping every replica
    ):
        with pytest.raises(InvalidRequest):
            await store.reassign("t", assignments, moving)
    assert (await store.topics())["t"].moving == {}
    if store_factory.kind == "embedded":
        return  # one node: a pending move (two nodes at least) is refused, none ever kept
    before = await store.partition_states("t")
    await store.reassign("t", {1: [NODE, NODE + 1]}, {1: [NODE]})  # add NODE + 1; NODE leaves later
    moved = (await store.topics())["t"]
    assert (moved.assignment, moved.moving, moved.target(1)) == ([[NODE], [NODE, NODE + 1]], {1: [NODE]}, [NODE + 1])
    assert (await store.partition_states("t"))[1].isr == before[1].isr  # the new one is not in sync yet
    assert (await (await store_factory()).topics())["t"] == moved  # kept: another broker sees it
    await store.reassign("t", {0: [NODE]})  # other partitions keep their pending moves
    assert (await store.topics())["t"].moving == {1: [NODE]}
    await store.reassign("t", {1: [NODE + 1]})  # done: NODE leaves, with the pending move
    done = (await store.topics())["t"]
    assert (done.assignment, done.moving) == ([[NODE], [NODE + 1]], {})
    state = (await store.partition_states("t"))[1]
    assert (state.leader, state.leader_epoch, state.isr) == (-1, before[1].leader_epoch + 1, [])
