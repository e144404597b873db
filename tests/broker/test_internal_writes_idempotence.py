"""The broker's own writes are an idempotent producer's (broker/internal_writes.py), on a
whole broker in this process (tests/broker/conftest.py ``broker``): an attempt whose
acknowledgement is lost after the batches were stored is retried with the same producer
id and sequences, and the partition stores them once; a refusal that stored nothing is
raised at once and leaves the sequence where it was; the same holds through the client
to a partition's leader on another broker (a real broker process), where the connection
closes after the request was stored; a call given up at its deadline, or
cancelled while it waits to retry, gives up the producer id too, so the next call is
never taken for a duplicate of it."""

from __future__ import annotations

import asyncio
import time

import pytest
from batches import request
from in_memory import led_partition, partition_append, producer_ids, topic_of
from test_subscriptions_in_process import create_topic

from sluice.broker.internal_writes import InternalWrites
from sluice.broker.leader_client import LeaderClient
from sluice.cluster.store import BrokerRegistration
from sluice.errors import ConnectionClosed, NotEnoughReplicas, RequestTimedOut
from sluice.protocol.records import decode_records, iter_batches
from sub_helpers import make_topic
from txn_helpers import read_all

pytestmark = pytest.mark.timeout(60)

LOSE_ACK = "lose-ack"  # append for real, then fail as if the acknowledgement was lost
REFUSE = "refuse"  # fail as a refusal that wrote nothing


class Seam:
    """The broker's real in-process append (its produce service's), with faults injected
    at calls: each call takes the next of ``faults`` (none left: no fault)."""

    def __init__(self, broker) -> None:
        self._produce = broker.produce_service
        self.faults: list[str | None] = []
        self.calls = 0

    async def append(self, topic: str, partition: int, data: bytearray, acks_all: bool) -> int:
        self.calls += 1
        fault = self.faults.pop(0) if self.faults else None
        if fault == REFUSE:
            raise NotEnoughReplicas("injected: the ISR is below min.insync.replicas")
        offset = (await self._produce.append(topic, partition, data, acks_all)).base_offset
        if fault == LOSE_ACK:
            raise RequestTimedOut("injected: stored, acknowledgement lost")
        return offset


def writes_over(broker, seam: Seam, deadline_s: float = 30.0) -> InternalWrites:
    return InternalWrites(
        seam.append, LeaderClient(lambda: {}, broker.config.node_id), broker.produce_service.new_producer_id,
        deadline_s=deadline_s, backoff_s=(0.01, 0.05),
    )


def two_batches(*values: bytes) -> bytearray:
    """``values[:-1]`` in one batch and the last in another, as one call's data."""
    return request(list(values[:-1]))[0] + request([values[-1]])[0]


def stored(broker, topic: str) -> tuple[list[bytes], list[tuple[int, int]]]:
    """The values in ``topic``-0, and (producer id, base sequence) of each batch."""
    part = broker.led_partition(topic, 0)
    data = part.log.read(0, 1 << 20, part.log_end_offset).data
    values = [r.value for r in decode_records(data, topic, 0, 0)]
    return values, [(h.producer_id, h.base_sequence) for h, _ in iter_batches(data)]


async def test_a_write_whose_acknowledgement_is_lost_is_stored_once(broker):
    await create_topic(broker, "copies")
    await broker.produce_service.append("copies", 0, request([b"before"])[0], True)
    seam = Seam(broker)
    writes = writes_over(broker, seam)
    try:
        seam.faults = [LOSE_ACK]
        assert await writes.write("copies", 0, two_batches(b"a", b"b", b"c")) == 1  # the original's offset
        assert seam.calls == 2
        values, producers = stored(broker, "copies")
        assert values == [b"before", b"a", b"b", b"c"]
        pid = producers[1][0]
        assert pid >= 0 and producers == [(-1, -1), (pid, 0), (pid, 2)]

        # the next call goes on from the sequence after the first call's records
        assert await writes.write("copies", 0, request([b"d"])[0]) == 4
        values, producers = stored(broker, "copies")
        assert values == [b"before", b"a", b"b", b"c", b"d"]
        assert producers[-1] == (pid, 3)
    finally:
        await writes.close()


async def test_a_refusal_that_stored_nothing_is_raised_at_once_and_keeps_the_sequence(broker):
    await create_topic(broker, "copies")
    seam = Seam(broker)
    writes = writes_over(broker, seam)
    try:
        assert await writes.write("copies", 0, request([b"a"])[0]) == 0
        seam.faults = [REFUSE]
        with pytest.raises(NotEnoughReplicas):
            await writes.write("copies", 0, request([b"refused"])[0])
        assert seam.calls == 2  # not retried
        assert await writes.write("copies", 0, request([b"b"])[0]) == 1
        values, producers = stored(broker, "copies")
        assert values == [b"a", b"b"]
        pid = producers[0][0]
        assert producers == [(pid, 0), (pid, 1)]
    finally:
        await writes.close()


async def test_a_write_given_up_at_its_deadline_gives_up_the_producer_id(broker):
    await create_topic(broker, "copies")
    seam = Seam(broker)
    writes = writes_over(broker, seam, deadline_s=0.5)
    try:
        assert await writes.write("copies", 0, request([b"a"])[0]) == 0
        seam.faults = [LOSE_ACK] * 1000  # every acknowledgement lost until the deadline
        with pytest.raises(RequestTimedOut):
            await writes.write("copies", 0, request([b"b"])[0])
        assert seam.calls > 2  # retried until the deadline
        seam.faults = []
        # a new producer id: the same sequence under the old one would be taken for a
        # duplicate of "b" and never stored
        assert await writes.write("copies", 0, request([b"c"])[0]) == 2
        values, producers = stored(broker, "copies")
        assert values == [b"a", b"b", b"c"]
        old = producers[0][0]
        assert producers[:2] == [(old, 0), (old, 1)]
        new, seq = producers[2]
        assert new not in (old, -1) and seq == 0
    finally:
        await writes.close()


async def test_a_write_cancelled_between_attempts_gives_up_the_producer_id(broker):
    await create_topic(broker, "copies")
    seam = Seam(broker)
    writes = InternalWrites(
        seam.append, LeaderClient(lambda: {}, broker.config.node_id), broker.produce_service.new_producer_id,
        backoff_s=(30.0, 30.0),  # the call waits to retry until it is cancelled
    )
    try:
        assert await writes.write("copies", 0, request([b"a"])[0]) == 0
        seam.faults = [LOSE_ACK]
        call = asyncio.ensure_future(writes.write("copies", 0, request([b"b"])[0]))
        deadline = time.monotonic() + 15
        while seam.calls < 2:
            assert time.monotonic() < deadline, "the write was not attempted"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await writes.write("copies", 0, request([b"c"])[0]) == 2
        values, producers = stored(broker, "copies")
        assert values == [b"a", b"b", b"c"]
        assert producers[2][0] != producers[0][0] and producers[2][1] == 0
    finally:
        await writes.close()


async def test_a_write_through_the_leader_whose_answer_is_lost_is_stored_once(broker_factory, open_partition):
    remote = broker_factory().start()  # leads "copies"; this side holds a follower
    await make_topic(remote.bootstrap, "copies")
    follower = open_partition(leader=False)
    leaders = LeaderClient(lambda: {0: BrokerRegistration(0, "127.0.0.1", remote.port)}, 999)
    produce, calls = leaders.produce, []

    async def lose_first_answer(topic: str, partition: int, data, internal: bool = False) -> int:
        calls.append(bytes(data))
        offset = await produce(topic, partition, data, internal=internal)
        if len(calls) == 1:
            raise ConnectionClosed("injected: stored, the connection closed before the answer")
        return offset

    leaders.produce = lose_first_answer
    writes = InternalWrites(
        partition_append(led_partition({"copies": topic_of("copies", follower)})), leaders, producer_ids(),
        backoff_s=(0.01, 0.05),
    )
    try:
        assert await writes.write("copies", 0, two_batches(b"a", b"b", b"c")) == 0
        assert len(calls) == 2 and calls[0] == calls[1]  # the same bytes again
        assert await writes.write("copies", 0, request([b"d"])[0]) == 3
        assert [r.value for r in await read_all(remote.bootstrap, "copies")] == [b"a", b"b", b"c", b"d"]
        assert follower.log_end_offset == 0
    finally:
        await writes.close()
