"""The half-message state machine of one partition without sockets: a real partition log
and the real ``PartitionTransactions``, ``CheckBack`` and ``AuditCopies``, with a connection
that keeps what is pushed to it (tests/broker/in_memory.py).  Halves open, commit, roll
back, race, are looked up in the log once forgotten, are rebuilt by a new leader's state,
and are checked back, then discarded with an audit copy written in-process."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from batches import request, request_of
from in_memory import Conn, local_writes, topic_of

from sluice.broker.transactions import partition as txn_partition
from sluice.broker.transactions.audit import AuditCopies
from sluice.broker.transactions.check_back import CheckBack
from sluice.broker.transactions.partition import PartitionTransactions
from sluice.errors import TransactionEnded, UnknownTransaction
from sluice.protocol import messages as m
from sluice.protocol import transactions as tx
from sluice.protocol.records import COMMIT_BIT, CONTROL_BIT, decode_records, iter_batches

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def executor():
    ex = ThreadPoolExecutor(2)
    yield ex
    ex.shutdown()


async def half(part, value: bytes, seq: int = 0, group: str = "g") -> int:
    batch = tx.half_batch(group, b"k", value, [("h", b"1")], 1_000, (77, 0, seq))
    return (await part.append(*request_of(batch))).base_offset


def ends(part) -> list[tuple[int, str]]:
    """(offset, "commit" / "rollback") of every end batch in the log."""
    data = part.log.read(0, 1 << 20, part.log_end_offset).data
    return [
        (h.base_offset, "rollback" if h.attributes & CONTROL_BIT else "commit")
        for h, _ in iter_batches(data) if h.attributes & (COMMIT_BIT | CONTROL_BIT)
    ]


async def test_a_half_is_open_until_committed_and_its_commit_is_its_visible_copy(open_partition, executor):
    part = open_partition()
    await part.append(*request([b"plain"]))
    offset = await half(part, b"order-1")
    st = PartitionTransactions(part, executor)
    await st.catch_up()
    assert list(st.open) == [offset] and st.open[offset].group == "g"
    state, at, already = await st.end(offset, True, 5)
    assert (state, already) == (m.TXN_COMMITTED, False) and at == offset + 1
    assert st.open == {} and st.ended[offset] == (m.TXN_COMMITTED, at)
    data = part.log.read(at, 1 << 20, part.log_end_offset).data
    [copy] = decode_records(data, "t", 0, at)
    assert (copy.key, copy.value, dict(copy.headers)["sluice.txn.id"]) == (b"k", b"order-1", b"t/0/1")
    assert await st.end(offset, True, 5) == (m.TXN_COMMITTED, at, True)  # a retried commit
    with pytest.raises(TransactionEnded, match="was committed"):
        await st.end(offset, False, 5)
    assert ends(part) == [(at, "commit")]  # one end, whatever was asked after it


async def test_a_commit_and_a_rollback_racing_have_one_winner(open_partition, executor):
    part = open_partition()
    offsets = [await half(part, b"v%d" % i, seq=i) for i in range(5)]
    st = PartitionTransactions(part, executor)
    for offset in offsets:
        results = await asyncio.gather(
            st.end(offset, True, 5), st.end(offset, False, 5, reason="timeout"), return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], TransactionEnded), results
        assert won[0][2] is False
    assert len(ends(part)) == 5 and st.open == {}


async def test_an_offset_holding_no_half_is_an_unknown_transaction(open_partition, executor):
    part = open_partition()
    plain = (await part.append(*request([b"plain"]))).base_offset
    st = PartitionTransactions(part, executor)
    with pytest.raises(UnknownTransaction, match="holds no half message"):
        await st.end(plain, True, 5)
    with pytest.raises(UnknownTransaction, match="beyond the log end"):
        await st.end(99, False, 5)
    assert ends(part) == []


async def test_ended_halves_no_longer_remembered_are_looked_up_in_the_log(open_partition, executor, monkeypatch):
    monkeypatch.setattr(txn_partition, "MAX_ENDED", 1)
    part = open_partition()
    first, second = await half(part, b"a", 0), await half(part, b"b", 1)
    st = PartitionTransactions(part, executor)
    _, at, _ = await st.end(first, False, 5)
    await st.end(second, True, 5)
    assert list(st.ended) == [second]  # the first forgotten
    with pytest.raises(TransactionEnded, match="was rolled back"):
        await st.end(first, True, 5)
    assert st.ended[first] == (m.TXN_ROLLED_BACK, at)  # found again from the half on
    assert len(ends(part)) == 2


async def test_a_new_state_rebuilds_the_open_and_delayed_halves_from_the_log(open_partition, executor):
    part = open_partition()
    ended, still = await half(part, b"a", 0), await half(part, b"b", 1)
    deliver_at = int(time.time() * 1000) + 60_000
    delayed = (await part.append(*request_of(tx.delayed_batch([(None, b"later", [])], deliver_at, 1_000, (77, 0, 2)))))
    await PartitionTransactions(part, executor).end(ended, True, 5)
    st = PartitionTransactions(part, executor)  # a new leader epoch's, say
    assert st.scanned_to == still  # from the oldest open half on, not from the log start
    await st.catch_up()
    assert sorted(st.open) == [still, delayed.base_offset] and st.ended[ended][0] == m.TXN_COMMITTED
    assert st.open[delayed.base_offset].delayed and st.due == [(deliver_at, delayed.base_offset)]
    assert not st.open[still].delayed


async def test_unanswered_checks_end_in_a_rollback_and_an_audit_copy_written_in_process(open_partition, executor):
    part = open_partition("data")
    audit_part = open_partition("audit")
    topics = {"t": topic_of("t", part), tx.DISCARD_TOPIC: topic_of(tx.DISCARD_TOPIC, audit_part, internal=True)}
    offset = await half(part, b"order-1")
    st = PartitionTransactions(part, executor)
    producer = Conn()

    async def create_topic(new, validate_only=False, internal=False):
        raise AssertionError(f"{new.name} exists: not to be created")

    async def stored_topics():
        return topics

    audit = AuditCopies(topics, create_topic, asyncio.Lock(), stored_topics, lambda: True, local_writes(topics))
    checks = CheckBack(lambda: [st], {"g": [producer]}, executor, audit, 0.0, 0.0, max_checks=2)
    try:
        await checks.check_once()
        await checks.check_once()
        pushed = [msg for kind, msg, _ in producer.pushed if kind == m.Push.CHECK_TRANSACTION]
        assert [(p.offset, p.group, p.value, p.checks) for p in pushed] == [(offset, "g", b"order-1", n) for n in (1, 2)]
        await checks.check_once()  # no answer after 2 checks: discarded
        deadline = time.monotonic() + 10
        while audit_part.high_watermark < 1:
            assert time.monotonic() < deadline, "no audit copy"
            await asyncio.sleep(0.01)
        assert len(producer.pushed) == 2
        state, at = st.ended[offset]
        assert state == m.TXN_ROLLED_BACK and ends(part) == [(at, "rollback")]
        [copy] = decode_records(audit_part.log.read(0, 1 << 20, audit_part.log_end_offset).data, tx.DISCARD_TOPIC, 0, 0)
        headers = dict(copy.headers)
        assert (copy.key, copy.value, headers["h"], headers[tx.ID_HEADER], headers[tx.CHECKS_HEADER]) == (
            b"k", b"order-1", b"1", b"t/0/0", b"2",
        )
        assert headers[tx.REASON_HEADER].startswith(b"discarded: unresolved after 2 checks")
    finally:
        await checks.close()
