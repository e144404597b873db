"""An in-memory broker behind the client's connection-factory seam (unit tests only).

``FakeBroker.factory`` is passed as ``connection_factory``; ``FakeConnection.request`` answers
protocol structs directly (no sockets, no frames) and stores produced batches per partition
so tests can read records back with ``records.decode_records``.  Hooks: ``hold`` parks
produce requests until released, ``produce_errors`` answers the next produces with codes,
``delays`` slows a request type down, ``raises`` makes the connection raise the given
exceptions for the next requests of a type.  A fetch above the end answers
OFFSET_OUT_OF_RANGE, like the real broker.  Like a real broker it has the internal topic
``__groups`` (one partition, led by it), so group requests find their coordinator here.
"""

from __future__ import annotations

import asyncio

from sluice import errors
from sluice.protocol import messages, records
from sluice.protocol.coordinator import GROUPS_TOPIC


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
        self.requests: list = []  # every request, in arrival order

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
                            messages.PartitionMetadata(partition=p, leader=0)
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
        if kind is messages.ProduceRequest:
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
                if self.produce_errors:
                    code = self.produce_errors.pop(0)
                    results.append(
                        messages.ProducePartitionResult(
                            topic=p.topic, partition=p.partition, error=code
                        )
                    )
                    continue
                base = self.append(tp, chunk)
                results.append(
                    messages.ProducePartitionResult(
                        topic=p.topic, partition=p.partition, base_offset=base
                    )
                )
            return messages.ProduceResponse(partitions=results), memoryview(b"")
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
    """Connection-like: ``request``, ``send_noreply``, ``drain``, ``close``, ``closed``."""

    def __init__(self, broker: FakeBroker):
        self.broker = broker
        self.closed = False
        self.host, self.port = "fake", 1

    async def request(self, req, attachments=(), timeout=None, *, check=True):
        if self.closed:
            raise errors.ConnectionClosed("fake connection closed")
        try:
            resp, data = await asyncio.wait_for(self.broker.handle(req, attachments), timeout)
        except TimeoutError:
            self.closed = True  # like Connection: a timed-out request closes its connection
            raise errors.RequestTimedOut("fake request timed out") from None
        if resp.error and check:
            raise errors.error_for_code(resp.error, resp.message)
        return resp, data

    def send_noreply(self, req, attachments=()):
        asyncio.get_running_loop().create_task(self.broker.handle(req, attachments))

    async def drain(self):
        pass

    def close(self):
        self.closed = True

    async def wait_closed(self):
        pass
