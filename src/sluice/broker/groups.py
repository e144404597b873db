"""The group service: the group and committed-offset APIs (``GroupService``).

The offsets themselves are kept by the broker's ``GroupCoordinator`` (broker/coordinator.py)
in the internal topic ``__groups``.  Each handler answers only for the groups this broker
coordinates; for any other group it answers ``NOT_COORDINATOR`` (request-level for
OffsetCommit and OffsetFetch, per group for DescribeGroups and DeleteGroups), and
ListGroups lists the groups of the ``__groups`` partitions this broker leads.

There is no membership protocol: the broker knows of a group only its offsets and, per
partition, when the last commit came and from which client address.

Log start, high watermark and lag are filled from this broker's own replicas only (-1 for
partitions it holds none of; a follower's lag its leader's a little), and ListGroups' lag
counts only those: the admin client (client/admin/) asks each partition's leader
instead, whichever broker coordinates the group.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.peer import Peer
from sluice.broker.registry import TopicRegistry
from sluice.broker.results import error_fields
from sluice.errors import BrokerError, InvalidRequest, NotCoordinator
from sluice.protocol import messages as m
from sluice.protocol.group_records import Committed

MAX_COMMIT_METADATA = 4096


class GroupService:
    """OFFSET_COMMIT, OFFSET_FETCH, LIST_GROUPS, DESCRIBE_GROUPS, DELETE_GROUPS.  Event
    loop only.

    Collaborators: ``topics``, where partitions are looked up (for the log state shown
    beside commits); ``coordinator``, the group coordinator, or None while ``__groups``
    does not exist yet (the broker starts it later: broker.py)."""

    def __init__(self, topics: TopicRegistry, coordinator: Callable[[], GroupCoordinator | None]) -> None:
        self.topics = topics
        self._coordinator = coordinator

    def handlers(self) -> dict:
        return {
            m.Api.OFFSET_COMMIT: self.offset_commit,
            m.Api.OFFSET_FETCH: self.offset_fetch,
            m.Api.LIST_GROUPS: self.list_groups,
            m.Api.DESCRIBE_GROUPS: self.describe_groups,
            m.Api.DELETE_GROUPS: self.delete_groups,
        }

    def coordinator(self) -> GroupCoordinator:
        """The group coordinator; ``NotCoordinator`` while ``__groups`` does not exist yet."""
        groups = self._coordinator()
        if groups is None:
            raise NotCoordinator("the group coordinator is starting (no __groups topic yet); retry")
        return groups

    def _group_partition(self, topic: str, index: int, c: Committed | None) -> m.GroupPartition:
        """What is known of one partition for a group: its commit (if any) and the log."""
        known = {} if c is None else {
            "committed_offset": c.offset, "metadata": c.metadata,
            "commit_time_ms": c.time_ms, "committed_by": c.client,
        }
        try:
            part = self.topics.check_partition(topic, index).partitions.get(index)
        except BrokerError as exc:
            return m.GroupPartition(topic=topic, partition=index, **known, **error_fields(exc))
        if part is None:  # no replica here (a cluster's coordinator): the log state is unknown
            return m.GroupPartition(topic=topic, partition=index, **known, log_start_offset=-1, high_watermark=-1)
        hw = part.high_watermark  # a follower's lags its leader's a little
        return m.GroupPartition(
            topic=topic, partition=index, **known, log_start_offset=part.log_start_offset,
            high_watermark=hw, lag=-1 if c is None else max(hw - c.offset, 0),
        )

    async def list_groups(self, req: m.ListGroupsRequest, _att, _peer: Peer):
        out = []
        if self._coordinator() is None:  # no __groups yet: no groups either
            return m.ListGroupsResponse(groups=out), ()
        for name in self.coordinator().names():
            committed = self.coordinator().get(name)
            lags = (self._group_partition(t, p, c).lag for (t, p), c in committed.items())
            out.append(
                m.GroupListing(
                    name=name, topics=sorted({t for t, _ in committed}), partitions=len(committed),
                    lag=sum(lag for lag in lags if lag > 0),
                    last_commit_ms=max((c.time_ms for c in committed.values()), default=-1),
                )
            )
        return m.ListGroupsResponse(groups=out), ()

    async def describe_groups(self, req: m.DescribeGroupsRequest, _att, _peer: Peer):
        """Per group: every partition of every topic it committed to, committed or not."""
        out = []
        for name in req.names:
            try:
                committed = self.coordinator().existing(name)
            except BrokerError as exc:
                out.append(m.GroupDescription(name=name, **error_fields(exc)))
                continue
            keys = set(committed)
            for t in {t for t, _ in committed}:
                if t in self.topics.topics:
                    keys.update((t, i) for i in range(self.topics.topics[t].count))
            partitions = [self._group_partition(t, p, committed.get((t, p))) for t, p in sorted(keys)]
            out.append(m.GroupDescription(name=name, partitions=partitions))
        return m.DescribeGroupsResponse(groups=out), ()

    async def delete_groups(self, req: m.DeleteGroupsRequest, _att, _peer: Peer):
        """Delete groups' offsets.  No membership exists to check: a consumer of the group
        still running recreates it with its next commit."""
        results = []
        for name in req.names:
            try:
                await self.coordinator().delete(name)
                results.append(m.GroupResult(name=name))
            except BrokerError as exc:
                results.append(m.GroupResult(name=name, **error_fields(exc)))
        return m.DeleteGroupsResponse(groups=results), ()

    async def offset_commit(self, req: m.OffsetCommitRequest, _att, peer: Peer):
        """Commit the request's offsets in one append to the group's ``__groups``
        partition; answered once it is in the log.  Partitions that do not exist, negative
        offsets and oversized metadata are refused one by one; the rest are committed."""
        self.coordinator().check(req.group)
        now_ms, client = int(time.time() * 1000), peer.address
        ok: dict = {}
        results = []
        for c in req.offsets:
            try:
                self.topics.check_partition(c.topic, c.partition)
                if c.offset < 0:
                    raise InvalidRequest(f"cannot commit negative offset {c.offset}")
                if len(c.metadata) > MAX_COMMIT_METADATA:
                    raise InvalidRequest(f"commit metadata is limited to {MAX_COMMIT_METADATA} characters")
                ok[(c.topic, c.partition)] = Committed(c.offset, c.metadata, now_ms, client)
                results.append(m.PartitionError(topic=c.topic, partition=c.partition))
            except BrokerError as exc:
                results.append(m.PartitionError(topic=c.topic, partition=c.partition, **error_fields(exc)))
        if ok:
            try:
                await self.coordinator().commit(req.group, ok)
            except BrokerError as exc:
                results = [
                    r if r.error else m.PartitionError(topic=r.topic, partition=r.partition, **error_fields(exc))
                    for r in results
                ]
        return m.OffsetCommitResponse(partitions=results), ()

    async def offset_fetch(self, req: m.OffsetFetchRequest, _att, _peer: Peer):
        """The group's committed offsets (all, or those asked: -1 where none)."""
        committed = self.coordinator().get(req.group)
        keys = committed.keys() if req.partitions is None else [(tp.topic, tp.partition) for tp in req.partitions]
        out = []
        for key in sorted(keys):
            c = committed.get(key, Committed(-1))
            out.append(m.FetchedOffset(topic=key[0], partition=key[1], offset=c.offset, metadata=c.metadata))
        return m.OffsetFetchResponse(offsets=out), ()
