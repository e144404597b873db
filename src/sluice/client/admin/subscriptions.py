"""Administration of subscriptions: create, delete, seek, describe, list; and extending a
topic's subscriptions to partitions it gained (``Topics.add_partitions``).

Each request goes to the leaders of the topic's partitions (``Routing.each_partition``), a
subscription living in its partitions.  What must not live here: the delivery of messages
(client/subscriber.py) or the topics themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from sluice import errors
from sluice.client.admin.routing import Routing
from sluice.client.config import position
from sluice.protocol import messages
from sluice.protocol.messages import SubscriptionPartitionInfo
from sluice.protocol.subscriptions import SubscriptionConfig

log = logging.getLogger("sluice.client.admin")


class Subscriptions:
    """The subscriptions of a cluster's topics.  Concurrency: event loop only."""

    def __init__(self, routing: Routing) -> None:
        """``routing``: sends the requests to the partitions' leaders."""
        self._routing = routing

    async def create(
        self,
        topic: str,
        name: str,
        config: SubscriptionConfig | None = None,
        *,
        start: str | int = "earliest",
        if_not_exists: bool = False,
    ) -> None:
        """Create subscription ``name`` on every partition of ``topic``, its cursor at
        ``start`` (``earliest``, ``latest``, an offset, ``time:<ms since the epoch>``).
        ``SubscriptionAlreadyExists`` unless ``if_not_exists``."""
        cfg = config or SubscriptionConfig()
        await self._routing.each_partition(topic, lambda group: messages.CreateSubscriptionRequest(
            topic=topic, subscription=name, partitions=group, config=cfg, start=position(start),
            if_not_exists=if_not_exists,
        ), lambda resp: resp.partitions)

    async def delete(self, topic: str, name: str) -> None:
        """Delete the subscription from every partition (its consumers are told)."""
        await self._routing.each_partition(topic, lambda group: messages.DeleteSubscriptionRequest(
            topic=topic, subscription=name, partitions=group,
        ), lambda resp: resp.partitions)

    async def seek(self, topic: str, name: str, to: str | int) -> dict[int, int]:
        """Move the subscription's cursor on every partition to ``to`` (``earliest``,
        ``latest``, an offset, ``time:<ms>``): replay from there, or skip to there.  An
        offset outside a partition's log goes to its nearest end.  Returns partition ->
        the offset its cursor went to."""
        results = await self._routing.each_partition(topic, lambda group: messages.SeekSubscriptionRequest(
            topic=topic, subscription=name, partitions=group, position=position(to),
        ), lambda resp: resp.partitions)
        return {r.partition: r.offset for r in sorted(results, key=lambda r: r.partition)}

    async def describe(self, topic: str, name: str | None = None) -> list[SubscriptionPartitionInfo]:
        """Per partition (and subscription, when ``name`` is None): the cursor, backlog,
        in flight, retrying and dead-lettered counts; sorted by subscription, partition."""
        infos = await self._routing.each_partition(topic, lambda group: messages.DescribeSubscriptionsRequest(
            topic=topic, partitions=group, subscription=name,
        ), lambda resp: resp.subscriptions)
        return sorted(infos, key=lambda i: (i.subscription, i.partition))

    async def names(self, topics: Sequence[str], *, keep_empty: bool) -> dict[str, list[str]]:
        """Topic -> the names of its subscriptions, for each of ``topics``; a topic with
        none is left out unless ``keep_empty``."""
        out = {}
        for t in topics:
            names = sorted({i.subscription for i in await self.describe(t)})
            if names or keep_empty:
                out[t] = names
        return out

    async def extend(self, topic: str, before: int, total: int) -> None:
        """Create every subscription of ``topic``'s first ``before`` partitions on the
        partitions ``before..total-1``, from their start, with its settings (those of the
        lowest partition that has it).  Retried while the new partitions get leaders."""
        routing = self._routing
        infos = await routing.to_leaders(topic, range(before), lambda group: messages.DescribeSubscriptionsRequest(
            topic=topic, partitions=group,
        ), lambda resp: resp.subscriptions)
        configs: dict[str, SubscriptionConfig] = {}
        for i in sorted(infos, key=lambda i: i.partition):
            if not i.error:
                configs.setdefault(i.subscription, i.config)
        deadline = time.monotonic() + routing.cluster.request_timeout
        for name, cfg in sorted(configs.items()):
            while True:
                try:
                    await routing.each_partition(topic, lambda group, name=name, cfg=cfg: (
                        messages.CreateSubscriptionRequest(
                            topic=topic, subscription=name, partitions=group, config=cfg,
                            start=position("earliest"), if_not_exists=True,
                        )
                    ), lambda resp: resp.partitions, range(before, total))
                    break
                except errors.SluiceError as exc:  # UnknownPartition: metadata without them yet
                    again = exc.retriable or isinstance(exc, errors.UnknownPartition)
                    if not again or time.monotonic() > deadline:
                        log.warning("subscription %s of %s not extended to its new partitions yet: %s",
                                    name, topic, exc)
                        break
                    await asyncio.sleep(0.1)
