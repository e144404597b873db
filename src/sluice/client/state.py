"""A producer's shared state: the one object its parts are handed.

The producer (client/producer.py) makes one ``ProducerState`` and hands it to each part
that works on the same records: the sender task (client/sender.py), the compiled per-record
path (``_cproducer.c``'s ``Appender``) and the blocking facade's outbox (``_coutbox.c``'s
``Outbox``, client/sync/).  None of them reaches into the producer's private attributes.

The shape, which the compiled code reads by these names (once, when it is made or bound
to a producer; it keeps the objects, so none of them may ever be replaced, only changed in
place):

    topics       dict   topic -> TopicInfo: the cluster's metadata (``Cluster.topics``)
    routes       dict   topic -> (TopicInfo, partitions, batch byte limit, record bytes per
                        batch): a route is current while its TopicInfo is ``topics[topic]``
    lanes        dict   topic -> deque of sends waiting in line (``WaitingLine.lanes``): the
                        compiled path takes no record of a topic in line
    open         dict   (topic, partition) -> its open Batch (``Accumulator.open``)
    memory       MemoryPool: buffer memory used, its limit, the sends waiting for it
    sticky       dict   topic -> its sticky partition (records without key or partition)
    appender     the compiled ``Appender`` of the producer, or None without the compiled codec

and for the Python parts: ``config`` (the ``ProducerConfig``), ``cluster``, ``accumulator``
and ``line`` (the waiting line).

Concurrency: the producer's event loop changes all of it; the facade's outbox reads
``topics``, ``routes`` and ``memory`` from other threads under the GIL, and a stale answer
only sends a record the slower way.
"""

from __future__ import annotations

from sluice.client.accumulator import Accumulator, MemoryPool
from sluice.client.cluster import Cluster
from sluice.client.config import ProducerConfig
from sluice.client.waiting_line import WaitingLine


class ProducerState:
    """What one producer's sender, compiled path and sync facade share (module docstring)."""

    __slots__ = ("config", "cluster", "accumulator", "line", "memory", "topics", "routes", "lanes", "open",
                 "sticky", "appender")

    def __init__(
        self,
        config: ProducerConfig,
        cluster: Cluster,
        accumulator: Accumulator,
        memory: MemoryPool,
        line: WaitingLine,
        sticky: dict[str, int],
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.accumulator = accumulator
        self.memory = memory
        self.line = line
        self.topics = cluster.topics
        self.routes: dict[str, tuple] = {}
        self.lanes = line.lanes
        self.open = accumulator.open
        self.sticky = sticky
        self.appender = None

    def max_batch_bytes(self, info) -> int:
        """The largest batch the producer sends to a topic of metadata ``info``: its
        ``max.message.bytes``, at most ``max_request_size``."""
        limit = self.config.max_request_size
        if info.max_message_bytes > 0:
            limit = min(limit, info.max_message_bytes)
        return limit
