"""The subscriptions of every partition this broker leads (``SubscriptionManager``).

It keeps one ``PartitionSubscriptions`` (partition.py) per partition led here, loaded on
first use and dropped when leadership moves or the topic goes; the APIs (handlers.py) reach
partitions through it.  ``names`` tells which subscriptions a topic has across the
cluster: partitions led here are looked at in-process, the others asked of their leaders
(broker/leader_client.py).  ``check_new`` refuses a subscription that can dead-letter
(``max_attempts`` > 0) unless its dead-letter topic name is a legal topic name and no
other subscription's dead-letter topic.

Its collaborators are given to its constructor:

- ``topics``: the topics by name (broker/topics.py ``Topic``: ``internal``, ``config``,
  ``count``), the broker's live mapping, read only;
- ``led_partition(topic, index)``: the ``Partition`` if led here (``NotLeader``,
  ``UnknownTopic``, ``UnknownPartition`` otherwise);
- ``executor``: where log scans and reads run;
- ``create_topic(new, validate_only=False)`` and ``admin_lock``: topic creation (dead-letter
  topics), one at a time under the lock;
- ``append``: the broker's own appends to partitions led here, and ``new_producer_id()``
  their producer id (broker/internal_writes.py);
- ``live_brokers()`` and ``node_id``: the cluster's live brokers and this one's, for the
  client to the other brokers.

Concurrency: event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from sluice.broker.internal_writes import Append, InternalWrites, NewProducerId
from sluice.broker.leader_client import LeaderClient
from sluice.broker.subscriptions.dead_letters import DeadLetters
from sluice.broker.subscriptions.handlers import SubscriptionHandlers
from sluice.broker.subscriptions.partition import PartitionSubscriptions
from sluice.broker.topics import unknown_topic
from sluice.errors import (
    BrokerError,
    InvalidSubscription,
    NotLeader,
    UnknownSubscription,
    UnknownTopic,
)
from sluice.protocol import subscriptions as sub

NAMES_ATTEMPTS = 5  # asks of a partition whose leader moves meanwhile, in ``names``


class SubscriptionManager:
    """The subscriptions of the partitions this broker leads, and their APIs."""

    def __init__(
        self,
        topics: Mapping[str, object],
        led_partition: Callable[[str, int], object],
        executor,
        *,
        create_topic: Callable[..., Awaitable[None]],
        admin_lock: asyncio.Lock,
        append: Append,
        new_producer_id: NewProducerId,
        live_brokers: Callable[[], Mapping[int, object]],
        node_id: int,
    ) -> None:
        self._topics = topics
        self._led_partition = led_partition
        self.executor = executor
        self._leaders = LeaderClient(live_brokers, node_id)
        self._dead_letters = DeadLetters(topics, create_topic, admin_lock, InternalWrites(append, self._leaders, new_producer_id))
        self._parts: dict[tuple[str, int], PartitionSubscriptions] = {}
        self._handlers = SubscriptionHandlers(self)

    def handlers(self) -> dict:
        return self._handlers.table()

    def topic(self, name: str):
        """The topic ``name`` (``UnknownTopic``)."""
        t = self._topics.get(name)
        if t is None:
            raise unknown_topic(name)
        return t

    def refusal(self, topic: str) -> InvalidSubscription | None:
        """Why ``topic`` cannot have subscriptions (internal or compacted), or None."""
        topic_obj = self.topic(topic)
        if topic_obj.internal or topic_obj.config.cleanup_policy == "compact":
            return InvalidSubscription(
                f"topic {topic!r} is {'internal' if topic_obj.internal else 'compacted'}: subscriptions need "
                "an ordinary topic (read compacted topics with a fetch consumer)"
            )
        return None

    async def partition(self, topic: str, index: int, stranded: bool = False) -> PartitionSubscriptions:
        """The loaded subscriptions of ``topic``-``index``; ``NotLeader`` unless led here,
        ``InvalidSubscription`` if the topic cannot have subscriptions — checked on every
        call, since a topic's config changes under its loaded state (an ordinary topic
        whose subscriptions were looked at may be compacted since).  ``stranded``: a
        compacted topic's too (subscriptions stranded on a topic that became compacted
        at a restart, ``--topic-default``, can still be described and deleted)."""
        part = self._led_partition(topic, index)
        refused = self.refusal(topic)
        if refused is not None and not (stranded and not self.topic(topic).internal):
            raise refused
        key = (topic, index)
        ps = self._parts.get(key)
        if ps is not None and (ps.part is not part or not ps.current):
            await self._drop(key, NotLeader(f"{topic}-{index} changed leader"))
            ps = None
        if ps is None:
            ps = self._parts[key] = PartitionSubscriptions(part, self.executor, self._dead_letters, ordinary=refused is None)
            task = asyncio.ensure_future(ps.load())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.shield(ps.loaded)
        except Exception:
            if self._parts.get(key) is ps:  # a failed load (a read error): the next call tries again
                del self._parts[key]
            raise
        if not ps.current:
            raise NotLeader(f"{topic}-{index} changed leader")
        return ps

    def loaded(self, topic: str, index: int) -> PartitionSubscriptions:
        """The subscriptions of ``topic``-``index`` if loaded and current here (no load:
        acks go to the leader that delivered); ``NotLeader`` otherwise."""
        ps = self._parts.get((topic, index))
        if ps is None or not ps.current or not ps.loaded.done():
            raise NotLeader(f"{topic}-{index} is not served here (a new leader?)")
        return ps

    async def _drop(self, key: tuple[str, int], exc: BrokerError, flush: bool = False) -> None:
        ps = self._parts.pop(key, None)
        if ps is not None:
            await ps.close(exc, flush)

    def leadership_changed(self, part) -> None:
        """A partition held here began or stopped leading: a stale state is dropped."""
        key = (part.topic, part.index)
        ps = self._parts.get(key)
        if ps is not None and not ps.current:
            asyncio.ensure_future(self._drop(key, NotLeader(f"{part.topic}-{part.index} changed leader")))

    async def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._parts if k[0] == topic]:
            await self._drop(key, UnknownSubscription(f"topic {topic!r} was deleted"))

    async def close(self) -> None:
        """Broker stopping: write what changed, end every subscription."""
        await asyncio.gather(*(
            self._drop(key, NotLeader("the broker is shutting down"), flush=True) for key in list(self._parts)
        ))
        await self._leaders.close()

    # ------------------------------------------------------------------ cluster-wide checks

    async def names(self, topic: str) -> set[str]:
        """The subscriptions of ``topic`` (none if it is gone, compacted or internal):
        partitions led here looked at in-process, the others asked of their leaders; a
        partition whose leader moves meanwhile is asked again (a few times), then its
        error raised.  Never call it holding a partition's ``lock``."""
        t = self._topics.get(topic)
        if t is None or self.refusal(topic) is not None:
            return set()
        names: set[str] = set()
        todo = list(range(t.count))
        try:
            for attempt in range(NAMES_ATTEMPTS):
                moved = []
                for p in todo:
                    try:
                        names |= await self._names_of(topic, p)
                    except NotLeader:
                        if attempt == NAMES_ATTEMPTS - 1:
                            raise
                        moved.append(p)
                if not moved:
                    return names
                todo = moved
                await asyncio.sleep(0.1 * (attempt + 1))
        except (UnknownTopic, InvalidSubscription):
            return set()
        return names

    async def _names_of(self, topic: str, index: int) -> set[str]:
        try:
            self._led_partition(topic, index)
        except NotLeader:  # led by another broker (or by none right now)
            return await self._leaders.subscription_names(topic, index)
        return set((await self.partition(topic, index, stranded=True)).subs)

    async def check_new(self, topic: str, name: str, config: sub.SubscriptionConfig) -> None:
        """Refuse (``InvalidSubscription``) to create a subscription that can dead-letter
        whose dead-letter topic name is too long, or is the dead-letter topic of another
        existing subscription (whose dead letters a re-drive would mix up).  Checked
        before creating, so two such creations at the same moment may both pass."""
        if not config.max_attempts:
            return  # never dead-letters: no dead-letter topic
        dlq = sub.check_dlq_topic(topic, name)
        for other, other_name in sub.dlq_sharers(topic, name):
            if other in self._topics and other_name in await self.names(other):
                raise InvalidSubscription(
                    f"subscription {name!r} of topic {topic!r} would dead-letter into {dlq!r}, the "
                    f"dead-letter topic of subscription {other_name!r} of topic {other!r}; choose another name"
                )
