"""Which partitions a fetch consumer (client/consumer.py) reads, kept in step with the
metadata.

Either an explicit assignment (``assign``: these (topic, partition) pairs) or a
subscription (``subscribe``: every partition of these topics, partitions added later picked
up).  ``ensure`` refreshes the metadata when it is older than ``metadata_max_age_ms`` or
proved stale (``stale()``); with a subscription it re-derives the partitions from the
topics' partition counts; with an assignment it notes the partitions the metadata says do
not exist (``missing``) and, once it has said so for ``unknown_topic_wait_ms``, raises why.

What must not live here: positions or fetched records; a change of the partitions is
handed to the consumer's ``reassigned`` callback, which drops and adds positions.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable

from sluice import errors
from sluice.client.cluster import Cluster
from sluice.client.config import ConsumerConfig

TP = tuple[str, int]


class Assignment:
    """The assigned partitions of one consumer.  Concurrency: event loop only."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig, reassigned: Callable[[list[TP]], None]) -> None:
        """``cluster``: the consumer's metadata (refreshed here); ``config``:
        ``metadata_max_age_ms`` and ``unknown_topic_wait_ms``; ``reassigned(tps)``: called
        before ``partitions`` becomes ``tps`` (possibly with repeats, dropped after)."""
        self._cluster = cluster
        self._reassigned = reassigned
        self.metadata_max_age = config.metadata_max_age_ms / 1000
        self.unknown_topic_wait = config.unknown_topic_wait_ms / 1000
        self.subscription: list[str] | None = None
        self.partitions: list[TP] = []
        # assigned partitions the metadata says do not exist, and since when it says so
        self.missing: set[TP] = set()
        self._missing_since: float | None = None
        self._needs_refresh = False
        self._metadata_at = 0.0

    def assign(self, partitions: Iterable[TP]) -> None:
        """Read exactly these (topic, partition) pairs; replaces any assignment.

        ``TypeError`` for anything but an iterable of (str, int) pairs: a bare pair such as
        ``("t", 0)`` is not taken for a list of one."""
        if isinstance(partitions, str | bytes) or not isinstance(partitions, Iterable):
            raise TypeError(f"assign() takes a list of (topic, partition) pairs, got {partitions!r}")
        tps = []
        for tp in list(partitions):
            try:
                topic, partition = tp
                if not isinstance(topic, str) or isinstance(partition, bool):
                    raise TypeError
                tps.append((topic, operator.index(partition)))
            except (TypeError, ValueError):
                hint = " (one pair? pass [(topic, partition)])" if isinstance(tp, str | int) else ""
                raise TypeError(
                    f"assign() takes a list of (topic, partition) pairs; got {tp!r} in {partitions!r}{hint}"
                ) from None
        self.subscription = None
        self._set(tps)
        self.missing, self._missing_since = set(), None  # judged again at the next refresh
        self._needs_refresh = True

    def subscribe(self, topics: Iterable[str]) -> None:
        """Read every partition of ``topics``; partitions added later are picked up.

        ``TypeError`` for anything but an iterable of topic names: a bare name such as
        ``"payments"`` is not taken for its letters."""
        if isinstance(topics, str | bytes) or not isinstance(topics, Iterable):
            hint = f" (for one topic: [{topics!r}])" if isinstance(topics, str) else ""
            raise TypeError(f"subscribe() takes a list of topic names, got {topics!r}{hint}")
        names = list(topics)
        bad = [t for t in names if not isinstance(t, str) or not t]
        if bad:
            raise TypeError(f"subscribe() takes a list of topic names (non-empty str); got {bad[0]!r}")
        self.subscription = sorted(set(names))
        self._needs_refresh = True
        self._set([tp for tp in self.partitions if tp[0] in self.subscription])

    def _set(self, tps: list[TP]) -> None:
        self._reassigned(tps)
        self.partitions = list(dict.fromkeys(tps))

    def topics(self) -> list[str]:
        """The topics whose metadata the consumer needs."""
        return self.subscription or sorted({t for t, _ in self.partitions})

    def refreshed(self, now: float) -> None:
        """The metadata was refreshed (by ``Consumer.start``) at ``now``."""
        self._metadata_at = now

    def stale(self) -> None:
        """The metadata proved out of date: ``ensure`` refreshes it next time."""
        self._needs_refresh = True

    async def ensure(self) -> None:
        """Refresh metadata when due or needed; with a subscription, re-derive the
        assignment from the partition counts; with an assignment, check that its partitions
        exist (``_check``)."""
        now = time.monotonic()
        topics = self._cluster.topics
        if any(tp[0] not in topics or tp[1] >= topics[tp[0]].partitions for tp in self.partitions):
            self._needs_refresh = True
        if not self._needs_refresh and now - self._metadata_at < self.metadata_max_age:
            return
        if self.subscription is None:
            await self._cluster.refresh(sorted({t for t, _ in self.partitions}))
            self._metadata_at = now
            self._needs_refresh = False
            self._check(now)
            return
        await self._cluster.refresh(self.subscription)
        self._metadata_at = now
        self._needs_refresh = False
        tps = []
        for topic in self.subscription:
            info = self._cluster.topic(topic)
            if info is not None:
                tps.extend((topic, p) for p in range(info.partitions))
        if tps != self.partitions:
            self._set(tps)

    def _check(self, now: float) -> None:
        """After a refresh: note the assigned partitions the metadata says do not exist;
        once it has said so for ``unknown_topic_wait_ms``, raise why (``UnknownTopic``, or
        ``UnknownPartition`` for a partition past the topic's count)."""
        missing: dict[TP, errors.SluiceError] = {}
        for tp in self.partitions:
            unknown = self._cluster.unknown.get(tp[0])
            info = self._cluster.topic(tp[0])
            if unknown is not None:
                missing[tp] = type(unknown)(unknown.message)
            elif info is not None and tp[1] >= info.partitions:
                missing[tp] = errors.unknown_partition(tp[0], tp[1], info.partitions)
        self.missing = set(missing)
        if not missing:
            self._missing_since = None
            return
        if self._missing_since is None:
            self._missing_since = now
        if now - self._missing_since >= self.unknown_topic_wait:
            self._missing_since = None
            raise next(iter(missing.values()))
        self._needs_refresh = True  # ask again: it may be being created
