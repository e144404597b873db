"""Putting one record into its partition's open batch: the producer's per-record append in
Python, the reference of the compiled ``Appender`` (``_cproducer.c``), which takes the
common record (bytes, no headers) and hands every other one here.

Lives here: the record's route (partitions and size limits of its topic, kept in the
state's ``routes``), its size check, the memory it reserves, its partition and the batch it
joins, and when the caller should let the loop turn.  Not here: waiting (the waiting line,
client/waiting_line.py, retries a record this refuses for want of metadata or memory),
the bulk path and the futures' outcomes (client/producer.py, client/accumulator.py).

Concurrency: the producer's event loop only.  Synchronous: no await between the choice of
a batch and the append.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sluice import errors
from sluice.client.arguments import check_partition
from sluice.client.framing import record_size, tail_size
from sluice.client.partitioning import Partitioning
from sluice.client.state import ProducerState
from sluice.protocol import records

_time = time.time
# A record's framing around its key, value and headers, at most: length varint (5),
# attributes (1), timestamp delta (10), offset delta (5).
FRAMING_MAX = 21
# ... and around a bytes key (or none) and value without headers: the two length varints
# (5 each) and the header count (1) too.
PLAIN_SLACK = FRAMING_MAX + 11
# A send whose record takes its batch past a multiple of TURN_BYTES bytes or of
# TURN_RECORDS records, or fills it, lets the loop turn once before its awaitable is done:
# a loop of awaited sends, which never yields otherwise, lets the sender and every other
# task run once per this much data.  Each turn ships what is buffered as a request: fewer
# turns cost the broker fewer requests (large records), more of them let it work beside
# the client sooner (small records, a window of unacknowledged ones).
TURN_BYTES = 256 * 1024
TURN_RECORDS = 512
BUFFERED, TURN = 1, 2  # what ``RecordAppender.append`` returns once the record is buffered


class RecordAppender:
    """Appends one record at a time to the open batches of one producer's ``state``.

    ``partitioning`` chooses partitions (and moves sticky topics on); ``check_open()``
    raises, buffering nothing, when the producer cannot send; ``batch_size`` is the
    producer's; ``keyless_sticky``: records without key or partition go to their topic's
    sticky partition (no partitioner of the user's).  ``refusing`` is set once the producer
    closes or is fenced: every append then asks ``check_open``.
    """

    __slots__ = ("_topics", "_routes", "_memory", "_acc", "_state", "_partitioning", "_check_open",
                 "_batch_size", "_keyless_sticky", "refusing")

    def __init__(
        self,
        state: ProducerState,
        partitioning: Partitioning,
        check_open: Callable[[], None],
        batch_size: int,
        keyless_sticky: bool,
    ) -> None:
        self._state = state
        self._topics = state.topics
        self._routes = state.routes
        self._memory = state.memory
        self._acc = state.accumulator
        self._partitioning = partitioning
        self._check_open = check_open
        self._batch_size = batch_size
        self._keyless_sticky = keyless_sticky
        self.refusing = False

    def fitting(self, topic: str, info, tail: int) -> int:
        """Exact size of a record with ``tail`` bytes after its offset delta, in a batch of
        its own; ``MessageTooLarge`` when that cannot fit in a batch the topic accepts."""
        alone = record_size(tail, 0, 0)
        limit = self._state.max_batch_bytes(info)
        if alone + records.HEADER_SIZE > limit:
            raise errors.MessageTooLarge(
                f"record of {alone} bytes (plus a {records.HEADER_SIZE}-byte batch header) "
                f"exceeds the {limit}-byte limit of {topic!r}"
            )
        return alone

    def append(self, topic, value, key, headers, partition, ts, sink, prepaid: int = 0) -> int:
        """Put one record in its partition's open batch now, ``sink`` to be told its
        outcome; False (nothing buffered) when it must wait: no metadata of the topic, a
        partition beyond those known, or too little free memory.  ``prepaid``: memory the
        waiting line reserved for it (``reserve``).  Raises, buffering nothing, when the
        record cannot be sent (closed or fenced producer, ``MessageTooLarge``,
        ``UnknownPartition``, an encoding error).

        Returns ``TURN`` instead of ``BUFFERED`` when the loop should turn (its batch
        filled, or passed a multiple of ``TURN_BYTES`` or ``TURN_RECORDS``).

        The per-record path: a few dict lookups, then one C call encodes the record into
        the batch (``Batch.add``).
        """
        if self.refusing:
            self._check_open()
        info = self._topics.get(topic)
        route = self._routes.get(topic)
        if route is None or route[0] is not info:
            if info is None or not info.leaders:
                return False
            limit = self._state.max_batch_bytes(info)
            route = self._routes[topic] = (
                info, len(info.leaders), limit, min(self._batch_size, limit) - records.HEADER_SIZE
            )
        _, n, limit, cap = route
        if partition is not None and not (partition.__class__ is int and 0 <= partition < n):
            check_partition(partition)  # 0.0, True: TypeError
            if partition >= 0:
                return False  # the topic may have grown: the line refreshes metadata
            raise errors.unknown_partition(topic, partition, n)
        if headers is None and value.__class__ is bytes and (key is None or key.__class__ is bytes):
            reserve = len(value) + (0 if key is None else len(key)) + PLAIN_SLACK
        else:
            reserve = self.reserve(key, value, headers)
        if reserve + records.HEADER_SIZE > limit:
            try:
                self.fitting(topic, info, tail_size(key, value, headers))
            except errors.MessageTooLarge:
                if self._state.line.limit_may_be_stale(topic):
                    return False  # the line asks for the topic's limit again, then decides
                raise
        mem = self._memory
        if not prepaid and (mem.used + reserve > mem.limit or mem.waiters):
            return False
        if partition is None:
            partition = self._partitioning.partition_for(topic, key, n)
            sticky = key is None and self._keyless_sticky
        else:
            sticky = False
        if ts is None:
            ts = int(_time() * 1000)
        acc = self._acc
        batch = acc.open.get((topic, partition))
        turn = False
        if batch is not None:
            before = batch.size
            if not batch.add(cap, key, value, headers, ts, sink, reserve):
                acc.close(batch)  # full
                batch, turn = None, True
                if sticky:
                    partition = self._partitioning.switch_sticky(topic, n, partition)
                    batch = acc.open.get((topic, partition))
                    if batch is not None:
                        before = batch.size
                        if not batch.add(cap, key, value, headers, ts, sink, reserve):
                            acc.close(batch)
                            batch = None
        if batch is None:
            before = 0
            batch = acc.new_batch(topic, partition, ts)
            # alone in a batch it fits whatever ``cap`` (``fitting`` checked the limit)
            batch.add(limit - records.HEADER_SIZE, key, value, headers, ts, sink, reserve)
            acc.adopt(batch)
        if not prepaid:
            mem.used += reserve
        elif prepaid != reserve:  # cannot happen (same reserve), but never leak memory
            mem.release(prepaid - reserve)
        if batch.size >= cap:
            self.batch_full(batch, sticky, n, partition)
            turn = True
        if turn or before // TURN_BYTES != batch.size // TURN_BYTES or not batch.count % TURN_RECORDS:
            return TURN
        return BUFFERED

    def batch_full(self, batch, sticky: bool, n: int, partition: int) -> None:
        """``batch`` holds ``batch_size`` bytes: close it, and move a sticky topic on (the
        compiled Appender calls it too)."""
        self._acc.close(batch)
        if sticky:
            self._partitioning.switch_sticky(batch.topic, n, partition)

    @staticmethod
    def reserve(key, value, headers) -> int:
        """Memory a record reserves while buffered: an upper bound of its encoded size in
        any batch (what ``append`` reserves; raises ``TypeError`` for fields that are not
        bytes-like)."""
        if headers is None and value.__class__ is bytes and (key is None or key.__class__ is bytes):
            return len(value) + (0 if key is None else len(key)) + PLAIN_SLACK
        return tail_size(key, value, headers) + FRAMING_MAX
