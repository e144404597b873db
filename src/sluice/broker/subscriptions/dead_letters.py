"""Dead letters: copies of the messages a subscription gave up on.

A message delivered ``max_attempts`` times without an ack (the delivery decides:
delivery.py) is copied to the topic ``<topic>.<subscription>.dlq`` (created with one
partition when missing) with its key, value and headers plus the ``sluice.dlq.*`` headers
(protocol/subscriptions.py), and only once every copy is acknowledged by the in-sync
replicas of its partition is the message acked in the source.  A copy is never lost: the
writes retry an unknown outcome with the same producer id and sequence, so a copy is
stored once; only a write that still ends unknown (internal_writes.py says when) is
written again later, and may then be stored twice.

The copies are the broker's own writes (broker/internal_writes.py): in-process when this
broker leads the dead-letter partition, else through a client to its leader.  A keyed
copy goes to the partition of its key's hash, as a producer would put it
(client/partitioning.py); the keyless ones of one call go together to one partition,
the next in turn at each call.

Event loop only; records are read through ``Partition.read`` (off the loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import crc32c

from sluice.broker.internal_writes import InternalWrites
from sluice.errors import NotLeader, TopicAlreadyExists
from sluice.protocol import messages as m
from sluice.protocol import subscriptions as sub
from sluice.protocol.ranges import Pairs, RangeSet
from sluice.protocol.records import build_batch, decode_records, encode_record, iter_batches

log = logging.getLogger("sluice.broker.subscriptions")

READ_BYTES = 4 * 1024 * 1024  # per read of the messages to copy
BATCH_BYTES = 256 * 1024  # records of a copy batch, at most (one record more if it is alone)
DLQ_PARTITIONS = 1  # of a dead-letter topic the broker creates


class DeadLetters:
    """Writes dead-letter copies.  ``topics``: the topics by name (broker/topics.py
    ``Topic``: ``count``); ``create_topic(new, validate_only=False)`` creates a topic
    (``TopicAlreadyExists``), called holding ``admin_lock`` (topic creations and deletions
    run one at a time); ``writes``: the broker's own writes."""

    def __init__(
        self,
        topics: Mapping[str, object],
        create_topic: Callable[..., Awaitable[None]],
        admin_lock: asyncio.Lock,
        writes: InternalWrites,
    ) -> None:
        self._topics = topics
        self._create_topic = create_topic
        self._admin_lock = admin_lock
        self._writes = writes
        self._turn = 0  # the partition of the next keyless copies

    async def copy(self, part, subscription: str, ranges: Pairs, attempts: int, reason: str) -> None:
        """Copy the messages of ``part`` at ``ranges`` to the dead-letter topic of
        ``subscription``; returns once every copy is acknowledged by every in-sync replica
        of its partition (raises otherwise: some may be stored)."""
        records = await _read(part, ranges)
        topic = sub.dlq_topic(part.topic, subscription)
        await self.ensure_topic(topic)
        headers = [
            (sub.DLQ_TOPIC, part.topic.encode()), (sub.DLQ_PARTITION, str(part.index).encode()),
            (sub.DLQ_SUBSCRIPTION, subscription.encode()), (sub.DLQ_ATTEMPTS, str(attempts).encode()),
            (sub.DLQ_REASON, reason.encode()),
        ]
        found = self._topics.get(topic)
        if found is None:  # created by another broker: not opened here yet
            raise NotLeader(f"dead-letter topic {topic!r} is not known here yet")
        n = found.count
        keyless = self._turn % n
        self._turn += 1
        by_partition: dict[int, list[tuple]] = {}
        for r in records:
            p = keyless if r.key is None else crc32c.crc32c(r.key) % n
            by_partition.setdefault(p, []).append(
                (r.key, r.value, [*r.headers, *headers, (sub.DLQ_OFFSET, str(r.offset).encode())])
            )
        await asyncio.gather(*(
            self._writes.write(topic, p, _batches(copies)) for p, copies in sorted(by_partition.items())
        ))
        log.warning(
            "dead-lettered %d message(s) of %s-%d for subscription %s to %s after %d attempt(s): %s",
            len(records), part.topic, part.index, subscription, topic, attempts, reason,
        )

    async def ensure_topic(self, name: str) -> None:
        """Create the dead-letter topic ``name`` unless it exists."""
        if name in self._topics:
            return
        try:
            async with self._admin_lock:
                if name not in self._topics:
                    await self._create_topic(m.NewTopic(name=name, partitions=DLQ_PARTITIONS), validate_only=False)
        except TopicAlreadyExists:
            pass


async def _read(part, ranges: Pairs) -> list:
    """The stored records of ``part`` at ``ranges`` (below its high watermark)."""
    wanted = RangeSet(ranges)
    records = []
    offset = wanted.starts[0]
    end = wanted.ends[-1]
    while offset < end:
        data = (await part.read(offset, READ_BYTES, part.high_watermark)).data
        recs = decode_records(data, part.topic, part.index, offset)
        records.extend(r for r in recs if r.offset in wanted)
        nxt = max((h.next_offset for h, _ in iter_batches(data, check_crc=False)), default=None)
        if nxt is None or nxt <= offset:
            break
        offset = nxt
    return records


def _batches(copies: list[tuple]) -> bytearray:
    """``(key, value, headers)`` as concatenated batches of about ``BATCH_BYTES`` at most
    each (a larger record alone in its own)."""
    out = bytearray()
    now = int(time.time() * 1000)
    batch: list[bytes] = []
    size = 0
    for key, value, headers in copies:
        record = encode_record(len(batch), 0, key, value, headers)
        if batch and size + len(record) > BATCH_BYTES:
            out += build_batch(b"".join(batch), len(batch), now, now)
            batch, size = [], 0
            record = encode_record(0, 0, key, value, headers)
        batch.append(record)
        size += len(record)
    if batch:
        out += build_batch(b"".join(batch), len(batch), now, now)
    return out
