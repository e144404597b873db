"""Administration of topics: create, delete, list, describe, alter config, add partitions,
list offsets.

Thin: each method is one request to a broker (the controller when metadata names one), or
one per partition leader for the log state, and turns per-topic or per-partition error codes
into exceptions.  What must not live here: subscriptions (client/admin/subscriptions.py),
which ``add_partitions`` asks to extend to the new partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from sluice import errors
from sluice.client.admin.routing import Routing, raise_first
from sluice.client.admin.subscriptions import Subscriptions
from sluice.config import MAX_PARTITIONS
from sluice.protocol import messages
from sluice.protocol.messages import TopicDescription, TopicMetadata

log = logging.getLogger("sluice.client.admin")


class Topics:
    """The topics of a cluster.  Concurrency: event loop only."""

    def __init__(self, routing: Routing, subscriptions: Subscriptions) -> None:
        """``routing``: sends the requests; ``subscriptions``: extended to the partitions a
        topic gains."""
        self._routing = routing
        self._subscriptions = subscriptions

    async def create(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        replication_factor: int = 0,
    ) -> None:
        """Create a topic of ``partitions`` partitions with ``replication_factor`` replicas
        each (0: the broker's default).

        Raises ``TopicAlreadyExists``, ``InvalidTopicName``, ``InvalidPartitions``,
        ``InvalidReplicationFactor`` (more replicas than live brokers), ``InvalidConfig``.
        """
        for what, value in (("partitions", partitions), ("replication_factor", replication_factor)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise errors.ConfigError(f"{what} must be an int, got {value!r}")
        # the ranges are the broker's to check: it answers INVALID_PARTITIONS and
        # INVALID_REPLICATION_FACTOR, knowing how many brokers are alive
        cfg = {str(k): str(v) for k, v in (config or {}).items()}
        topic = messages.NewTopic(
            name=name, partitions=partitions, config=cfg, replication_factor=replication_factor
        )
        resp = await self._routing.request(messages.CreateTopicsRequest(topics=[topic]))
        raise_first(resp.topics)

    async def delete(self, name: str) -> None:
        """Delete topic ``name`` and its data; ``UnknownTopic`` if there is none."""
        resp = await self._routing.request(messages.DeleteTopicsRequest(names=[name]))
        raise_first(resp.topics)

    async def alter_config(
        self,
        name: str,
        config: dict[str, str] | None = None,
        *,
        delete: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set the overrides in ``config`` and drop those named in ``delete`` (back to the
        broker's default) for topic ``name``.

        All or nothing, durable, and in effect on the running broker at once: produce
        checks the new ``max.message.bytes``, the next write follows the new flush policy,
        the next retention pass and segment roll the new limits.  Overrides not named stay
        as they are.  ``validate_only``: check everything, change nothing.  Raises
        ``UnknownTopic``, ``InvalidConfig`` (unknown key, bad value, a key both set and
        deleted).
        """
        change = messages.TopicConfigChange(
            name=name, config={str(k): str(v) for k, v in (config or {}).items()}, delete=list(delete)
        )
        req = messages.AlterTopicConfigsRequest(topics=[change], validate_only=validate_only)
        resp = await self._routing.request(req)
        raise_first(resp.topics)

    async def add_partitions(
        self, name: str, *, total: int | None = None, count: int | None = None, validate_only: bool = False
    ) -> int:
        """Grow topic ``name`` to ``total`` partitions, or by ``count``: give exactly one.

        Returns the new partition count.  New partitions start empty; existing ones keep
        their data, so keys hashed to a partition may map to another one from now on.
        Producers and subscribed consumers pick the new partitions up with their next
        metadata refresh.  Every subscription of the topic is extended to the new
        partitions, from their start, with its own settings (one that cannot be within
        the request timeout, its leaders away, is logged; a running Subscriber of it
        extends it when it sees them): this call may take that long.
        Durable; partitions are never removed.  Raises ``InvalidPartitions`` unless the
        new total is above the current one (and within the broker's limits),
        ``UnknownTopic``.  ``validate_only``: check, change nothing.
        """
        if (total is None) == (count is None):
            raise errors.ConfigError("give exactly one of total= and count=")
        for value in (total, count):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise errors.ConfigError(f"partition counts are ints, got {value!r}")
        if count is not None and count < 1:
            raise errors.InvalidPartitions(f"partitions to add must be at least 1, got {count}")
        before = len(await self._routing.partitions(name))
        if total is None:
            if before + count > MAX_PARTITIONS:  # say what was given, not the total it makes
                raise errors.InvalidPartitions(
                    f"topic {name!r} has {before} partitions and may have {MAX_PARTITIONS}: "
                    f"at most {max(MAX_PARTITIONS - before, 0)} more, not {count}"
                )
            total = before + count
        req = messages.CreatePartitionsRequest(
            topics=[messages.PartitionsIncrease(name=name, total=total)], validate_only=validate_only
        )
        resp = await self._routing.request(req)
        raise_first(resp.topics)
        if not validate_only:
            try:
                await self._subscriptions.extend(name, before, total)
            except errors.SluiceError as exc:  # the subscriptions could not be listed
                log.warning("subscriptions of %s not extended to its new partitions yet: %s", name, exc)
        return total

    async def listing(self, include_internal: bool = False) -> list[TopicMetadata]:
        """Metadata of every topic (partition leaders, replicas, max message bytes); the
        internal topics (``__groups``: state written by brokers) only with
        ``include_internal``."""
        resp = await self._routing.request(messages.MetadataRequest(topics=None))
        return [t for t in resp.topics if include_internal or not t.internal]

    async def describe(self, name: str) -> TopicDescription:
        """Config, replication factor and, per partition, the replication state (leader,
        replicas, ISR, leader epoch) and log state (log start, high watermark, log end,
        size, segments) of a topic, the log state from each partition's leader: -1 where
        that leader could not be reached."""
        resp = await self._routing.request(messages.DescribeTopicsRequest(names=[name]))
        for t in resp.topics:
            if t.name == name:
                errors.raise_for_code(t.error, t.message or name)
                return await self._with_leaders_view(t)
        raise errors.UnknownTopic(name)

    async def _with_leaders_view(self, t: TopicDescription) -> TopicDescription:
        """``t`` with each partition's log state as its leader sees it (the answering
        broker fills only the partitions it leads)."""
        others = [p.partition for p in t.partitions if p.log_end_offset < 0 and p.leader >= 0]
        if not others:
            return t

        def results(resp):
            [d] = resp.topics  # a leader that has not seen the topic yet: -1 stays
            return [p for p in d.partitions if p.partition in wanted] if not d.error else []

        wanted = set(others)
        found = await self._routing.to_leaders(  # an unreachable leader's partitions keep -1
            t.name, others, lambda _: messages.DescribeTopicsRequest(names=[t.name]), results,
            skip_unreachable=True,
        )
        by_index = {p.partition: p for p in found if p.log_end_offset >= 0}
        return msgspec.structs.replace(
            t, partitions=[by_index.get(p.partition, p) for p in t.partitions]
        )

    async def list_offsets(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        timestamp: int = messages.LATEST,
    ) -> dict[int, int]:
        """Offsets of ``topic``'s partitions (all by default) at ``timestamp``.

        ``messages.LATEST`` (-1): the next offset to be written; ``messages.EARLIEST`` (-2):
        the first offset kept; a time in ms: the first offset with a timestamp >= it (-1 if
        none).  Returns {partition: offset}.
        """
        if partitions is None:
            partitions = await self._routing.partitions(topic)

        def request(group):
            return messages.ListOffsetsRequest(partitions=[
                messages.ListOffsetsPartition(topic=topic, partition=p, timestamp=timestamp) for p in group
            ])

        out = {}
        for r in await self._routing.to_leaders(topic, partitions, request, lambda resp: resp.partitions):
            errors.raise_for_code(r.error, r.message)
            out[r.partition] = r.offset
        return out
