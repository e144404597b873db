"""Audit copies: half messages given up after their checks, kept in ``__txn_discarded``.

After ``max_checks`` unanswered check-backs a half is rolled back with the reason
"discarded" (check_back.py) and its records are copied to the internal topic
``__txn_discarded`` (one partition, kept until an operator drops it), each with the
half's id, the reason and the number of checks in headers.  The rollback comes first: a
crash between the two loses the audit copy, never the decision, which the rollback marker
records with its reason.

The copies are the broker's own writes (broker/internal_writes.py): in-process when this
broker leads the audit partition, else through a client to its leader (a produce flagged
``internal``, which only brokers send).

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping

from sluice.broker.internal_writes import InternalWrites
from sluice.errors import NotLeader, TopicAlreadyExists
from sluice.protocol import messages as m
from sluice.protocol import transactions as tx
from sluice.protocol.records import build_batch, encode_record

log = logging.getLogger("sluice.broker.transactions")

DISCARD_TOPIC_CONFIG = {"retention.ms": "-1"}  # an audit trail: kept until an operator drops it


class AuditCopies:
    """Creates ``__txn_discarded`` and writes the copies into it.

    ``topics``: the topics by name (broker/topics.py ``Topic``); ``create_topic(new,
    validate_only=False, internal=True)`` under ``admin_lock`` creates a topic;
    ``stored_topics()``: the topic records of the metadata store (cluster/store.py
    ``MetadataStore.topics``); ``groups_ready()``: whether ``__groups`` exists (by then a
    new cluster has its brokers); ``writes``: the broker's own writes."""

    def __init__(
        self,
        topics: Mapping[str, object],
        create_topic: Callable[..., Awaitable[None]],
        admin_lock: asyncio.Lock,
        stored_topics: Callable[[], Awaitable[Mapping[str, object]]],
        groups_ready: Callable[[], bool],
        writes: InternalWrites,
    ) -> None:
        self._topics = topics
        self._create_topic = create_topic
        self._admin_lock = admin_lock
        self._stored_topics = stored_topics
        self._groups_ready = groups_ready
        self._writes = writes
        self._ready = False

    async def ensure_topic(self) -> None:
        """Create ``__txn_discarded`` (one partition, internal) once ``__groups`` exists:
        by then a new cluster has its brokers (broker.py ``_ensure_internal_topics``)."""
        if self._ready or not self._groups_ready():
            return
        if tx.DISCARD_TOPIC not in (await self._stored_topics()):
            new = m.NewTopic(name=tx.DISCARD_TOPIC, partitions=1, config=DISCARD_TOPIC_CONFIG)
            try:
                async with self._admin_lock:
                    await self._create_topic(new, validate_only=False, internal=True)
            except TopicAlreadyExists:
                pass
        self._ready = True

    async def write(self, half_id: str, recs: list, reason: str, checks: int) -> None:
        """Copy the records ``recs`` of the half ``half_id`` (acknowledged by every in-sync
        replica on return; raises otherwise)."""
        topic = self._topics.get(tx.DISCARD_TOPIC)
        if topic is None:
            raise NotLeader(f"{tx.DISCARD_TOPIC} does not exist yet")
        index = zlib.crc32(half_id.encode()) % topic.count
        now = _now_ms()
        body = b"".join(
            encode_record(i, 0, r.key, r.value, [
                *r.headers, (tx.ID_HEADER, half_id.encode()), (tx.REASON_HEADER, reason.encode()),
                (tx.CHECKS_HEADER, str(checks).encode()),
            ])
            for i, r in enumerate(recs)
        )
        data = bytearray(build_batch(body, len(recs), now, now))
        await self._writes.write(tx.DISCARD_TOPIC, index, data, internal=True)
        log.warning("%s %s; copied to %s-%d", half_id, reason, tx.DISCARD_TOPIC, index)

    async def close(self) -> None:
        await self._writes.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
