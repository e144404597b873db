"""In-process collaborators for the broker's state-machine tests (no server, no sockets):
a connection that keeps what is pushed to it, topics of real ``Partition`` objects, and
the broker's own writes over them (``InternalWrites`` with the real partition append)."""

from __future__ import annotations

import asyncio
import itertools
import time

from sluice.broker.internal_writes import Append, InternalWrites, NewProducerId
from sluice.broker.leader_client import LeaderClient
from sluice.broker.registry import Topic
from sluice.cluster.store import TopicRecord
from sluice.errors import NotLeader, unknown_partition
from sluice.protocol import messages as m
from sluice.protocol.records import validate_batches


class Conn:
    """The part of a server connection (server/connection.py) that sessions and producer
    registrations use: ``push`` keeps each pushed message; ``close()`` runs the
    ``on_close`` callbacks, after which pushes fail as on a closed connection."""

    def __init__(self) -> None:
        self.pushed: list[tuple[int, object, list[bytes]]] = []
        self.writable = True
        self.closed = False
        self._on_close: list = []
        self._changed = asyncio.Event()

    def push(self, kind: int, version: int, msg, attachments=()) -> bool:
        if self.closed:
            return False
        self.pushed.append((kind, msg, [bytes(a) for a in attachments]))
        self._changed.set()
        return True

    def on_close(self, callback) -> None:
        self._on_close.append(callback)

    def on_writable(self, callback) -> None:
        pass  # always writable

    def close(self) -> None:
        self.closed = True
        for callback in self._on_close:
            callback()

    def deliveries(self) -> list[tuple[int, int]]:
        """Every (offset, attempt) delivered so far, in order."""
        return [
            (o, d.attempt)
            for kind, msg, _ in self.pushed if kind == m.Push.DELIVER
            for d in msg.deliveries for a, b in d.want for o in range(a, b)
        ]

    async def wait_deliveries(self, n: int, timeout: float = 10.0) -> list[tuple[int, int]]:
        """Wait until ``n`` offsets were delivered in all; returns them all."""
        deadline = time.monotonic() + timeout
        while len(self.deliveries()) < n:
            self._changed.clear()
            left = deadline - time.monotonic()
            assert left > 0, f"{len(self.deliveries())} of {n} deliveries: {self.deliveries()}"
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass
        return self.deliveries()


def topic_of(name: str, *parts, internal: bool = False) -> Topic:
    """A ``Topic`` whose partitions are ``parts`` (real ``Partition`` objects), all held here."""
    record = TopicRecord(name, len(parts), internal=internal, assignment=[[0]] * len(parts))
    return Topic(name, parts[0].config, record, [None] * len(parts), dict(enumerate(parts)))


def led_partition(topics: dict[str, Topic]):
    """``led_partition(topic, index)`` over ``topics``, as ``Broker.led_partition`` answers."""

    def lookup(topic: str, index: int):
        t = topics.get(topic)
        if t is None:
            raise NotLeader(f"no topic {topic!r} here")
        if not 0 <= index < t.count:
            raise unknown_partition(topic, index, t.count)
        p = t.partitions.get(index)
        if p is None or not p.is_leader:
            raise NotLeader(f"this broker does not lead {topic}-{index}")
        return p

    return lookup


def partition_append(led_partition) -> Append:
    """The ``Append`` over the partitions ``led_partition`` finds: each partition's own append,
    as the produce service queues a produce's batches."""

    async def append(topic: str, partition: int, data: bytearray, acks_all: bool) -> int:
        part = led_partition(topic, partition)
        spans = validate_batches(data, part.config.max_message_bytes)
        return (await part.append(data, spans, acks_all=acks_all)).base_offset

    return append


def producer_ids() -> NewProducerId:
    """Producer ids 0, 1, 2... each handed out once, as a broker's id block gives them."""
    ids = itertools.count()

    async def new_producer_id() -> int:
        return next(ids)

    return new_producer_id


def local_writes(topics: dict[str, Topic]) -> InternalWrites:
    """The broker's own writes over ``topics``, with no other broker to write through."""
    return InternalWrites(partition_append(led_partition(topics)), LeaderClient(lambda: {}, 0), producer_ids())
