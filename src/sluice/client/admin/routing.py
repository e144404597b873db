"""Where an admin request goes: any broker, each partition's leader, a group's coordinator.

The plumbing every admin noun (topics, subscriptions, groups, the cluster) shares: one
``Routing`` per ``Admin``, over the admin's ``Cluster`` (metadata and connections).  What
must not live here: any request of a noun, or turning a noun's results into values.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from sluice import errors
from sluice.client.cluster import Cluster
from sluice.protocol import messages


class Routing:
    """Sends admin requests where they belong.  Concurrency: event loop only."""

    def __init__(self, cluster: Cluster) -> None:
        """``cluster``: the admin's metadata and connections (closed by ``Admin.close``)."""
        self.cluster = cluster

    async def request(self, request):
        """``request`` to any broker (the controller when metadata names one); the response."""
        return (await self.cluster.request(request))[0]

    async def partitions(self, topic: str) -> list[int]:
        """The partition numbers of ``topic``; ``UnknownTopic`` if there is no such topic."""
        resp = await self.request(messages.MetadataRequest(topics=[topic]))
        for t in resp.topics:
            errors.raise_for_code(t.error, t.message or topic)
        return sorted(p.partition for t in resp.topics for p in t.partitions)

    async def leaders(self, topic: str, partitions: Iterable[int]) -> dict[int, list[int]]:
        """Partitions of ``topic`` by their leader, from fresh metadata (``NotLeader`` for
        a partition with no leader now)."""
        resp = await self.cluster.refresh([topic])
        for t in resp.topics:
            errors.raise_for_code(t.error, t.message or topic)
        count = self.cluster.topic(topic).partitions
        out: dict[int, list[int]] = {}
        for p in partitions:
            if not 0 <= p < count:
                raise errors.unknown_partition(topic, p, count)
            node = self.cluster.leader(topic, p)
            if node < 0:
                raise errors.NotLeader(f"{topic}-{p} has no leader now; retry")
            out.setdefault(node, []).append(p)
        return out

    async def to_leaders(
        self, topic: str, partitions: Iterable[int], make, results, *, skip_unreachable: bool = False
    ) -> list:
        """Send ``make(partitions)`` to each leader of ``topic``'s ``partitions`` and return
        the results (``results(response)``) of all; asks again, with fresh metadata, for
        partitions whose leader moved meanwhile (a few times).  ``skip_unreachable``: a
        leader that cannot be reached (down, its death not noticed yet) gives no results
        instead of failing the call."""
        todo, out = list(partitions), []
        for attempt in range(5):
            moved = []
            for node, group in (await self.leaders(topic, todo)).items():
                try:
                    conn = await self.cluster.connection(node)
                    resp, _ = await conn.request(make(group), timeout=self.cluster.request_timeout)
                except (errors.ConnectionClosed, errors.RequestTimedOut):
                    if not skip_unreachable:
                        raise
                    continue
                for r in results(resp):
                    if getattr(r, "error", 0) == errors.NotLeader.code and attempt < 4:
                        moved.append(r.partition)
                    else:
                        out.append(r)
            if not moved:
                return out
            todo = moved
            await asyncio.sleep(0.1 * (attempt + 1))
        return out

    async def each_partition(self, topic: str, make, results, partitions: Iterable[int] | None = None) -> list:
        """``make(partitions)`` at each leader of ``partitions`` of ``topic`` (default:
        every one); the per-partition results, the first error raised."""
        if partitions is None:
            partitions = await self.partitions(topic)
        out = await self.to_leaders(topic, partitions, make, results)
        for r in out:
            errors.raise_for_code(r.error, r.message)
        return out

    async def group_request(self, group: str, request, check: Callable[[object], None] | None = None):
        """``request`` to ``group``'s coordinator; ``NotCoordinator`` is retried (with fresh
        metadata, backoff 0.1 s doubling to 1 s) until the request timeout has passed."""
        deadline = time.monotonic() + self.cluster.request_timeout
        delay = 0.1
        while True:
            try:
                return await self.cluster.coordinator_request(group, request, check)
            except errors.NotCoordinator:
                if time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


def raise_first(results) -> None:
    """Raise the error of the first failed per-topic or per-group result, if any."""
    for r in results:
        errors.raise_for_code(r.error, r.message or r.name)
