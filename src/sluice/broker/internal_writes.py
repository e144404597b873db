"""The broker's own writes into partitions: dead letters and the audit copies of discarded
half messages.

A partition this broker leads is written in-process, through one narrow callable, the
``Append`` the broker hands over (its produce service's ``append``, broker/produce.py); a
partition another broker leads is written through a client to that broker
(leader_client.py).  Never through a client to this broker itself.

The ``Append`` contract: ``await append(topic, partition, data, acks_all)`` appends
``data`` — one or more whole record batches, as a produce request carries them, built by
the caller (their base offsets are set on append) — to ``topic``-``partition`` if this
broker leads it, and returns the base offset of the first batch once it is acknowledged:
with ``acks_all``, once every in-sync replica has it (the produce path's ``acks=all``).
It raises ``NotLeader`` when this broker does not lead the partition (no replica here, a
follower, a leader giving up), ``UnknownTopic`` / ``UnknownPartition``, and whatever an
append raises (``NotEnoughReplicas`` with nothing written; ``RequestTimedOut``,
``NotEnoughReplicasAfterAppend``, ``StorageError``: maybe stored).  The batches are the
broker's own: internal topics are writable; a batch above the target topic's
``max.message.bytes`` is refused as a produce's is (``MessageTooLarge``).

**Idempotence.**  The writes are an idempotent producer's: a producer id taken from this
broker's producer-id blocks (``NewProducerId``: the produce service's
``new_producer_id``) on first use, epoch 0, and per partition the sequence of the next
record.  Each call's batches are stamped with the id and consecutive sequences, and a
partition takes one call at a time, so its sequences arrive in order.  An attempt whose
outcome is unknown (``RequestTimedOut``, ``NotEnoughReplicasAfterAppend``,
``LeadershipLost``, ``StorageError``, a connection closed after the request was sent) is
retried with the same bytes, in-process or at the leader as the partition's leadership
then stands, until one is acknowledged — a batch stored already is answered by the
leader's idempotence check (storage/producers.py) as a duplicate, with its original
offset — or ``RETRY_DEADLINE_S`` passes.  So:

- a call that returns stored its batches exactly once;
- a call refused before any attempt could store anything (``NotEnoughReplicas``,
  ``NotLeader``, ``MessageTooLarge``, ``UnknownTopic``...) raises at once, stored nothing,
  and the partition's sequence stays where it was;
- a call that raises after an attempt of unknown outcome (the deadline passed, a later
  answer is not retriable, or its task was cancelled) may have stored its batches once.
  The partition's sequence is unknown then, so the producer id is given up: the next
  call of any partition takes a new one.  The caller redoing that copy may store it a
  second time.  An ``OutOfOrderSequence`` / ``ProducerFenced`` answer (the partition's
  state of the producer is not this one's: nothing of the call stored) gives up the
  producer id too, and a cancelled first attempt does, its fate being unknown.

Across a restart of the broker nothing is kept (a new process takes a new producer id):
a copy whose call was cut by the restart, and that the caller writes again after it, may
be stored twice.  These two — a call raising after an unknown outcome, and a restart —
are the only ways a copy is stored twice.

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sluice.broker.leader_client import LeaderClient
from sluice.errors import (
    BrokerError,
    BrokerUnreachable,
    ConnectionClosed,
    HandshakeTimeout,
    InvalidRecord,
    NotLeader,
    OutOfOrderSequence,
    ProducerFenced,
    StorageError,
)
from sluice.protocol.records import iter_batches, stamp_producer
from sluice.storage.producers import seq_add

log = logging.getLogger("sluice.broker")

Append = Callable[[str, int, bytearray, bool], Awaitable[int]]
NewProducerId = Callable[[], Awaitable[int]]

RETRY_BACKOFF_S = (0.05, 1.0)  # first and longest wait between attempts of one call
RETRY_DEADLINE_S = 60.0  # after which a call of unknown outcome gives up
PRODUCER_EPOCH = 0


class _Sequence:
    """One partition's next sequence under ``producer_id``, and the lock that keeps its
    calls one at a time."""

    __slots__ = ("lock", "producer_id", "next")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.producer_id = -1
        self.next = 0


class InternalWrites:
    """Writes batches of the broker's own to a partition's leader, idempotently: this broker
    in-process (``append``), another through ``leaders``; ``new_producer_id()`` gives the
    producer id (taken on first use, and again after a call gave one up).
    ``deadline_s`` and ``backoff_s``: how long a call retries an attempt of unknown
    outcome, and the first and longest wait between attempts."""

    def __init__(
        self, append: Append, leaders: LeaderClient, new_producer_id: NewProducerId, *,
        deadline_s: float = RETRY_DEADLINE_S, backoff_s: tuple[float, float] = RETRY_BACKOFF_S,
    ) -> None:
        self._append = append
        self._leaders = leaders
        self._new_producer_id = new_producer_id
        self._deadline_s = deadline_s
        self._backoff_s = backoff_s
        self._producer_id = -1  # -1: none yet, or given up
        self._producer_id_lock = asyncio.Lock()
        self._sequences: dict[tuple[str, int], _Sequence] = {}

    async def write(self, topic: str, partition: int, data: bytearray, internal: bool = False) -> int:
        """Append ``data`` (whole batches without producer fields) with ``acks=all`` at the
        partition's leader, stored once (module docstring); returns the base offset of its
        first batch (-1 when acknowledged as a duplicate whose original the leader no longer
        places: a retried call of more than five batches).  ``internal``: an internal
        topic's (brokers only).  Raises as the append or the leader does; ``NotLeader``
        while no broker leads the partition, or while the metadata name this broker and it
        does not lead it yet (try again)."""
        seq = self._sequences.get((topic, partition))
        if seq is None:
            seq = self._sequences[(topic, partition)] = _Sequence()
        async with seq.lock:
            producer_id = await self._current_producer_id()
            if seq.producer_id != producer_id:
                seq.producer_id, seq.next = producer_id, 0
            stamped, records = _stamp(data, producer_id, seq.next)
            offset = await self._deliver(topic, partition, stamped, internal, producer_id)
            seq.next = seq_add(seq.next, records)
            return offset

    async def _current_producer_id(self) -> int:
        async with self._producer_id_lock:
            if self._producer_id < 0:
                self._producer_id = await self._new_producer_id()
            return self._producer_id

    def _give_up(self, producer_id: int) -> None:
        """A partition's sequence under ``producer_id`` is unknown: later calls take a new id."""
        if self._producer_id == producer_id:
            self._producer_id = -1

    async def _deliver(self, topic: str, partition: int, stamped: bytes, internal: bool, producer_id: int) -> int:
        """Attempts of ``stamped`` until one is acknowledged (module docstring).  Whatever
        ends the call after an attempt of unknown outcome — an error, the deadline, a
        cancellation, even during the wait between attempts — gives up the producer id."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline_s
        delay = self._backoff_s[0]
        unknown = False  # some attempt may have stored the batches
        try:
            while True:
                sent = False
                try:
                    try:
                        return await self._append(topic, partition, bytearray(stamped), True)
                    except NotLeader as exc:
                        if not exc.appended_nothing:
                            raise  # LeadershipLost: appended here, maybe stored
                        # another broker leads it (or none does right now): written there
                    sent = True
                    return await self._leaders.produce(topic, partition, stamped, internal=internal)
                except (OutOfOrderSequence, ProducerFenced):
                    unknown = True  # the partition's idea of this producer is not ours
                    raise
                except (BrokerError, ConnectionClosed) as exc:
                    unknown = unknown or _maybe_stored(exc, sent)
                    if not unknown or not exc.retriable or loop.time() + delay > deadline:
                        raise  # not unknown: nothing stored, the sequence unused
                    log.info("%s-%d: the broker's own write is retried: %s", topic, partition, exc)
                except BaseException:
                    unknown = True  # a bug or a cancellation: this attempt's fate is unknown
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_s[1])
        except BaseException as exc:
            if unknown:
                self._give_up(producer_id)
                log.warning(
                    "%s-%d: the broker's own write, maybe stored, is given up with producer id %d: %r",
                    topic, partition, producer_id, exc,
                )
            raise

    async def close(self) -> None:
        await self._leaders.close()


def _maybe_stored(exc: BaseException, sent: bool) -> bool:
    """Whether the attempt that raised ``exc`` may have stored its batches.  ``sent``: it
    went to another broker, where a connection failing after the request was written
    leaves its fate unknown (a connection never made sent nothing)."""
    if isinstance(exc, BrokerError):
        return not exc.appended_nothing or isinstance(exc, StorageError)
    return sent and not isinstance(exc, (BrokerUnreachable, HandshakeTimeout))


def _stamp(data: bytearray, producer_id: int, sequence: int) -> tuple[bytes, int]:
    """``data``'s batches stamped with ``producer_id``, epoch 0 and consecutive sequences
    from ``sequence``, and how many records they hold (``InvalidRecord``: a partial batch)."""
    out, records, end = [], 0, 0
    view = memoryview(data)
    for h, pos in iter_batches(view, check_crc=False):
        out.append(stamp_producer(view[pos : pos + h.size], producer_id, PRODUCER_EPOCH, seq_add(sequence, records)))
        records += h.last_offset_delta + 1
        end = pos + h.size
    if end != len(data):
        raise InvalidRecord(f"the broker's own write holds a partial batch at byte {end}")
    return b"".join(out), records
