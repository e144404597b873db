"""What only the etcd store has: leases that lapse with their process, elections between
stores, and etcd going away and coming back."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from cluster_helpers import REQUEST_MS, SESSION_MS, answered, eventually, free_ports, hold_session

from sluice.cluster.etcd import EtcdStore
from sluice.cluster.store import BrokerRegistration, PartitionState, TopicRecord, initial_states
from sluice.config import parse_cluster_url
from sluice.errors import ConfigError, InvalidRequest, MetadataUnavailable

# a lapsed 1 s lease: etcd checks expiry about every 0.5 s; the rest is slack for a busy machine
LAPSE_S = 10


@pytest.fixture
async def stores(etcd, cluster_name):
    """``open()`` -> a started store on this test's cluster; all closed at the end."""
    opened: list[EtcdStore] = []

    async def open_(url: str | None = None, **kw) -> EtcdStore:
        kw = {"session_timeout_ms": SESSION_MS, "request_timeout_ms": REQUEST_MS, **kw}
        store = EtcdStore(url or etcd.url(cluster_name), **kw)
        opened.append(store)
        await store.start()
        return store

    yield open_
    for store in opened:
        await store.close()


def test_cluster_url_parsing():
    assert parse_cluster_url("etcd://127.0.0.1:2379") == ([("127.0.0.1", 2379)], "default")
    assert parse_cluster_url("etcd://a:1,b.example:2/prod") == ([("a", 1), ("b.example", 2)], "prod")
    assert parse_cluster_url("etcd://[::1]:2379/x") == ([("[::1]", 2379)], "x")
    for bad in ("http://a:1", "etcd://a", "etcd://a:0", "etcd://a:1/b/c", "etcd://:1", "etcd://a:x"):
        with pytest.raises(ConfigError, match="etcd://HOST:PORT"):
            parse_cluster_url(bad)
    with pytest.raises(ConfigError, match="1000 ms"):
        EtcdStore("etcd://a:1", session_timeout_ms=999)


async def test_registration_lapses_when_its_process_dies(etcd, cluster_name, stores):
    url = etcd.url(cluster_name)
    holder = hold_session(url, 5, 7405)
    try:
        store = await stores()
        assert await store.brokers() == [BrokerRegistration(5, "127.0.0.1", 7405)]
        holder.kill()  # no revoke: the lease has to expire
        holder.wait(10)
        killed = time.monotonic()
        await eventually(answered(store.brokers, lambda live: live == []), LAPSE_S, "the lease lapsing")
        assert time.monotonic() - killed >= 0.5  # it lapsed, it was not revoked
    finally:
        holder.kill()
        holder.wait(10)


async def test_close_ends_the_registration_at_once(stores):
    a, b = await stores(), await stores()
    await a.register_broker(BrokerRegistration(1, "127.0.0.1", 7401))
    assert [r.node_id for r in await b.brokers()] == [1]
    await a.close()
    assert await b.brokers() == []
    await b.register_broker(BrokerRegistration(1, "127.0.0.1", 7402))  # the id is free again


async def test_a_restarted_broker_takes_its_registration_over(stores):
    reg = BrokerRegistration(1, "127.0.0.1", 7401)
    await (await stores()).register_broker(reg)  # its lease lives on: kept alive
    again = await stores()
    await again.register_broker(reg)  # the same address: the same broker restarted
    assert await again.brokers() == [reg]


async def test_one_controller_then_the_other_after_resigning(stores):
    a, b = await stores(), await stores()
    campaigns = {asyncio.create_task(a.campaign(1)): a, asyncio.create_task(b.campaign(2)): b}
    done, pending = await asyncio.wait(campaigns, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and len(pending) == 1
    [won], [waiting] = done, pending
    first, winner = won.result(), campaigns[won]
    assert await a.controller() == first.node_id
    assert not waiting.done()  # still waiting: one controller at a time

    await winner.resign()
    assert first.lost.is_set()
    second = await asyncio.wait_for(waiting, 10)
    assert second.node_id != first.node_id and second.epoch > first.epoch
    assert await winner.controller() == second.node_id


async def test_the_controller_changes_when_its_lease_lapses(etcd, cluster_name, stores):
    holder = hold_session(etcd.url(cluster_name), 7, 7407, campaign=True)
    try:
        store = await stores()
        assert await store.controller() == 7
        campaign = asyncio.create_task(store.campaign(8))
        holder.kill()
        holder.wait(10)
        lead = await asyncio.wait_for(campaign, LAPSE_S)
        assert lead.node_id == 8 and await store.controller() == 8
    finally:
        holder.kill()
        holder.wait(10)


async def test_start_without_etcd_fails_clearly():
    [port] = free_ports(1)
    store = EtcdStore(f"etcd://127.0.0.1:{port}/x", session_timeout_ms=1000, request_timeout_ms=500)
    t0 = time.monotonic()
    with pytest.raises(MetadataUnavailable, match=f"127.0.0.1:{port}") as info:
        await store.start()
    assert info.value.retriable and time.monotonic() - t0 < 5
    await store.close()


async def test_a_dead_endpoint_is_skipped(etcd, cluster_name, stores):
    [dead] = free_ports(1)
    store = await stores(f"etcd://127.0.0.1:{dead},127.0.0.1:{etcd.client_port}/{cluster_name}")
    assert await store.topics() == {}


async def test_calls_time_out_while_etcd_hangs(etcd_factory, cluster_name):
    etcd = etcd_factory()
    store = EtcdStore(etcd.url(cluster_name), session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
    await store.start()
    try:
        etcd.pause()  # SIGSTOP: connections stay open, nothing answers
        t0 = time.monotonic()
        with pytest.raises(MetadataUnavailable, match="did not answer within 1000 ms .a change may still take effect") as info:
            await store.topics()
        assert info.value.retriable
        assert REQUEST_MS / 1000 - 0.1 <= time.monotonic() - t0 < REQUEST_MS / 1000 + 2
        etcd.resume()
        assert await eventually(answered(store.topics), 10, "etcd answering again") == [{}]
    finally:
        etcd.resume()
        await store.close()


async def test_etcd_killed_and_restarted(etcd_factory, cluster_name):
    """Calls fail fast and clearly while etcd is down; the controller learns its term is over
    before another could be elected; everything works again once etcd is back on its data."""
    etcd = etcd_factory()
    store = EtcdStore(etcd.url(cluster_name), session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
    await store.start()
    watcher = EtcdStore(etcd.url(cluster_name), session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
    await watcher.start()
    seen: asyncio.Queue = asyncio.Queue()

    async def follow():
        async for change in watcher.watch_partition_states():
            seen.put_nowait(change)

    follower = asyncio.create_task(follow())
    try:
        reg = BrokerRegistration(1, "127.0.0.1", 7401)
        await store.register_broker(reg)
        r = TopicRecord("t", 1, assignment=[[1]])
        await store.create_topic(r, initial_states(r))
        assert (await asyncio.wait_for(seen.get(), 10)).topic == "t"
        lead = await asyncio.wait_for(store.campaign(1), 10)

        etcd.kill()
        killed = time.monotonic()
        for call in (store.topics(), store.partition_states("t"), store.allocate_producer_ids(1)):
            t0 = time.monotonic()
            with pytest.raises(MetadataUnavailable) as info:
                await call
            assert info.value.retriable and time.monotonic() - t0 < REQUEST_MS / 1000 + 2
            assert "retry when etcd is back" in str(info.value)
        await asyncio.wait_for(lead.lost.wait(), LAPSE_S)
        # lost no later than the lease could expire in etcd (1 s after the last renewal)
        assert time.monotonic() - killed <= SESSION_MS / 1000 + 0.5

        etcd.start()  # the same data directory
        assert await eventually(answered(store.topics), 15, "etcd answering again") == [{"t": r}]
        # the store took a new session and registered again by itself
        await eventually(answered(watcher.brokers, lambda live: reg in live), 15, "registered again")
        state = (await store.partition_states("t"))[0]
        assert await store.cas_partition_state("t", 0, state.version, PartitionState(1, 1, [1]))
        # the watch caught up: it sees the change made after the restart
        change = await asyncio.wait_for(_next_change(seen, "t", 1), 15)
        assert change.state.leader_epoch == 1
        again = await asyncio.wait_for(store.campaign(1), 15)
        assert again.epoch > lead.epoch and not again.lost.is_set()
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await watcher.close()
        await store.close()


async def test_a_campaign_waiting_for_etcd_says_so_once_not_every_try(etcd, stores, caplog):
    """A broker waiting out an etcd outage logs the wait once per 30 s (it retries every
    0.5 s), and says its session is gone without claiming why."""
    store = await stores()
    etcd.kill()
    try:
        with caplog.at_level(logging.INFO, logger="sluice.cluster"):
            campaign = asyncio.create_task(store.campaign(1))
            await asyncio.sleep(SESSION_MS / 1000 + 3)  # the session is lost, then tries go on
            campaign.cancel()
            await asyncio.gather(campaign, return_exceptions=True)
        waits = [r.getMessage() for r in caplog.records if "campaign for controller waits" in r.getMessage()]
        assert len(waits) == 1, waits
    finally:
        etcd.start()  # the same data directory: the module's other tests go on with it
        await eventually(answered(store.topics), 15, "etcd answering again")


async def _next_change(seen: asyncio.Queue, topic: str, epoch: int):
    while True:
        change = await seen.get()
        if change.topic == topic and change.state is not None and change.state.leader_epoch == epoch:
            return change


async def test_reassign_moves_replicas_and_their_states_follow(stores):
    store = await stores()
    r = TopicRecord("t", 3, replication_factor=2, assignment=[[1, 2], [2, 3], [3, 1]])
    await store.create_topic(r, initial_states(r))
    before = await store.partition_states("t")
    await store.reassign("t", {0: [1, 4], 1: [4, 3]})
    assert (await store.topics())["t"].assignment == [[1, 4], [4, 3], [3, 1]]
    after = await store.partition_states("t")
    # a follower moved away leaves the ISR; the leader keeps its epoch
    assert (after[0].leader, after[0].leader_epoch, after[0].isr) == (1, 0, [1])
    # the leader moved away: no leader, a new epoch (the controller elects one)
    assert (after[1].leader, after[1].leader_epoch, after[1].isr) == (-1, 1, [3])
    assert after[2] == before[2]
    # the current state is the one rewritten (a leader's ISR change is not undone)
    assert await store.cas_partition_state("t", 2, after[2].version, PartitionState(1, 1, [1]))
    await store.reassign("t", {2: [1, 5]})
    last = (await store.partition_states("t"))[2]
    assert (last.leader, last.leader_epoch, last.isr) == (1, 1, [1])


async def test_ending_a_registration_ends_it_and_its_term_at_once_but_not_a_later_one(stores):
    """``end_registration`` (a broker known dead, broker/liveness.py) removes the broker
    and its controller term at once; the broker's store, alive after all, registers again
    under a new session, which the old token cannot end; a store ``leaving`` does not."""
    a, b, c = await stores(), await stores(), await stores()
    await a.register_broker(BrokerRegistration(1, "127.0.0.1", 7401))
    await a.campaign(1)
    token = await b.registration_token(1)
    assert token is not None and await b.registration_token(9) is None
    assert await b.end_registration(1, token)
    assert await b.brokers() == [] and await b.controller() is None
    # a's session is gone in etcd: it takes a new one and registers again
    await eventually(answered(b.brokers, lambda live: [r.node_id for r in live] == [1]), LAPSE_S, "registering again")
    assert not await b.end_registration(1, token)
    assert [r.node_id for r in await b.brokers()] == [1]
    await c.register_broker(BrokerRegistration(2, "127.0.0.1", 7402))
    c.leaving()
    assert await b.end_registration(2, await b.registration_token(2))
    await asyncio.sleep(3 * SESSION_MS / 1000)  # a session ended while leaving is not replaced
    assert [r.node_id for r in await b.brokers()] == [1]


async def test_an_internal_topic_grows_up_to_its_intended_replication_factor(stores):
    """The factor of a topic created short of brokers grows, with every partition's list,
    up to ``intended_replication_factor`` and no further; the ISR stays (the new replicas
    join once caught up)."""
    store = await stores()
    r = TopicRecord("__t", 2, internal=True, replication_factor=2, intended_replication_factor=3,
                    assignment=[[1, 3], [3, 1]])
    await store.create_topic(r, initial_states(r))
    for bad, factor in (
        ({0: [1, 3, 2]}, 3),  # not every partition
        ({0: [1, 3, 2], 1: [1, 3, 2]}, 3),  # partition 1's list does not start with its old one
        ({0: [1, 3, 2, 4], 1: [3, 1, 2, 4]}, 4),  # past the intended factor
        ({0: [1], 1: [3]}, 1),  # never shrinks
    ):
        with pytest.raises(InvalidRequest):
            await store.reassign("__t", bad, replication_factor=factor)
    before = await store.partition_states("__t")
    await store.reassign("__t", {0: [1, 3, 2], 1: [3, 1, 2]}, replication_factor=3)
    record = (await store.topics())["__t"]
    assert (record.replication_factor, record.full_factor) == (3, 3)
    assert record.assignment == [[1, 3, 2], [3, 1, 2]]
    after = await store.partition_states("__t")
    assert [(s.leader, s.leader_epoch, s.isr) for s in after] == [(s.leader, s.leader_epoch, s.isr) for s in before]
    assert all(a.version > b.version for a, b in zip(after, before, strict=True))  # watchers wake
