"""The subscription state machine of one partition without sockets: a real partition log,
the real ``PartitionSubscriptions`` / ``SubscriptionPartition`` / ``Session``, and a
connection that keeps what is pushed to it (tests/broker/in_memory.py).  Credit, acks,
nacks, ack timeouts, consumers gone, ordered and key-ordered mode, seeks, dead letters
(written in-process into a real dead-letter partition) and retries kept across a reload
of the state from the log."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from batches import request, request_of
from in_memory import Conn, local_writes, topic_of

from sluice.broker.subscriptions.dead_letters import DeadLetters
from sluice.broker.subscriptions.partition import PartitionSubscriptions
from sluice.broker.subscriptions.session import Session
from sluice.harness import eventually
from sluice.protocol import messages as m
from sluice.protocol import subscriptions as sub
from sluice.protocol.records import build_batch, decode_records, encode_record

pytestmark = pytest.mark.timeout(60)

NEVER_MS = 600_000


def keyed(*keys: bytes) -> bytes:
    """One batch of records keyed ``keys``, valued ``v<i>``."""
    body = b"".join(encode_record(i, 0, k, b"v%d" % i) for i, k in enumerate(keys))
    return build_batch(body, len(keys), 1_000, 1_000)


class Subs:
    """A partition ``t``-0 led here, its subscriptions, and ``t.work.dlq``-0 for dead letters."""

    def __init__(self, open_partition) -> None:
        self.part = open_partition("source")
        self.dlq = open_partition("dlq")
        self.topics = {"t": topic_of("t", self.part), "t.work.dlq": topic_of("t.work.dlq", self.dlq)}
        self.executor = ThreadPoolExecutor(2)
        self.opened: list[PartitionSubscriptions] = []

        async def create_topic(new, validate_only=False):
            raise AssertionError(f"the dead-letter topic exists: {new.name} must not be created")

        self.dead_letters = DeadLetters(self.topics, create_topic, asyncio.Lock(), local_writes(self.topics))

    async def load(self) -> PartitionSubscriptions:
        ps = PartitionSubscriptions(self.part, self.executor, self.dead_letters)
        self.opened.append(ps)
        await ps.load()
        return ps

    async def subscribe(self, config: sub.SubscriptionConfig | None = None, prefetch: int = 100):
        """Create subscription ``work`` at the earliest offset, attach a consumer."""
        ps = await self.load()
        sp = await ps.create("work", config or sub.SubscriptionConfig(ack_timeout_ms=NEVER_MS), m.Position())
        conn = Conn()
        session = Session(conn, "t", "work", prefetch)
        sp.attach(session)
        return ps, sp, conn

    async def close(self) -> None:
        for ps in self.opened:
            await ps.close(None)
        self.executor.shutdown()


@pytest.fixture
async def subs(open_partition):
    s = Subs(open_partition)
    try:
        yield s
    finally:
        await s.close()


async def produce(part, values: list[bytes]) -> int:
    return (await part.append(*request(values))).base_offset


def ack(*pairs, **kw) -> m.AckPartition:
    return m.AckPartition(partition=0, acks=list(pairs), **kw)


async def test_delivery_stays_within_credit_and_out_of_order_acks_move_the_cursor(subs):
    await produce(subs.part, [b"m%d" % i for i in range(10)])
    _, sp, conn = await subs.subscribe(prefetch=4)
    assert await conn.wait_deliveries(4) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    await asyncio.sleep(0.1)
    assert len(conn.deliveries()) == 4 and sp.in_flight() == 4  # no credit, nothing more
    sp.settle(ack((2, 3), (0, 1)))
    assert (sp.cursor.confirmed, sp.cursor.acked.pairs()) == (1, [(2, 3)])
    assert (await conn.wait_deliveries(6))[4:] == [(4, 1), (5, 1)]  # two acks, two more
    sp.settle(ack((0, 6)))
    await conn.wait_deliveries(10)
    assert [o for o, _ in conn.deliveries()] == list(range(10))  # each once
    sp.settle(ack((6, 10)))
    await eventually(lambda: sp.info().backlog == 0, 10, "the backlog to be empty", interval=0.01)
    info = sp.info()
    assert (info.in_flight, info.retrying, info.acked_ranges) == (0, 0, 0) and info.confirmed >= 10


async def test_a_nack_redelivers_with_the_next_attempt_after_its_delay(subs):
    await produce(subs.part, [b"a", b"b", b"c"])
    _, sp, conn = await subs.subscribe(sub.SubscriptionConfig(ack_timeout_ms=NEVER_MS, backoff_initial_ms=0))
    await conn.wait_deliveries(3)
    sp.settle(ack((0, 1), (2, 3), nacks=[(1, 2)], nack_delay_ms=300, reason="cannot parse"))
    assert (sp.in_flight(), sp.retrying()) == (0, 1)
    started = time.monotonic()
    assert (await conn.wait_deliveries(4))[3] == (1, 2)
    assert time.monotonic() - started >= 0.25  # not before its delay
    sp.settle(ack((1, 2)))
    assert (sp.in_flight(), sp.retrying(), sp.cursor.confirmed >= 3) == (0, 0, True)


async def test_an_ack_timeout_redelivers_and_a_touch_postpones_it(subs):
    await produce(subs.part, [b"a"])
    await produce(subs.part, [b"b"])
    cfg = sub.SubscriptionConfig(ack_timeout_ms=600, backoff_initial_ms=0)
    _, sp, conn = await subs.subscribe(cfg)
    await conn.wait_deliveries(2)
    started = time.monotonic()
    for _ in range(6):  # b is touched for 1.2 s: a times out alone, and is acked once back
        await asyncio.sleep(0.2)
        sp.settle(ack((0, 1) if (0, 2) in conn.deliveries() else (0, 0), touches=[(1, 2)]))
    assert conn.deliveries()[2] == (0, 2) and sp.cursor.confirmed == 1
    assert (await conn.wait_deliveries(4))[3] == (1, 2)
    assert time.monotonic() - started >= 1.2 + 0.4  # its deadline moved by the last touch


async def test_a_consumer_gone_hands_its_messages_to_another_attempt_counted(subs):
    await produce(subs.part, [b"a", b"b"])
    _, sp, conn = await subs.subscribe()
    await conn.wait_deliveries(2)
    session = sp.sessions[0]
    sp.settle(ack((0, 1)))
    sp.detach(session)
    other = Conn()
    sp.attach(Session(other, "t", "work", 10))
    assert await other.wait_deliveries(1) == [(1, 2)]
    assert len(conn.deliveries()) == 2


async def test_a_release_redelivers_without_counting_and_to_other_consumers_only(subs):
    await produce(subs.part, [b"a"])
    _, sp, conn = await subs.subscribe()
    await conn.wait_deliveries(1)
    sp.settle(m.AckPartition(partition=0, releases=[(0, 1)]))
    await asyncio.sleep(0.1)
    assert len(conn.deliveries()) == 1  # the releasing consumer is given nothing more
    other = Conn()
    sp.attach(Session(other, "t", "work", 10))
    assert await other.wait_deliveries(1) == [(0, 1)]  # attempt not counted


async def test_after_max_attempts_a_message_is_copied_to_the_dead_letter_topic_then_acked(subs):
    await produce(subs.part, [b"fine"])
    await subs.part.append(*request_of(keyed(b"k1")))
    cfg = sub.SubscriptionConfig(max_attempts=2, ack_timeout_ms=NEVER_MS, backoff_initial_ms=0)
    _, sp, conn = await subs.subscribe(cfg)
    await conn.wait_deliveries(2)
    sp.settle(ack((0, 1), nacks=[(1, 2)], reason="cannot parse"))
    assert (await conn.wait_deliveries(3))[2] == (1, 2)
    sp.settle(ack(nacks=[(1, 2)], reason="still cannot"))
    await eventually(lambda: sp.dead_lettered == 1, 10, "the dead letter", interval=0.01)
    await asyncio.sleep(0.1)
    assert len(conn.deliveries()) == 3  # never a third time
    assert sp.cursor.confirmed >= 2 and (sp.in_flight(), sp.retrying()) == (0, 0)
    data = subs.dlq.log.read(0, 1 << 20, subs.dlq.log_end_offset).data
    [dead] = decode_records(data, "t.work.dlq", 0, 0)
    assert (dead.key, dead.value) == (b"k1", b"v0")
    assert {k: v for k, v in dead.headers if k in sub.DLQ_HEADERS} == {
        "sluice.dlq.topic": b"t", "sluice.dlq.partition": b"0", "sluice.dlq.offset": b"1",
        "sluice.dlq.subscription": b"work", "sluice.dlq.attempts": b"2", "sluice.dlq.reason": b"still cannot",
    }
    assert subs.dlq.high_watermark == 1  # acknowledged (acks=all) before the source acked it


async def test_ordered_mode_has_one_message_out_and_redelivers_a_failure_first(subs):
    for v in (b"a", b"b", b"c"):
        await produce(subs.part, [v])
    cfg = sub.SubscriptionConfig(mode="ordered", ack_timeout_ms=NEVER_MS, backoff_initial_ms=0)
    _, sp, conn = await subs.subscribe(cfg)
    assert await conn.wait_deliveries(1) == [(0, 1)]
    await asyncio.sleep(0.1)
    assert len(conn.deliveries()) == 1
    sp.settle(ack((0, 1)))
    assert (await conn.wait_deliveries(2))[1] == (1, 1)
    sp.settle(ack(nacks=[(1, 2)]))
    assert (await conn.wait_deliveries(3))[2] == (1, 2)  # before c
    sp.settle(ack((1, 2)))
    assert (await conn.wait_deliveries(4))[3] == (2, 1)


async def test_key_ordered_mode_holds_a_key_behind_its_message_out(subs):
    await subs.part.append(*request_of(keyed(b"a", b"a", b"b")))
    cfg = sub.SubscriptionConfig(mode="key-ordered", ack_timeout_ms=NEVER_MS, backoff_initial_ms=0)
    _, sp, conn = await subs.subscribe(cfg)
    assert await conn.wait_deliveries(2) == [(0, 1), (2, 1)]
    assert sp.info().waiting == 1
    sp.settle(ack((2, 3), nacks=[(0, 1)]))
    assert (await conn.wait_deliveries(3))[2] == (0, 2)  # a's first again; its second waits
    assert sp.info().waiting == 1
    sp.settle(ack((0, 1)))
    assert (await conn.wait_deliveries(4))[3] == (1, 1)
    assert sp.info().waiting == 0


async def test_a_seek_forgets_what_is_out_and_delivers_again_from_its_offset(subs):
    await produce(subs.part, [b"a", b"b", b"c"])
    ps, sp, conn = await subs.subscribe()
    await conn.wait_deliveries(3)
    sp.settle(ack((0, 1), nacks=[(2, 3)], nack_delay_ms=NEVER_MS))
    assert await ps.seek("work", m.Position(kind="offset", value=1)) == 1
    assert (await conn.wait_deliveries(5))[3:] == [(1, 1), (2, 1)]  # new attempts: a new start
    assert (sp.cursor.confirmed, sp.in_flight(), sp.retrying()) == (1, 2, 0)  # the nack forgotten


async def test_a_reload_from_the_log_keeps_acks_and_retries_with_their_attempts(subs):
    await produce(subs.part, [b"a", b"b", b"c", b"d"])
    ps, sp, conn = await subs.subscribe(sub.SubscriptionConfig(ack_timeout_ms=NEVER_MS, backoff_initial_ms=0))
    await conn.wait_deliveries(4)
    sp.settle(ack((0, 1), (3, 4), nacks=[(1, 2)], nack_delay_ms=800))
    await ps.flush()  # the group commit of acks, now
    await ps.close(None)
    ps2 = await subs.load()
    sp2 = ps2.get("work")
    info = sp2.info()
    assert (info.confirmed, info.acked_ranges, info.retrying) == (1, 1, 2)
    other = Conn()
    sp2.attach(Session(other, "t", "work", 10))
    # c was out when the state was written (a snapshot): counted as failed, due at once;
    # b when its nack's delay is over, with its attempt counted
    assert await other.wait_deliveries(1) == [(2, 2)]
    assert (await other.wait_deliveries(2))[1] == (1, 2)
