"""Partitioning of the producer: which partition a record goes to (a part of ``Producer``).

A record with an explicit partition goes there; one with a key, to the key's (CRC-32C of
the key modulo the partition count, or ``partitioner(key, n)`` when given); a keyless one,
to its topic's *sticky* partition, which changes when its batch fills (``_switch_sticky``,
called from the compiled path too) or when it loses its leader.  A new sticky partition is
picked at random among those with a leader, as Kafka's sticky partitioner does: a keyless
record never waits out its delivery timeout on a dead broker's partition while others are
there.
"""

from __future__ import annotations

import random

import crc32c as _crc32c

from sluice import errors


def default_partitioner(key: bytes, partitions: int) -> int:
    """Partition of a keyed record: CRC-32C of the key modulo the partition count."""
    return _crc32c.crc32c(key) % partitions


class Partitioning:
    def _partition_for(self, topic: str, key: bytes | None, n: int) -> int:
        if self.partitioner is not None:
            p = self.partitioner(key, n)
            if not 0 <= p < n:
                raise errors.UnknownPartition(f"partitioner returned {p} for {n} partitions")
            return p
        if key is not None:
            return _crc32c.crc32c(key) % n
        p = self._sticky.get(topic)
        if p is None or p >= n:
            p = self._sticky[topic] = self._pick(topic, n, -1)
        return p

    def _switch_sticky(self, topic: str, n: int, old: int) -> int:
        p = self._sticky[topic] = self._pick(topic, n, old)
        return p

    def _pick(self, topic: str, n: int, old: int) -> int:
        """A new sticky partition of ``topic``: at random among those with a leader (all
        when none has), never ``old`` (whose batch just filled, or that lost its leader)
        unless it is the only one."""
        leaders = self._cluster.leaders(topic, n)
        choice = [i for i in range(n) if i != old and leaders[i] >= 0] or [i for i in range(n) if i != old] or [0]
        return random.choice(choice)

    def _leave_leaderless(self) -> None:
        """After a metadata refresh: keyless records stop going to a sticky partition that
        has no leader now (those buffered for it wait for one, up to their deadline)."""
        for topic, p in list(self._sticky.items()):
            info = self._cluster.topics.get(topic)
            if info is not None and p < info.partitions and info.leaders[p] < 0:
                self._switch_sticky(topic, info.partitions, p)
