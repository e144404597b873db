"""Transactional messages in a three-broker cluster: the leader of a partition holding an
unresolved half message is SIGKILLed; the new leader rebuilds the partition's transactions
from its own replica of the log, answers ends of transactions begun under the old leader,
and checks back the unresolved one."""

from __future__ import annotations

import asyncio
import time

from replicated import eventually

from sluice.client.transaction import LocalTransactionState as S
from sluice.client.transaction import TransactionProducer
from txn_helpers import FAST_CHECKS, list_open, read_all

TOPIC = "orders"


async def test_new_leader_resolves_transactions_of_the_old_one(three_brokers):
    cluster = await three_brokers.start(extra_args=FAST_CHECKS)
    await cluster.create_topic(TOPIC, partitions=1)
    async with TransactionProducer(cluster.bootstrap, group="ledger") as p:
        done = await p.send_in_transaction(TOPIC, b"settled", lambda msg: S.COMMIT)
        pending = await p.send_half(TOPIC, b"in-doubt")  # acks=all: on every in-sync replica
    victim, epoch = await cluster.leader_of(TOPIC, 0)
    cluster.brokers[victim].kill()
    others = cluster.bootstrap_without(victim)

    async def moved():
        leader, new_epoch = await cluster.leader_of(TOPIC, 0, others)
        return leader if leader not in (victim, -1) and new_epoch > epoch else None

    await eventually(moved, 30, "a new leader")
    asked = []

    def check(msg):
        asked.append(msg.txn_id)
        return S.COMMIT

    async with TransactionProducer(others, group="ledger", check_local_transaction=check) as p2:
        again = await p2.end_transaction(done.txn_id, commit=True)  # ended under the old leader
        assert (again.state, again.offset, again.already) == ("committed", done.offset, True)
        deadline = time.monotonic() + 30
        while await list_open(others) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    assert set(asked) == {pending.txn_id}
    assert sorted(r.value for r in await read_all(others, TOPIC)) == [b"in-doubt", b"settled"]


async def test_halves_discarded_on_any_broker_reach_the_audit_topic(three_brokers):
    """max_checks on the leaders of three partitions (spread over the brokers): every half is
    rolled back and copied to ``__txn_discarded``, whichever broker leads that topic."""
    cluster = await three_brokers.start(extra_args=[*FAST_CHECKS, "--txn-max-checks", "1"])
    await cluster.create_topic(TOPIC, partitions=3)
    leaders = {(await cluster.leader_of(TOPIC, i))[0] for i in range(3)}
    async with TransactionProducer(cluster.bootstrap, group="nobody-answers") as p:
        halves = [await p.send_half(TOPIC, b"doubt-%d" % i, partition=i) for i in range(3)]

    async def audited():
        got = await read_all(cluster.bootstrap, "__txn_discarded", wait=0.3)
        return got if len(got) >= 3 else None

    copies = await eventually(audited, 60, "three audit copies")
    assert sorted(r.value for r in copies) == [b"doubt-0", b"doubt-1", b"doubt-2"]
    assert {dict(r.headers)["sluice.txn.id"].decode() for r in copies} == {h.txn_id for h in halves}
    assert len(leaders) > 1, "the partitions' leaders were not spread: the test proved less"
    assert await read_all(cluster.bootstrap, TOPIC, partitions=3, wait=0.3) == []
    assert await list_open(cluster.bootstrap) == []
