"""Transactional messages against a real broker: commit, rollback, idempotent ends, refusals,
check-back, max checks (broker/transactions/, client/transaction.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from sluice import errors
from sluice.client import Admin, Consumer
from sluice.client.transaction import LocalTransactionState as S
from sluice.client.transaction import TransactionProducer
from sluice.protocol.transactions import DISCARD_TOPIC
from txn_helpers import FAST_CHECKS, list_open, make_topic, read_all


async def test_commit_rollback_unknown_and_ends(broker):
    bs = broker.bootstrap
    await make_topic(bs)
    seen = []
    async with TransactionProducer(bs, group="shop") as p:
        committed = await p.send_in_transaction(
            "orders", b"paid", lambda msg: seen.append(msg) or S.COMMIT, key=b"o1", headers=[("h", b"1")]
        )
        rolled = await p.send_in_transaction("orders", b"cancelled", lambda msg: S.ROLLBACK)

        async def later(msg):
            return S.UNKNOWN

        unknown = await p.send_in_transaction("orders", b"pending", later)

        assert seen[0].value == b"paid" and seen[0].key == b"o1" and seen[0].txn_id == committed.txn_id
        assert committed.state == "committed" and committed.offset > committed.half_offset
        assert rolled.state == "rolled_back" and unknown.state == "unknown" and unknown.offset == -1
        assert committed.txn_id == f"orders/0/{committed.half_offset}"

        # ending again the same way: success, and no second copy
        again = await p.end_transaction(committed.txn_id, commit=True)
        assert (again.state, again.offset, again.already) == ("committed", committed.offset, True)
        assert (await p.end_transaction(rolled.txn_id, commit=False)).already
        # the other way: refused
        with pytest.raises(errors.TransactionEnded, match="committed"):
            await p.end_transaction(committed.txn_id, commit=False)
        with pytest.raises(errors.TransactionEnded, match="rolled back"):
            await p.end_transaction(rolled.txn_id, commit=True)
        # not a half message / no such offset / malformed id
        with pytest.raises(errors.UnknownTransaction):
            await p.end_transaction(f"orders/0/{committed.offset}", commit=True)
        with pytest.raises(errors.UnknownTransaction):
            await p.end_transaction("orders/0/9999", commit=True)
        with pytest.raises(errors.ConfigError, match="topic/partition/offset"):
            await p.end_transaction("orders-0-1", commit=True)
        with pytest.raises(errors.UnknownPartition):
            await p.end_transaction("orders/7/0", commit=True)

        open_ = await list_open(bs)
        assert [(t.topic, t.offset, t.group) for t in open_] == [("orders", unknown.half_offset, "shop")]

        # the pending one, committed by hand later, is visible once
        late = await p.end_transaction(unknown.txn_id, commit=True)
        assert late.state == "committed" and not late.already

    recs = await read_all(bs, "orders")
    assert [r.value for r in recs] == [b"paid", b"pending"]
    assert [r.offset for r in recs] == [committed.offset, late.offset]
    headers = dict(recs[0].headers)
    assert headers["h"] == b"1" and headers["sluice.txn.id"] == committed.txn_id.encode()
    assert recs[0].key == b"o1"
    assert await list_open(bs) == []


async def test_positions_and_commits_pass_hidden_batches_at_the_end(broker, cli):
    """A partition ending in batches no reader sees (a half message, a rollback marker):
    a consumer's position, and so a group's commit and ``--exit-at-end``, reach its end."""
    bs = broker.bootstrap
    await make_topic(bs)
    async with TransactionProducer(bs, group="shop") as p:
        await p.send_in_transaction("orders", b"paid", lambda msg: S.COMMIT)
        await p.send_in_transaction("orders", b"cancelled", lambda msg: S.ROLLBACK)
        await p.send_in_transaction("orders", b"pending", lambda msg: S.UNKNOWN)
    admin = Admin(bs)
    await admin.start()
    try:
        end = (await admin.list_offsets("orders"))[0]
    finally:
        await admin.close()
    assert end == 5  # half, commit copy, half, rollback marker, half

    c = Consumer(bs, group="g", auto_offset_reset="earliest", fetch_max_wait_ms=50)
    await c.start()
    try:
        c.assign([("orders", 0)])
        got = []
        deadline = time.monotonic() + 30
        while c.position(("orders", 0)) != end:
            assert time.monotonic() < deadline, (got, c.position(("orders", 0)))
            got += await c.getmany(timeout_ms=100)
        assert [r.value for r in got] == [b"paid"]
        await c.commit()
        assert (await c.committed(("orders", 0))) == end
    finally:
        await c.close()

    res = cli("consume", "orders", "--from", "earliest", "--exit-at-end", bootstrap=bs, timeout=30)
    assert res.returncode == 0 and res.stdout == b"paid\n", res


async def test_racing_commit_and_rollback_one_wins(broker):
    """RocketMQ #8158: many ends of one half at once, both ways: one outcome, one copy."""
    bs = broker.bootstrap
    await make_topic(bs)
    async with TransactionProducer(bs, group="race") as p:
        halves = [await p.send_half("orders", b"v%d" % i) for i in range(10)]
        jobs = [p.end_transaction(h.txn_id, commit=bool((i + j) % 2)) for h in halves for i in range(3) for j in range(2)]
        results = await asyncio.gather(*jobs, return_exceptions=True)
    outcomes: dict[str, set] = {}
    for h, chunk in zip(halves, [results[i : i + 6] for i in range(0, len(results), 6)], strict=True):
        wins = {r.state for r in chunk if not isinstance(r, BaseException)}
        refused = [r for r in chunk if isinstance(r, BaseException)]
        assert len(wins) == 1, (h.txn_id, chunk)
        assert len(refused) == 3 and all(isinstance(r, errors.TransactionEnded) for r in refused), chunk
        outcomes[h.txn_id] = wins
    recs = await read_all(bs, "orders")
    committed = {h.value for h in halves if outcomes[h.txn_id] == {"committed"}}
    assert sorted(r.value for r in recs) == sorted(committed)  # each committed one exactly once


async def test_check_back_by_a_new_instance(broker_factory):
    """The producer that sent the half is gone; another instance of the group answers."""
    b = broker_factory(extra_args=FAST_CHECKS).start()
    await make_topic(b.bootstrap)
    first = TransactionProducer(b.bootstrap, group="billing")
    await first.start()
    half = await first.send_half("orders", b"invoice", key=b"k")
    await first.close()  # never ended

    asked = []

    def check(msg):
        asked.append(msg)
        return S.COMMIT if msg.value == b"invoice" else S.ROLLBACK

    async with TransactionProducer(b.bootstrap, group="billing", check_local_transaction=check):
        deadline = time.monotonic() + 15
        while not await_visible(await read_all(b.bootstrap, "orders", wait=0.2)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    recs = await read_all(b.bootstrap, "orders")
    assert [r.value for r in recs] == [b"invoice"]
    assert asked and asked[0].txn_id == half.txn_id and asked[0].key == b"k" and asked[0].checks >= 1
    assert await list_open(b.bootstrap) == []


def await_visible(recs) -> bool:
    return bool(recs)


async def test_max_checks_discards_to_the_audit_topic(broker_factory):
    b = broker_factory(extra_args=[*FAST_CHECKS, "--txn-max-checks", "2"]).start()
    await make_topic(b.bootstrap)
    asked = []

    def check(msg):
        asked.append(msg.checks)
        return S.UNKNOWN

    async with TransactionProducer(b.bootstrap, group="undecided", check_local_transaction=check) as p:
        half = await p.send_half("orders", b"limbo", key=b"customer-1", headers=[("app", b"x")])
        deadline = time.monotonic() + 20
        audit = []
        while not audit and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            try:
                audit = await read_all(b.bootstrap, DISCARD_TOPIC, wait=0.1)
            except errors.UnknownTopic:
                pass
        with pytest.raises(errors.TransactionEnded, match="rolled back"):
            await p.end_transaction(half.txn_id, commit=True)
    assert asked == [1, 2]
    [rec] = audit
    h = dict(rec.headers)
    assert rec.value == b"limbo" and rec.key == b"customer-1"  # the message as it was sent
    assert h["sluice.txn.id"] == half.txn_id.encode() and h["app"] == b"x"
    assert b"discarded" in h["sluice.txn.reason"] and h["sluice.txn.checks"] == b"2"
    assert await read_all(b.bootstrap, "orders") == []
    assert await list_open(b.bootstrap) == []


async def test_cli_list_commit_rollback(broker, cli):
    bs = broker.bootstrap
    await make_topic(bs)
    async with TransactionProducer(bs, group="ops") as p:
        a = await p.send_half("orders", b"a")
        b = await p.send_half("orders", b"b")
    out = cli("txn", "list", "--json", bootstrap=bs)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert [(t["id"], t["group"], t["checks"]) for t in listed] == [(a.txn_id, "ops", 0), (b.txn_id, "ops", 0)]
    assert all(t["age_ms"] >= 0 for t in listed)

    done = cli("txn", "commit", a.txn_id, "--json", bootstrap=bs)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "committed"
    again = cli("txn", "commit", a.txn_id, bootstrap=bs)
    assert again.returncode == 0 and b"already committed" in again.stdout
    assert cli("txn", "rollback", b.txn_id, bootstrap=bs).returncode == 0
    refused = cli("txn", "commit", b.txn_id, bootstrap=bs)
    assert refused.returncode == 1 and b"TRANSACTION_ENDED (34)" in refused.stderr
    unknown = cli("txn", "rollback", "orders/0/999", bootstrap=bs)
    assert unknown.returncode == 1 and b"UNKNOWN_TRANSACTION (35)" in unknown.stderr
    bad = cli("txn", "commit", "nonsense", bootstrap=bs)  # a bad argument: usage error, exit 2
    assert bad.returncode == 2 and b"USAGE_ERROR (1002)" in bad.stderr and b"topic/partition/offset" in bad.stderr
    huge = cli("txn", "commit", "orders/0/99999999999999999999", bootstrap=bs)
    assert huge.returncode == 2 and b"fit the wire" in huge.stderr
    assert json.loads(cli("txn", "list", bootstrap=bs).stdout) == []
    missing = cli("txn", "list", "-t", "nosuch", bootstrap=bs)
    assert missing.returncode == 1 and b"UNKNOWN_TOPIC (4)" in missing.stderr and b"nosuch" in missing.stderr
    assert [r.value for r in await read_all(bs, "orders")] == [b"a"]


async def test_cli_lists_pending_delayed_messages_and_delivers_or_cancels_one(broker, cli):
    """``txn list --delayed``: one entry per stored batch, soonest due first, apart from the
    transactions; ``commit`` delivers one now, ``rollback`` cancels it."""
    from sluice.client import DelayedProducer

    bs = broker.bootstrap
    await make_topic(bs)
    now = int(time.time() * 1000)
    async with DelayedProducer(bs) as producer:
        late = await producer.send_delayed("orders", [(None, b"late-%d" % i, []) for i in range(3)],
                                           deliver_at_ms=now + 3_600_000)
        soon = await producer.send_delayed("orders", [(None, b"soon", [])], deliver_at_ms=now + 1_800_000)
    async with TransactionProducer(bs, group="ops") as p:
        half = await p.send_half("orders", b"a transaction")
    out = cli("txn", "list", "--delayed", "--json", bootstrap=bs)
    assert out.returncode == 0, out.stderr
    assert [(d["id"], d["messages"], d["deliver_at"]) for d in json.loads(out.stdout)] == [
        (soon.id, 1, now + 1_800_000), (late.id, 3, now + 3_600_000)
    ]
    assert (late.topic, late.partition, late.count, late.deliver_at_ms) == ("orders", 0, 3, now + 3_600_000)
    assert late.id == f"orders/0/{late.offset}"
    assert [t["id"] for t in json.loads(cli("txn", "list", bootstrap=bs).stdout)] == [half.txn_id]

    assert cli("txn", "commit", late.id, bootstrap=bs).returncode == 0  # deliver now
    assert cli("txn", "rollback", soon.id, bootstrap=bs).returncode == 0  # cancel
    assert json.loads(cli("txn", "list", "--delayed", bootstrap=bs).stdout) == []
    assert [r.value for r in await read_all(bs, "orders")] == [b"late-0", b"late-1", b"late-2"]


async def test_delayed_messages_sent_by_key_are_delivered_now_or_cancelled_from_python(broker):
    """``send_delayed`` says where its batch is stored (the key chose the partition), and
    that is enough to deliver it now or cancel it; ending it twice the other way fails."""
    from sluice.client import DelayedProducer

    bs = broker.bootstrap
    await make_topic(bs, partitions=4)
    async with DelayedProducer(bs) as producer:
        sent = [await producer.send_delayed("orders", [(b"key-%d" % i, b"v%d" % i, [])], delay_ms=3_600_000)
                for i in range(8)]
        assert len({s.partition for s in sent}) > 1  # the keys spread them
        now, later = sent[:4], sent[4:]
        for one in now:
            await producer.deliver_now(one)
        for one in later:
            await producer.cancel(one.id)
        with pytest.raises(errors.TransactionEnded):
            await producer.cancel(now[0])
        with pytest.raises(errors.UnknownTransaction):
            await producer.deliver_now(f"orders/{now[0].partition}/{now[0].offset + 100}")
    async with Admin(bs) as admin:
        assert await admin.list_transactions(delayed=True) == []
    got = {(r.partition, r.value) for r in await read_all(bs, "orders", partitions=4)}
    assert got == {(s.partition, b"v%d" % i) for i, s in enumerate(now)}


async def test_deleting_a_topic_with_delayed_messages_pending_leaves_no_retries(broker):
    """The delayed messages of a deleted topic go with it: nothing tries to deliver them."""
    from sluice.client import DelayedProducer

    bs = broker.bootstrap
    await make_topic(bs)
    async with DelayedProducer(bs) as producer:
        await producer.send_delayed("orders", [(None, b"later", [])], delay_ms=300)
    async with Admin(bs) as admin:
        await admin.delete_topic("orders")
    await asyncio.sleep(1.5)  # past its time, and a retry's
    assert "delayed message not delivered yet" not in broker.log()


async def test_a_delivered_batch_of_delayed_messages_reads_as_it_was_sent(broker):
    """The commit copies the stored batch: every message keeps its key, value and headers,
    all share one timestamp; the first also carries the id of the batch it was stored as."""
    from sluice.client import DelayedProducer

    bs = broker.bootstrap
    await make_topic(bs)
    sent = [(b"k%d" % i if i % 3 else None, b"v%d" % i * (i % 50), [("app", b"%d" % i)] * (i % 3))
            for i in range(200)]
    due = int(time.time() * 1000) + 800
    async with DelayedProducer(bs) as producer:
        with pytest.raises(errors.ConfigError, match="delay_ms must be at least 0, got -5"):
            await producer.send_delayed("orders", sent, delay_ms=-5)  # as the CLI refuses it
        with pytest.raises(TypeError, match="delay_ms must be an int"):  # 2.0 * 1000 was stored, never delivered
            await producer.send_delayed("orders", sent, delay_ms=2.0 * 1000)
        with pytest.raises(TypeError, match=r"\(key, value, headers\) triples"):
            await producer.send_delayed("orders", [b"x"], delay_ms=10)
        with pytest.raises(TypeError, match="record key must be bytes"):
            await producer.send_delayed("orders", [("k", b"x", [])], delay_ms=10)
        stored = await producer.send_delayed("orders", sent, deliver_at_ms=due)
        sent_ms = int(time.time() * 1000)
    deadline = time.monotonic() + 15
    recs = []
    while len(recs) < len(sent) and time.monotonic() < deadline:
        recs = await read_all(bs, "orders", wait=0.3)
    assert time.time() * 1000 >= due
    assert [(r.key, r.value) for r in recs] == [(k, v) for k, v, _ in sent]
    for i, (r, (_, _, hs)) in enumerate(zip(recs, sent, strict=True)):
        h = list(r.headers)
        extra = [("sluice.txn.id", stored.id.encode())] if i == 0 else []
        assert h == [*hs, ("sluice.txn.group", b"sluice.delay"), ("sluice.deliver_at", b"%d" % due), *extra]
    stamps = {r.timestamp for r in recs}  # the time it was stored (create time) or delivered (append time)
    assert len(stamps) == 1 and sent_ms - 5_000 <= stamps.pop() <= time.time() * 1000
    assert [r.offset for r in recs] == list(range(recs[0].offset, recs[0].offset + len(sent)))
