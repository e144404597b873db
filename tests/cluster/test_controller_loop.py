"""The controller's serving loop: on the embedded store it waits when there is nothing to
do; on etcd it gives an offline partition a leader as soon as a replica is eligible, not
only when brokers come and go."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from cluster_helpers import REQUEST_MS, SESSION_MS, eventually

from sluice.cluster.controller import Controller
from sluice.cluster.embedded import EmbeddedStore
from sluice.cluster.etcd import EtcdStore
from sluice.cluster.store import BrokerRegistration, PartitionState, TopicRecord, initial_states
from sluice.errors import MetadataUnavailable


async def test_a_poke_that_finds_no_move_leaves_the_controller_waiting(tmp_path):
    """A poke whose look finds no pending move must not leave the loop waking at once
    again and again: the broker would burn a core while idle."""
    store = EmbeddedStore(tmp_path, 0)
    await store.start()
    await store.register_broker(BrokerRegistration(0, "127.0.0.1", 1))
    controller = Controller(store, 0, rebalance_interval_ms=0)
    controller.poke()  # a partition state changed just as the term starts: its first look sees it
    task = asyncio.ensure_future(controller.run())
    try:
        deadline = time.monotonic() + 10
        while controller.live != {0} or controller.moves_pending:
            assert time.monotonic() < deadline, "the controller did not take its first look"
            await asyncio.sleep(0.01)
        assert await cpu_in(0.5) < 0.1, "an idle controller kept a core busy"
        controller.poke()  # and a poke later on is looked at, then waited out the same way
        await asyncio.sleep(0.7)
        assert not controller.moves_pending
        assert await cpu_in(0.5) < 0.1, "an idle controller kept a core busy after a poke"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


async def cpu_in(seconds: float) -> float:
    """CPU seconds this process used while the loop ran for ``seconds``."""
    cpu = time.process_time()
    await asyncio.sleep(seconds)
    return time.process_time() - cpu


# ---------------------------------------------------------------------- offline partitions

UNCLEAN = {"unclean.leader.election.enable": "true"}


@contextlib.asynccontextmanager
async def one_broker_controller(url: str, rebalance_interval_ms: int, config: dict | None = None):
    """Broker 1 alive and running the controller on etcd; topic ``t`` (one partition, its
    replica on broker 1, ``config``), led by broker 1 once the controller took its first
    look.  Yields (store, controller)."""
    store = EtcdStore(url, session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
    await store.start()
    task = None
    try:
        await store.register_broker(BrokerRegistration(1, "127.0.0.1", 7401))
        record = TopicRecord("t", 1, dict(config or {}), replication_factor=1, assignment=[[1]])
        await store.create_topic(record, initial_states(record))
        controller = Controller(store, 1, rebalance_interval_ms)
        task = asyncio.ensure_future(controller.run())
        await eventually(lambda: controller.live == {1}, 10, "the controller seeing broker 1")
        await eventually(lambda: store.controller(), 10, "the controller elected")
        await asyncio.sleep(0.5)  # its first reconcile pass: nothing to do
        yield store, controller
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await store.close()


async def offline(store: EtcdStore, isr: list[int]) -> PartitionState:
    """Take ``t``-0 offline (as a broker with a new data directory does: leader -1, a new
    epoch), ISR ``isr``; the state as written."""
    [st] = await store.partition_states("t")
    assert await store.cas_partition_state("t", 0, st.version, PartitionState(-1, st.leader_epoch + 1, isr))
    [st] = await store.partition_states("t")
    return st


def led_by(store: EtcdStore, node: int):
    async def check():
        try:
            [st] = await store.partition_states("t")
        except MetadataUnavailable:
            return False
        return st.leader == node

    return check


async def test_a_partition_left_leaderless_with_an_in_sync_replica_alive_gets_it_at_once(etcd, cluster_name):
    """No broker came or went: the state change itself (as every broker's state watch
    reports it) makes the controller look."""
    async with one_broker_controller(etcd.url(cluster_name), rebalance_interval_ms=0) as (store, controller):
        controller.state_changed(await offline(store, isr=[1]))
        await eventually(led_by(store, 1), 5, "broker 1 leading again")
        [st] = await store.partition_states("t")
        assert st.isr == [1] and st.leader_epoch == 2


async def test_allowing_unclean_elections_elects_a_live_replica_of_an_offline_partition(etcd, cluster_name):
    async with one_broker_controller(etcd.url(cluster_name), rebalance_interval_ms=0) as (store, controller):
        controller.state_changed(await offline(store, isr=[]))
        await asyncio.sleep(1)
        [st] = await store.partition_states("t")
        assert st.leader == -1, "elected a replica out of sync without unclean elections allowed"
        record = dataclasses.replace((await store.topics())["t"], config=UNCLEAN)
        await store.update_topic(record)
        controller.config_changed(record)  # as the broker applying the altered record says
        await eventually(led_by(store, 1), 5, "broker 1 leading after an unclean election")
        [st] = await store.partition_states("t")
        assert st.isr == [1]


async def test_the_periodic_pass_elects_an_eligible_replica_of_an_offline_partition(etcd, cluster_name):
    """Nothing tells the controller (no broker change, no state or config change seen):
    the rebalance pass finds the offline partition and elects its eligible replica."""
    url = etcd.url(cluster_name)
    async with one_broker_controller(url, rebalance_interval_ms=300, config=UNCLEAN) as (store, _controller):
        await offline(store, isr=[])  # unclean allowed: broker 1 is eligible
        await eventually(led_by(store, 1), 5, "broker 1 leading after the periodic pass")
