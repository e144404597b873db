"""The produce service: validate batches, queue them on the partitions' writers, answer;
and the producer ids handed out by this broker.

``ProduceService`` serves PRODUCE and INIT_PRODUCER_ID for any front door, and ``append``
for writers inside the broker (dead letters, transaction audit copies, group commits),
so that they write through the same checks as clients, without a client of their own.

The produce path does no per-record Python work: batches are checked as whole spans
(protocol/records.py ``validate_batches``, C when built) and handed to the partition's
writer as one slice of the request's attachments; nothing is copied here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from sluice.broker.partition import Partition
from sluice.broker.peer import Peer
from sluice.broker.registry import TopicRegistry
from sluice.broker.results import error_fields
from sluice.cluster.store import MetadataStore
from sluice.errors import (
    BrokerError,
    CorruptRecord,
    InvalidRecord,
    InvalidRequest,
    MessageTooLarge,
    MetadataUnavailable,
    RequestTimedOut,
)
from sluice.protocol import messages as m
from sluice.protocol.records import BatchTooLarge, validate_batches
from sluice.protocol.transactions import DISCARD_TOPIC

# ids handed out by brokers stay below this; ids from it up are the callers' own (a Spark
# sink derives its tasks' identities), so the two never meet
DERIVED_PRODUCER_IDS = 1 << 62
PRODUCER_ID_BLOCK = 1000  # ids a broker reserves from the metadata store at a time
RESERVE_RETRY_S = (0.5, 10.0)  # first and longest wait between tries of reserving at start

# The internal topics brokers write with a produce request flagged ``internal`` (the
# audit copies of discarded half messages).  Every other internal topic is written by its
# leader's own code only, and brokers rebuild their state from it, so no request may write
# it (a produce cannot tell a broker from a client) nor change how long it keeps records.
PRODUCED_INTERNAL = frozenset({DISCARD_TOPIC})


class HalfMessages(Protocol):
    """What the produce path tells the transaction manager (broker/transactions/)."""

    def track(self, part: Partition, spans, chunk, fut: asyncio.Future) -> None: ...


class ProduceService:
    """PRODUCE and INIT_PRODUCER_ID, and the in-process ``append``.  Event loop only.

    Collaborators: ``topics``, where partitions are looked up (only those led here take
    writes); ``transactions``, told of every queued write (half messages); ``store``, the
    metadata store producer id blocks are reserved from; ``store_is_ours``, asked before a
    new block is reserved (a wiped store's counter starts again at 0)."""

    def __init__(
        self, topics: TopicRegistry, transactions: HalfMessages, store: MetadataStore,
        store_is_ours: Callable[..., Awaitable[bool]],
    ) -> None:
        self.topics = topics
        self.transactions = transactions
        self.metadata = store
        self.store_is_ours = store_is_ours
        self._producer_ids = (0, -1)  # the next id to hand out, the last reserved
        self._producer_ids_lock = asyncio.Lock()

    def handlers(self) -> dict:
        return {m.Api.PRODUCE: self.produce, m.Api.INIT_PRODUCER_ID: self.init_producer_id}

    async def reserve_producer_ids(self) -> None:
        """At start, reserve a block of producer ids before any producer asks, so that
        producers starting during a later outage of the metadata store still get theirs
        (until the block is used up).  Retried until the store answers."""
        delay = RESERVE_RETRY_S[0]
        while True:
            try:
                async with self._producer_ids_lock:
                    await self._producer_id_block()
                return
            except MetadataUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESERVE_RETRY_S[1])

    async def _producer_id_block(self) -> tuple[int, int]:
        """(next id, last id) of this broker's block, a new block reserved in the metadata
        store when this one is used up.  ``_producer_ids_lock`` held."""
        nxt, last = self._producer_ids
        if nxt > last:
            if not await self.store_is_ours(wait=False):  # a wiped store's counter starts again at 0
                raise MetadataUnavailable("the metadata store is not this broker's cluster's")
            nxt, last = self._producer_ids = await self.metadata.allocate_producer_ids(PRODUCER_ID_BLOCK)
        return nxt, last

    async def init_producer_id(self, req: m.InitProducerIdRequest, _att, _peer: Peer):
        """A new producer id (``new_producer_id``), epoch 0."""
        return m.InitProducerIdResponse(producer_id=await self.new_producer_id(), producer_epoch=0), ()

    async def new_producer_id(self) -> int:
        """A producer id no other producer of the cluster was or will be given: taken from a
        block this broker reserved in the metadata store (blocks never overlap, across
        brokers and restarts; an id unused when the broker stops is skipped).  For clients
        (INIT_PRODUCER_ID) and the broker's own writes (broker/internal_writes.py).  Raises
        ``MetadataUnavailable`` when a new block cannot be reserved, ``InvalidRequest``
        when the ids are exhausted."""
        async with self._producer_ids_lock:
            nxt, last = await self._producer_id_block()
            if last >= DERIVED_PRODUCER_IDS:
                raise InvalidRequest("the cluster's producer ids are exhausted")
            self._producer_ids = (nxt + 1, last)
        return nxt

    async def produce(self, req: m.ProduceRequest, att: memoryview, _peer: Peer):
        """Validate each partition's batches, queue them on its writer, await the acks.

        ``acks=leader`` is answered once the batches are appended (and fsynced with
        ``flush.messages=1``); ``acks=all`` once the high watermark passes them, i.e. every
        in-sync replica has them, within ``timeout_ms`` (else ``REQUEST_TIMED_OUT``, the
        records may be stored).  Refusals come at once: ``NOT_ENOUGH_REPLICAS``,
        ``BROKER_BUSY`` (see broker/leader_append.py); ``INVALID_REQUEST`` for an internal
        topic (only brokers write those).  Batches of idempotent producers are checked by
        the partition's writer (storage/producers.py): a duplicate is answered with its
        original offset, ``OUT_OF_ORDER_SEQUENCE`` / ``PRODUCER_FENCED`` write nothing of the
        partition's part.  Version 2 answers each batch's base offset (``batch_offsets``).
        """
        if req.acks not in (m.ACKS_NONE, m.ACKS_LEADER, m.ACKS_ALL):
            raise InvalidRequest(f"acks must be 0 (none), 1 (leader) or -1 (all), not {req.acks}")
        total = sum(p.size for p in req.partitions)
        if total != len(att) or any(p.size < 0 for p in req.partitions):
            raise InvalidRequest(f"partition sizes add up to {total}, attachments hold {len(att)} bytes")
        results: list[m.ProducePartitionResult | None] = []
        pending: list[tuple[int, asyncio.Future]] = []
        pos = 0
        deadline = asyncio.get_running_loop().time() + max(req.timeout_ms, 1) / 1000
        for p in req.partitions:
            chunk = att[pos : pos + p.size]
            pos += p.size
            try:
                part = self.topics.partition(p.topic, p.partition)
                if self.topics.topics[p.topic].internal and not (req.internal and p.topic in PRODUCED_INTERNAL):
                    raise InvalidRequest(f"topic {p.topic} is internal: written by brokers only")
                spans = _validate(part, chunk)
            except BrokerError as exc:
                results.append(m.ProducePartitionResult(topic=p.topic, partition=p.partition, **error_fields(exc)))
                continue
            fut = part.append(chunk, spans, req.acks == m.ACKS_ALL, deadline)
            self.transactions.track(part, spans, chunk, fut)  # half messages (broker/transactions/)
            pending.append((len(results), fut))
            results.append(None)
        if req.acks == m.ACKS_NONE:
            # no answer, but the frame stays counted against the connection until written
            if pending:
                await asyncio.wait([f for _, f in pending])
            for _, fut in pending:
                _consume_exception(fut)
            return None
        if pending:
            try:
                await asyncio.wait([f for _, f in pending], timeout=max(req.timeout_ms, 1) / 1000)
            except asyncio.CancelledError:
                # The connection is gone: nobody will learn the outcome, and the client may
                # already be retrying elsewhere.  Withdraw what no writer has taken yet, so
                # the broker never runs an abandoned copy beside the retry.
                for _, fut in pending:
                    fut.cancel()
                raise
        v2 = isinstance(req, m.ProduceRequestV2)
        result_type = m.ProducePartitionResultV2 if v2 else m.ProducePartitionResult
        if v2:  # refusals made above as version 1 results
            results = [r if r is None else result_type(**msgspec.structs.asdict(r)) for r in results]
        for i, fut in pending:
            p = req.partitions[i]
            part = self.topics.topics.get(p.topic)
            if not fut.done():
                fut.add_done_callback(_consume_exception)
                late = RequestTimedOut(f"write not completed within {req.timeout_ms} ms")
                results[i] = result_type(topic=p.topic, partition=p.partition, **error_fields(late))
            elif fut.exception() is not None:
                results[i] = result_type(topic=p.topic, partition=p.partition, **error_fields(fut.exception()))
            else:
                r = fut.result()
                start = part.partitions[p.partition].log_start_offset if part else -1
                extra = {"batch_offsets": list(r.batch_offsets)} if v2 else {}
                results[i] = result_type(
                    topic=p.topic, partition=p.partition, base_offset=r.base_offset,
                    log_append_time=r.append_time, log_start_offset=start, **extra,
                )
        if v2:
            return m.ProduceResponseV2(partitions=results), ()
        return m.ProduceResponse(partitions=results), ()

    def append(self, topic: str, index: int, data, acks_all: bool = True, deadline: float | None = None) -> asyncio.Future:
        """Queue record batches written inside the broker on partition ``index`` of
        ``topic`` led here, as a produce would, and return the writer's future (an
        ``AppendResult``: base offset, append time, each batch's offset).

        ``data``: whole record batches (protocol/records.py) in a writable buffer (a
        ``bytearray``: the writer patches offsets and times in place), built by the caller
        and not touched again until the future is done.  Internal topics are accepted (the broker is
        their writer).  Checked as a produce's: ``UnknownTopic``, ``UnknownPartition``,
        ``NotLeader`` (not led here), ``MessageTooLarge``, ``InvalidRecord`` are raised
        at once, nothing queued; the future fails with what the partition refuses or
        loses (``NotEnoughReplicas``, ``BrokerBusy``, ``LeadershipLost``, storage errors).
        ``acks_all``: done once every in-sync replica has the batches (else once
        appended); ``deadline`` (event loop time): when an ``acks_all`` wait gives up
        (``RequestTimedOut``; the batches may be stored).  Half messages among them are tracked like a client's.  Event loop only;
        no await: the write is queued when this returns."""
        part = self.topics.led_partition(topic, index)
        view = memoryview(data)
        spans = _validate(part, view)
        fut = part.append(view, spans, acks_all, deadline)
        self.transactions.track(part, spans, view, fut)
        return fut


def _validate(part: Partition, chunk: memoryview):
    """The spans of the record batches in ``chunk`` for ``part`` (``MessageTooLarge``,
    ``InvalidRecord``)."""
    max_bytes = part.config.max_message_bytes
    try:
        return validate_batches(chunk, max_bytes)
    except BatchTooLarge as exc:
        raise MessageTooLarge(
            f"batch of {exc.size} bytes exceeds max.message.bytes={max_bytes} of topic {part.topic!r}"
        ) from None
    except CorruptRecord as exc:
        raise InvalidRecord(str(exc)) from None


def _consume_exception(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
