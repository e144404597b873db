"""An in-memory broker behind the client's connection-factory seam (unit tests only).

``FakeBroker.factory`` is passed as ``connection_factory``; ``FakeConnection.request`` answers
protocol structs directly (no sockets, no frames) and stores produced batches per partition
so tests can read records back with ``records.decode_records``.  Hooks: ``hold`` parks
produce requests until released, ``produce_errors`` answers the next produce parts with codes (0: handled as usual),
``delays`` slows a request type down, ``leaderless`` partitions have no leader in metadata, ``raises`` makes the connection raise the given
exceptions for the next requests of a type, ``lose_responses`` handles the next produce
requests and then breaks the connection instead of answering (the write was stored).

Idempotent producers get the broker's contract (DESIGN §4): ``INIT_PRODUCER_ID`` hands out
ids from 1000; per (producer id, partition) the epoch and the last 5 batches are kept; a
batch is written when its base sequence is the next one, answered as a duplicate with its
original offset (or -1 when wholly before the last 5), refused with OUT_OF_ORDER_SEQUENCE
otherwise, or PRODUCER_FENCED for an older epoch; a partition's part of a request is
checked as a whole.  ``producers`` exposes that state to tests.  A fetch above the end answers
OFFSET_OUT_OF_RANGE, like the real broker.  Like a real broker it has the internal topic
``__groups`` (one partition, led by it), so group requests find their coordinator here.
"""

from __future__ import annotations

import asyncio
from collections import deque

from sluice import errors
from sluice.protocol import messages, records
from sluice.protocol.coordinator import GROUPS_TOPIC

SEQ_MOD = 1 << 31


class ProducerState:
    """One producer's state on one partition: epoch, next sequence, last 5 batches."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.next_seq: int | None = None
        self.batches: deque[tuple[int, int, int]] = deque(maxlen=5)  # (first, last, offset)

    def copy(self) -> ProducerState:
        out = ProducerState(self.epoch)
        out.next_seq = self.next_seq
        out.batches = deque(self.batches, maxlen=5)
        return out


def _check(state: ProducerState | None, span) -> tuple[str, int, ProducerState]:
    """(outcome, offset of a duplicate, state after) for one idempotent batch."""
    first = span.base_sequence
    last = (first + span.count - 1) % SEQ_MOD
    if state is None or span.producer_epoch > state.epoch:
        return "write", -1, ProducerState(span.producer_epoch)
    if span.producer_epoch < state.epoch:
        return "fenced", -1, state
    for f, lst, off in state.batches:
        if (f, lst) == (first, last):
            return "dup", off, state
    if state.next_seq is None or first == state.next_seq:
        return "write", -1, state
    oldest = state.batches[0][0] if state.batches else state.next_seq
    if 0 < (oldest - last) % SEQ_MOD <= 1 << 30 and 0 < (oldest - first) % SEQ_MOD <= 1 << 30:
        return "dup", -1, state
    return "out_of_order", -1, state


class FakeBroker:
    def __init__(self, topics: dict[str, int] | None = None, max_message_bytes: int = 1 << 20):
        self.partitions: dict[str, int] = {GROUPS_TOPIC: 1, **(topics or {})}
        self.max_message_bytes = max_message_bytes
        self.logs: dict[tuple[str, int], list[bytes]] = {}
        self.next_offset: dict[tuple[str, int], int] = {}
        self.produce_requests: list[messages.ProduceRequest] = []
        self.produce_errors: list[int] = []  # codes answered to the next produces
        self.hold = False
        self._held: list[asyncio.Future] = []
        self.committed: dict[tuple[str, str, int], int] = {}
        self.connections: list[FakeConnection] = []
        self.delays: dict[type, float] = {}  # request type -> seconds before answering
        self.raises: dict[type, list[BaseException]] = {}  # request type -> next exceptions
        self.leaderless: set[tuple[str, int]] = set()  # partitions metadata gives no leader
        self.requests: list = []  # every request, in arrival order
        self.producers: dict[tuple[int, tuple[str, int]], ProducerState] = {}
        self.next_producer_id = 1000
        self.lose_responses = 0  # produce requests handled, then answered by a broken connection

    async def factory(self, host: str, port: int) -> FakeConnection:
        conn = FakeConnection(self)
        self.connections.append(conn)
        return conn

    def release(self) -> None:
        self.hold = False
        held, self._held = self._held, []
        for f in held:
            if not f.done():
                f.set_result(None)

    def records(self, topic: str, partition: int) -> list[records.Record]:
        out = []
        for batch in self.logs.get((topic, partition), []):
            out += records.decode_records(batch, topic, partition)
        return out

    def produce_part(self, tp: tuple[str, int], chunk: bytes) -> tuple[int, list[int]]:
        """Check one partition's part as a whole and write it: (error code, batch offsets)."""
        spans = records.validate_batches(bytearray(chunk), self.max_message_bytes)
        staged: dict[int, ProducerState | None] = {}
        plan = []
        for span in spans:
            if span.producer_id < 0:
                plan.append(("write", -1, span))
                continue
            key = (span.producer_id, tp)
            state = staged[span.producer_id] if span.producer_id in staged else self.producers.get(key)
            outcome, offset, state = _check(state, span)
            if outcome == "fenced":
                return errors.ProducerFenced.code, []
            if outcome == "out_of_order":
                return errors.OutOfOrderSequence.code, []
            if outcome == "write":
                state = state.copy()
                state.next_seq = (span.base_sequence + span.count) % SEQ_MOD
            staged[span.producer_id] = state
            plan.append((outcome, offset, span))
        offsets = []
        for outcome, offset, span in plan:
            if outcome == "dup":
                offsets.append(offset)
                continue
            base = self.append(tp, chunk[span.pos : span.pos + span.size])
            offsets.append(base)
            if span.producer_id >= 0:
                state = staged[span.producer_id]
                first = span.base_sequence
                state.batches.append((first, (first + span.count - 1) % SEQ_MOD, base))
        for pid, state in staged.items():
            self.producers[(pid, tp)] = state
        return 0, offsets

    def append(self, tp: tuple[str, int], data: bytes) -> int:
        buf = bytearray(data)
        spans = records.validate_batches(buf, self.max_message_bytes)
        base = self.next_offset.get(tp, 0)
        self.next_offset[tp] = records.assign_offsets(buf, spans, base, 0, None)
        self.logs.setdefault(tp, []).append(bytes(buf))
        return base

    # ------------------------------------------------------------------ handlers

    async def handle(self, req, attachments):
        kind = type(req)
        self.requests.append(req)
        if self.raises.get(kind):
            raise self.raises[kind].pop(0)
        if kind in self.delays:
            await asyncio.sleep(self.delays[kind])
        if kind is messages.MetadataRequest:
            names = self.partitions if req.topics is None else req.topics
            topics = []
            for name in names:
                if name not in self.partitions:
                    topics.append(messages.TopicMetadata(name=name, error=4))
                    continue
                topics.append(
                    messages.TopicMetadata(
                        name=name,
                        partitions=[
                            messages.PartitionMetadata(partition=p, leader=-1 if (name, p) in self.leaderless else 0)
                            for p in range(self.partitions[name])
                        ],
                        max_message_bytes=self.max_message_bytes,
                        internal=name == GROUPS_TOPIC,
                    )
                )
            return messages.MetadataResponse(
                brokers=[messages.BrokerInfo(node_id=0, host="fake", port=1)],
                controller_id=0,
                topics=topics,
            ), memoryview(b"")
        if kind is messages.InitProducerIdRequest:
            self.next_producer_id += 1
            return messages.InitProducerIdResponse(
                producer_id=self.next_producer_id - 1, producer_epoch=0
            ), memoryview(b"")
        if kind in (messages.ProduceRequest, messages.ProduceRequestV2):
            v2 = kind is messages.ProduceRequestV2
            self.produce_requests.append(req)
            if self.hold:
                fut = asyncio.get_running_loop().create_future()
                self._held.append(fut)
                await fut
            data = b"".join(bytes(a) for a in attachments)
            results, pos = [], 0
            for p in req.partitions:
                tp = (p.topic, p.partition)
                chunk = data[pos : pos + p.size]
                pos += p.size
                result = messages.ProducePartitionResultV2 if v2 else messages.ProducePartitionResult
                if self.produce_errors and (code := self.produce_errors.pop(0)):  # 0: as usual
                    results.append(result(topic=p.topic, partition=p.partition, error=code))
                    continue
                code, offsets = self.produce_part(tp, chunk)
                if code:
                    results.append(result(topic=p.topic, partition=p.partition, error=code))
                elif v2:
                    results.append(result(
                        topic=p.topic, partition=p.partition, base_offset=offsets[0], batch_offsets=offsets
                    ))
                else:
                    results.append(result(topic=p.topic, partition=p.partition, base_offset=offsets[0]))
            if self.lose_responses:
                self.lose_responses -= 1
                raise errors.ConnectionClosed("fake connection broke before the answer")
            response = messages.ProduceResponseV2 if v2 else messages.ProduceResponse
            return response(partitions=results), memoryview(b"")
        if kind is messages.FetchRequest:
            results, parts = [], []
            for p in req.partitions:
                tp = (p.topic, p.partition)
                if p.offset > self.next_offset.get(tp, 0):
                    results.append(
                        messages.FetchPartitionResult(
                            topic=p.topic, partition=p.partition, error=11, message="out of range"
                        )
                    )
                    continue
                blob = b"".join(self.logs.get(tp, []))
                results.append(
                    messages.FetchPartitionResult(
                        topic=p.topic,
                        partition=p.partition,
                        size=len(blob),
                        high_watermark=self.next_offset.get(tp, 0),
                    )
                )
                parts.append(blob)
            if not any(parts):
                await asyncio.sleep(req.max_wait_ms / 1000)
            return messages.FetchResponse(partitions=results), memoryview(b"".join(parts))
        if kind is messages.ListOffsetsRequest:
            out = []
            for p in req.partitions:
                tp = (p.topic, p.partition)
                off = 0 if p.timestamp == messages.EARLIEST else self.next_offset.get(tp, 0)
                out.append(
                    messages.ListOffsetsResult(topic=p.topic, partition=p.partition, offset=off)
                )
            return messages.ListOffsetsResponse(partitions=out), memoryview(b"")
        if kind is messages.OffsetCommitRequest:
            for o in req.offsets:
                self.committed[(req.group, o.topic, o.partition)] = o.offset
            return messages.OffsetCommitResponse(), memoryview(b"")
        if kind is messages.OffsetFetchRequest:
            return messages.OffsetFetchResponse(
                offsets=[
                    messages.FetchedOffset(
                        topic=p.topic,
                        partition=p.partition,
                        offset=self.committed.get((req.group, p.topic, p.partition), -1),
                    )
                    for p in req.partitions or []
                ]
            ), memoryview(b"")
        if kind is messages.CreateTopicsRequest:
            res = []
            for t in req.topics:
                if t.name in self.partitions:
                    res.append(messages.TopicResult(name=t.name, error=6, message="exists"))
                else:
                    self.partitions[t.name] = t.partitions
                    res.append(messages.TopicResult(name=t.name))
            return messages.CreateTopicsResponse(topics=res), memoryview(b"")
        raise errors.UnsupportedVersion(kind.__name__)


class FakeConnection:
    """Connection-like: ``request``, ``write_request``, ``send_noreply``, ``drain``,
    ``close``, ``closed``."""

    def __init__(self, broker: FakeBroker):
        self.broker = broker
        self.closed = False
        self.host, self.port = "fake", 1

    async def request(self, req, attachments=(), timeout=None, *, check=True):
        if self.closed:
            raise errors.ConnectionClosed("fake connection closed")
        try:
            resp, data = await asyncio.wait_for(self.broker.handle(req, attachments), timeout)
        except errors.ConnectionClosed:
            self.closed = True
            raise
        except TimeoutError:
            self.closed = True  # like Connection: a timed-out request closes its connection
            raise errors.RequestTimedOut("fake request timed out") from None
        if resp.error and check:
            raise errors.error_for_code(resp.error, resp.message)
        return resp, data

    def write_request(self, req, attachments=(), timeout=None, *, check=True):
        """As ``Connection.write_request``: the broker has the request from now on (it
        starts handling it on the loop's next turn); the future of its answer."""
        if self.closed:
            raise errors.ConnectionClosed("fake connection closed")
        return asyncio.ensure_future(self.request(req, attachments, timeout, check=check))

    def send_noreply(self, req, attachments=()):
        asyncio.get_running_loop().create_task(self.broker.handle(req, attachments))

    async def drain(self):
        pass

    def close(self):
        self.closed = True

    async def wait_closed(self):
        pass
