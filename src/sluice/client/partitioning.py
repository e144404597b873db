"""Partitioning of the producer: which partition a record goes to (``Partitioning``, which
the producer makes and asks).

A record with an explicit partition goes there; one with a key, to the key's (CRC-32C of
the key modulo the partition count, or ``partitioner(key, n)`` when given); a keyless one,
to its topic's *sticky* partition.

**The sticky partition moves on per batch** (Kafka's KIP-480): keyless records fill one
batch of one partition, and the batch after it goes to another partition.  The partition
moves on when its batch fills (``switch_sticky``, called from the compiled path
too, through the producer) and when a keyless record finds the batch it went to closed (by ``linger_ms``, a
flush, a bulk send) and would open a new one (``partition_for``).  So keyless records
spread evenly over the partitions whatever closes their batches, and a batch still holds
many records whenever they come faster than the linger.

Which partition is next: of those that can take records, the one this producer has put
the fewest bytes in (its closed batches, keyed ones too, and its open batch), the first
after the current one in partition order among equals — so partitions take turns while
batches are alike, and one that got a small batch (closed by linger) gets the next, and a
producer's partitions never differ by much more than a batch.  A partition that could not
take records for a while counts as at most ``batch_size`` behind the fullest, so it catches
up by a batch, not by all it missed.  The first pick is random among equals (producers do
not all start on partition 0).
A partition cannot take records while metadata shows it without a leader, or for
``refused_partition_avoid_ms`` after it *refused* a send (``partition_refused``, told by
the sender: too few in-sync replicas, no replica to elect, a leader that does not answer
or is stopping, a failing disk, a full write queue).  Each refusal of a retried batch there extends the time, so a
partition is avoided while its batches keep being refused, and tried again by the first
batch after that.  When no partition can take records, they all may (the records wait for
one, up to their delivery timeout).

Keyed records and records with a partition are never moved: their batches are retried on
their partition and fail with its error.  Nor is a batch moved once it was drained: it
has a sequence of its partition (idempotence), and records of a batch that may have been
stored must not be stored a second time elsewhere.

Concurrency: event loop only, as the producer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import crc32c as _crc32c

from sluice import errors
from sluice.client.accumulator import Accumulator
from sluice.client.cluster import Cluster


def default_partitioner(key: bytes, partitions: int) -> int:
    """Partition of a keyed record: CRC-32C of the key modulo the partition count."""
    return _crc32c.crc32c(key) % partitions


# The errors by which a partition refuses records for a while: keyless records go elsewhere.
# Not NOT_LEADER: the partition has (or soon has) another leader, which the metadata refresh
# it brings about tells; one without is left by ``leave_leaderless``.
REFUSALS = (
    errors.NotEnoughReplicas,
    errors.EligibleLeadersNotAvailable,
    errors.ConnectionClosed,
    errors.RequestTimedOut,
    errors.BrokerShuttingDown,
    errors.StorageError,
    errors.BrokerBusy,
)


class Partitioning:
    """Which partition each record of one producer goes to (module docstring).

    Made with the producer's ``cluster`` (metadata) and accumulator ``acc`` (its open and
    closed batches), its settings ``partitioner`` (None: CRC-32C of the key), ``batch_size``
    and ``avoid_refused`` (``refused_partition_avoid_ms``, in seconds).  Its state:
    ``sticky`` (topic -> sticky partition, read by the compiled path through the producer's
    ``ProducerState``), the batch count each sticky partition had when it was picked, and
    the partitions avoided until when.
    """

    def __init__(
        self,
        cluster: Cluster,
        acc: Accumulator,
        partitioner: Callable[[bytes | None, int], int] | None,
        batch_size: int,
        avoid_refused: float,
    ) -> None:
        self._cluster = cluster
        self._acc = acc
        self.partitioner = partitioner
        self.batch_size = batch_size
        self.sticky: dict[str, int] = {}
        # topic -> batches opened on its sticky partition before it was picked
        self._sticky_mark: dict[str, int] = {}
        self._avoid_refused = avoid_refused
        self._refused_until: dict[tuple[str, int], float] = {}

    def partition_for(self, topic: str, key: bytes | None, n: int) -> int:
        """The partition of a record of ``topic`` (``n`` partitions) with ``key``, not
        given one: the partitioner's, the key's, or the sticky one (``UnknownPartition``
        when a custom partitioner answers out of range)."""
        if self.partitioner is not None:
            p = self.partitioner(key, n)
            if not 0 <= p < n:
                raise errors.UnknownPartition(f"partitioner returned {p} for {n} partitions")
            return p
        if key is not None:
            return _crc32c.crc32c(key) % n
        p = self.sticky.get(topic)
        if p is None or p >= n:
            return self.switch_sticky(topic, n, -1)
        tp = (topic, p)
        acc = self._acc
        if tp not in acc.open and acc.opened.get(tp, 0) != self._sticky_mark[topic]:
            # its batch closed since it was picked: this record opens a batch elsewhere
            p = self.switch_sticky(topic, n, p)
        return p

    def switch_sticky(self, topic: str, n: int, old: int) -> int:
        """Move ``topic``'s keyless records on from ``old`` (-1: none yet) to the next
        partition that can take them; returns it."""
        p = self.sticky[topic] = self._pick(topic, n, old)
        self._sticky_mark[topic] = self._acc.opened.get((topic, p), 0)
        return p

    def _pick(self, topic: str, n: int, old: int) -> int:
        """Of the partitions that have a leader and did not refuse records lately, the least
        loaded (see the module docstring), the first after ``old`` among equals (from a
        random one when ``old`` is -1); ``old`` itself only when it is strictly the least
        loaded, or no other can take them.
        With no leader known, any that did not refuse; with none, the one after ``old``.
        O(partitions), once per batch."""
        if n == 1:
            return 0
        leaders = self._cluster.leaders(topic, n)
        refused = self._refused_until
        now = time.monotonic() if refused else 0.0
        start = random.randrange(n) if old < 0 else old + 1
        acc = self._acc
        done, opened = acc.bytes_closed, acc.open
        # then, with no leader known (metadata marked stale after NOT_LEADER), by refusals
        for lowest_leader in (0, -1):
            usable = []
            for i in range(n):
                p = (start + i) % n
                if leaders[p] >= lowest_leader and (not refused or refused.get((topic, p), 0.0) <= now):
                    tp = (topic, p)
                    b = opened.get(tp)
                    usable.append((done.get(tp, 0) + (b.size if b is not None else 0), i, p))
            if usable:
                break
        else:
            return start % n
        if len(usable) == 1:
            return usable[0][2]
        # ``old`` is last in ``usable``: among equals it is picked last, and it keeps the
        # records only while strictly the least loaded (a batch closed small, by linger)
        floor = max(usable)[0] - self.batch_size  # a partition catches up by a batch at most
        return min((max(load, floor), i, p) for load, i, p in usable)[2]

    def partition_refused(self, topic: str, partition: int, exc: BaseException) -> None:
        """The sender was refused a batch of ``topic[partition]`` by ``exc`` (it retries
        it there): keyless records avoid that partition for ``refused_partition_avoid_ms``,
        leaving it at once when it is their sticky one."""
        if not self._avoid_refused or not isinstance(exc, REFUSALS):
            return
        now = time.monotonic()
        refused = self._refused_until
        if len(refused) > 1024:  # forget the expired ones now and then
            for tp in [tp for tp, until in refused.items() if until <= now]:
                del refused[tp]
        refused[(topic, partition)] = now + self._avoid_refused
        info = self._cluster.topics.get(topic)
        if self.sticky.get(topic) == partition and info is not None and partition < info.partitions:
            self.switch_sticky(topic, info.partitions, partition)

    def leave_leaderless(self) -> None:
        """After a metadata refresh: keyless records stop going to a sticky partition that
        has no leader now (those buffered for it wait for one, up to their deadline)."""
        for topic, p in list(self.sticky.items()):
            info = self._cluster.topics.get(topic)
            if info is not None and p < info.partitions and info.leaders[p] < 0:
                self.switch_sticky(topic, info.partitions, p)
