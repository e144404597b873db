"""The topics this broker knows and the partitions it holds: ``Topic`` and
``TopicRegistry``.

Every broker knows every topic of the cluster (``Topic``: its record and the state of each
partition, from the metadata store) and holds the partitions assigned to it
(``Topic.partitions``, by index).  The registry is where every service looks them up
(``topic``, ``partition``, ``led_partition``); which partitions are held, and what role
each has, is decided by the topic service (broker/topics.py) and replication
(broker/replication/).  Event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.broker.partition import Partition
from sluice.cluster.store import PartitionState, TopicRecord, unknown_topic
from sluice.config import TopicConfig
from sluice.errors import NotLeader, unknown_partition


@dataclass
class Topic:
    """A topic of the cluster: its record, each partition's state, and the partitions this
    broker holds (a replica of), by index."""

    name: str
    config: TopicConfig
    record: TopicRecord
    states: list[PartitionState | None]
    partitions: dict[int, Partition] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        return self.record.internal

    @property
    def count(self) -> int:
        return self.record.partitions


class TopicRegistry:
    """The topics known here, by name (``topics``), and lookups of their partitions."""

    def __init__(self) -> None:
        self.topics: dict[str, Topic] = {}

    def topic(self, name: str) -> Topic:
        """The topic (``UnknownTopic``)."""
        t = self.topics.get(name)
        if t is None:
            raise unknown_topic(name)
        return t

    def check_partition(self, topic: str, index: int) -> Topic:
        """The topic, if it has partition ``index`` (``UnknownTopic``, ``UnknownPartition``)."""
        t = self.topic(topic)
        if not 0 <= index < t.count:
            raise unknown_partition(topic, index, t.count)
        return t

    def partition(self, topic: str, index: int) -> Partition:
        """The replica of ``topic``-``index`` held here; ``NotLeader`` if none is."""
        p = self.check_partition(topic, index).partitions.get(index)
        if p is None:
            raise NotLeader(f"this broker holds no replica of {topic}-{index}")
        return p

    def led_partition(self, topic: str, index: int) -> Partition:
        """The partition if this broker leads it; ``NotLeader`` otherwise (consumers and
        producers talk to leaders only)."""
        p = self.partition(topic, index)
        if not p.is_leader:
            raise NotLeader(f"this broker does not lead {topic}-{index}")
        return p

    def held(self) -> list[Partition]:
        """Every partition held here."""
        return [p for t in self.topics.values() for p in t.partitions.values()]
