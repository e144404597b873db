"""A SyncProducer's records sent by its callers and not yet handed to its producer's loop.

Callers (any thread) append to ``items`` without a lock (deque appends and pops are atomic)
and count the bytes of the values they queued in ``sent_bytes``; ``hand_over``, on the loop,
buffers the queued records in order and counts ``handed_bytes``.  ``handing`` says that a
hand-over is scheduled or running: a caller schedules one only when none is pending, and a
hand-over ends only after it cleared ``handing`` and then found ``items`` empty, so a record
queued while it ends is never left behind.

``Outbox`` here is the pure-Python reference of ``sluice._crecords.Outbox``, whose ``send``
is ``SyncProducer.send`` in C for the common record (``SyncProducer.send`` is its Python
path) and whose ``hand_over`` buffers through the producer's compiled Appender.  The facade
binds the outbox to its producer once that runs (``bind``), and unbinds it when it closes;
the compiled one reads the producer's ``state`` (client/state.py) only then.

What the compiled one calls, it is given or calls by a public name: the facade's
``buffer_all(client)`` and ``schedule_hand_over(client)`` are constructor arguments, and
``hand_over`` uses the producer's ``submit`` and ``unbuffered`` (client/producer.py).
"""

from __future__ import annotations

from collections import deque


class Outbox:
    """``Outbox(facade, py_send, items, future_type, group, margin, buffer_all,
    schedule_hand_over)``: the arguments of the compiled one, of which this one keeps
    ``items`` (its ``send`` is the facade's own, which calls the last two itself).

    ``facade``: the SyncProducer; ``py_send``: ``SyncProducer.send``, for every call the
    compiled ``send`` does not take; ``future_type`` and ``group``: ``RecordFuture`` and the
    ``FutureGroup`` of the facade's futures; ``margin``: bytes of a record and its batch
    beside its key and value, with room to spare; ``buffer_all(client)``: block until every
    record queued is buffered (buffer memory is short); ``schedule_hand_over(client)``: run
    ``hand_over(client)`` on the producer's loop soon."""

    def __init__(
        self, facade, py_send, items: deque, future_type, group, margin: int, buffer_all, schedule_hand_over
    ) -> None:
        self.items = items
        self.sent_bytes = self.handed_bytes = 0
        self.handing = False

    def bind(self, client) -> None:
        """The facade's producer runs: the compiled outbox sends through it from now on
        (this one sends every record the Python way, bound or not)."""

    def unbind(self) -> None:
        """The facade is closing: every record the Python way from now on."""

    def hand_over(self, client) -> None:
        """On the producer's loop: buffer (or queue in the producer's waiting line) every
        record queued, with ``Producer.submit``."""
        items = self.items
        submit = client.submit
        while True:
            while items:
                item = items.popleft()
                value = item[1]
                if value is not None:
                    self.handed_bytes += len(value)
                submit(*item)
            self.handing = False
            if not items:
                return
            self.handing = True
