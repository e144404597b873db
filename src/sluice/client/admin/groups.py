"""Administration of consumer groups: list, describe, delete, reset offsets.

A group is the offsets committed under its name; the broker has no membership protocol, so
it cannot tell whether a consumer of the group is running.  Group requests go to the
group's coordinator (the leader of its ``__groups`` partition) and are retried on
``NOT_COORDINATOR`` within the request timeout (``Routing.group_request``); ``listing`` asks
every live broker.  The log state a lag is computed from comes from each partition's leader.
What must not live here: committing as a consumer does (client/commits.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from sluice import errors
from sluice.client.admin.routing import Routing, raise_first
from sluice.client.admin.topics import Topics
from sluice.protocol import messages
from sluice.protocol.messages import GroupDescription, GroupListing

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class OffsetReset:
    """One partition of an offset reset: the group's committed offset before and after."""

    topic: str
    partition: int
    old: int | None  # None: the group had committed nothing for this partition
    new: int


class Groups:
    """The consumer groups of a cluster.  Concurrency: event loop only."""

    def __init__(self, routing: Routing, topics: Topics) -> None:
        """``routing``: sends the requests (to coordinators, leaders, every broker);
        ``topics``: the offsets of a topic's logs, for resets."""
        self._routing = routing
        self._cluster = routing.cluster
        self._topics = topics

    async def listing(self) -> list[GroupListing]:
        """Every group with committed offsets: its topics, partitions, total lag and the
        time of its latest commit, by name.  Every live broker is asked for the groups it
        coordinates (a broker that cannot be reached fails the call: a partial list would
        mislead); a group two brokers list while its coordinator moves is listed once.

        The lag is summed over the group's committed partitions from each partition's
        leader (see ``describe``), whichever broker coordinates the group; a partition with
        no reachable leader now adds nothing, and is counted in ``lag_unknown``.  That
        costs one DESCRIBE_GROUPS per coordinator and one LIST_OFFSETS per partition
        leader."""
        await self._cluster.refresh([])
        found: dict[str, tuple[int, GroupListing]] = {}  # name -> (its coordinator, listing)
        for node in sorted(self._cluster.brokers):
            conn = await self._cluster.connection(node)
            resp, _ = await conn.request(messages.ListGroupsRequest(), (), self._cluster.request_timeout)
            for g in resp.groups:
                if g.name not in found or g.last_commit_ms > found[g.name][1].last_commit_ms:
                    found[g.name] = (node, g)
        by_node: dict[int, list[str]] = {}
        for name, (node, _) in found.items():
            by_node.setdefault(node, []).append(name)
        described: dict[str, GroupDescription] = {}
        for node, names in sorted(by_node.items()):
            conn = await self._cluster.connection(node)
            req = messages.DescribeGroupsRequest(names=sorted(names))
            resp, _ = await conn.request(req, (), self._cluster.request_timeout)
            for d in resp.groups:
                if d.error == errors.NotCoordinator.code:  # it moved since: ask its new coordinator
                    with contextlib.suppress(errors.UnknownGroup):
                        described[d.name] = await self._description(d.name)
                elif d.error != errors.UnknownGroup.code:  # else deleted since it was listed
                    errors.raise_for_code(d.error, d.message or d.name)
                    described[d.name] = d
        committed = {
            (p.topic, p.partition) for d in described.values() for p in d.partitions if p.committed_offset >= 0
        }
        logs = await self._log_offsets(committed)
        out = []
        for name in sorted(described):
            lags = [_lag(p, logs) for p in described[name].partitions if not p.error and p.committed_offset >= 0]
            out.append(msgspec.structs.replace(
                found[name][1], lag=sum(lag for lag in lags if lag > 0), lag_unknown=lags.count(-1)
            ))
        return out

    async def describe(self, group: str) -> GroupDescription:
        """Per partition of every topic ``group`` committed to: the committed offset (-1 if
        none), log start, high watermark, lag, when the last commit came and from which
        client address.  ``UnknownGroup`` if the group has no committed offsets.

        The committed offsets come from the group's coordinator; log start and high
        watermark from each partition's leader (one LIST_OFFSETS per leader), whichever
        broker coordinates the group.  They are -1 where the partition has no leader now
        (or its leader cannot be reached); the lag is -1 there and where nothing is
        committed."""
        d = await self._description(group)
        logs = await self._log_offsets((p.topic, p.partition) for p in d.partitions if not p.error)
        return msgspec.structs.replace(d, partitions=[_with_log(p, logs) for p in d.partitions])

    async def _description(self, group: str) -> GroupDescription:
        """``group`` as its coordinator describes it (the log state of only the partitions
        it holds a replica of)."""
        resp = await self._routing.group_request(
            group, messages.DescribeGroupsRequest(names=[group]), _check_coordinator
        )
        for g in resp.groups:
            if g.name == group:
                errors.raise_for_code(g.error, g.message or group)
                return g
        raise errors.UnknownGroup(group)

    async def _log_offsets(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(log start, high watermark) of each (topic, partition) of ``keys`` as its leader
        has them now, from fresh metadata: one LIST_OFFSETS request per leader, all sent at
        once.  Partitions whose leader moved meanwhile are asked again (a few times).  A
        partition with no leader now, or whose leader cannot be reached or answers with
        another error, is left out: its log state is unknown."""
        todo, out = sorted(set(keys)), {}
        for attempt in range(3):
            if not todo:
                break
            if attempt:
                await asyncio.sleep(0.1 * attempt)
            await self._cluster.refresh(sorted({t for t, _ in todo}))
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for t, p in todo:
                node = self._cluster.leader(t, p)
                if node >= 0:
                    by_leader.setdefault(node, []).append((t, p))
            answers = await asyncio.gather(*(self._log_offsets_at(n, parts) for n, parts in by_leader.items()))
            moved = []
            for found, not_leader in answers:
                out.update(found)
                moved += not_leader
            todo = moved
        return out

    async def _log_offsets_at(self, node: int, keys: list[tuple[str, int]]):
        """``_log_offsets`` of one leader: ({(topic, partition): (log start, high
        watermark)}, the partitions it no longer leads); nothing if it cannot be reached."""
        asked = [
            messages.ListOffsetsPartition(topic=t, partition=p, timestamp=ts)
            for t, p in keys for ts in (messages.EARLIEST, messages.LATEST)
        ]
        try:
            conn = await self._cluster.connection(node)
            resp, _ = await conn.request(messages.ListOffsetsRequest(partitions=asked), (), self._cluster.request_timeout)
        except (errors.ConnectionClosed, errors.RequestTimedOut, errors.NotLeader):
            self._cluster.node_failed(node)
            return {}, []
        found: dict[tuple[str, int], list[int]] = {}
        not_leader = set()
        for a, r in zip(asked, resp.partitions, strict=False):  # answered in the order asked
            key = (a.topic, a.partition)
            if (r.topic, r.partition) != key:
                break
            if r.error == errors.NotLeader.code:
                not_leader.add(key)
            elif not r.error:
                found.setdefault(key, []).append(r.offset)
        return {k: (v[0], v[1]) for k, v in found.items() if len(v) == 2}, sorted(not_leader)

    async def delete(self, group: str) -> None:
        """Delete ``group``'s committed offsets, durably; ``UnknownGroup`` if it has none.

        Nothing stops a consumer of the group that is still running: its next commit
        creates the group again.
        """
        resp = await self._routing.group_request(
            group, messages.DeleteGroupsRequest(names=[group]), _check_coordinator
        )
        raise_first(resp.groups)

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        *,
        to: str | int | datetime | None = None,
        shift_by: int | None = None,
        partitions: Iterable[int] | None = None,
        dry_run: bool = False,
    ) -> list[OffsetReset]:
        """Move ``group``'s committed offsets of ``topic`` (all its partitions, or
        ``partitions``); return the old and new offset of each partition, by partition.

        Exactly one of ``to`` and ``shift_by``.  ``to``: ``"earliest"`` (the log start),
        ``"latest"`` (the high watermark), an ``int`` offset, or a ``datetime`` (the first
        offset with a timestamp at or after it, else the high watermark; a naive datetime
        is UTC).  ``shift_by``: the committed offset plus N (negative: back); every
        partition must have one, else ``InvalidRequest``.  New offsets are clamped to
        ``[log start, high watermark]``.  All partitions are committed in one request; a
        group that does not exist yet is created.  ``dry_run``: compute, commit nothing.

        There is no membership to check: a consumer of the group that is running keeps its
        own positions and overwrites the reset with its next commit.  Stop it first.
        """
        if (to is None) == (shift_by is None):
            raise errors.ConfigError("give exactly one of to= and shift_by=")
        if to is not None and not (
            to in ("earliest", "latest") or isinstance(to, datetime)
            or (isinstance(to, int) and not isinstance(to, bool) and to >= 0)
        ):
            raise errors.ConfigError(f"to= takes 'earliest', 'latest', an offset >= 0 or a datetime, got {to!r}")
        if shift_by is not None and (not isinstance(shift_by, int) or isinstance(shift_by, bool)):
            raise errors.ConfigError(f"shift_by= takes an int, got {shift_by!r}")
        parts = await self._routing.partitions(topic) if partitions is None else sorted(set(partitions))
        earliest = await self._topics.list_offsets(topic, parts, messages.EARLIEST)
        latest = await self._topics.list_offsets(topic, parts, messages.LATEST)
        committed = await self._committed(group, topic, parts)
        if shift_by is not None:
            missing = [p for p in parts if committed[p] is None]
            if missing:
                raise errors.InvalidRequest(
                    f"group {group!r} has no committed offset to shift for {topic} partition(s) "
                    f"{', '.join(map(str, missing))}"
                )
            target = {p: committed[p] + shift_by for p in parts}
        elif to == "earliest":
            target = earliest
        elif to == "latest":
            target = latest
        elif isinstance(to, datetime):
            when = to if to.tzinfo is not None else to.replace(tzinfo=UTC)
            target = await self._topics.list_offsets(topic, parts, (when - _EPOCH) // timedelta(milliseconds=1))
        else:
            target = dict.fromkeys(parts, to)
        resets = [
            OffsetReset(topic, p, committed[p], min(max(target[p], earliest[p]), latest[p])) for p in parts
        ]
        if not dry_run and resets:
            req = messages.OffsetCommitRequest(
                group=group,
                offsets=[messages.CommitOffset(topic=topic, partition=r.partition, offset=r.new) for r in resets],
            )
            await self._routing.group_request(group, req, _raise_partition_errors)
        return resets

    async def _committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        req = messages.OffsetFetchRequest(
            group=group, partitions=[messages.TopicPartition(topic=topic, partition=p) for p in partitions]
        )
        out: dict[int, int | None] = dict.fromkeys(partitions)
        for r in (await self._routing.group_request(group, req)).offsets:
            errors.raise_for_code(r.error)
            out[r.partition] = r.offset if r.offset >= 0 else None
        return out


def _check_coordinator(resp) -> None:
    """Raise a group result's ``NotCoordinator`` (retried); other errors are the caller's."""
    for g in resp.groups:
        if g.error == errors.NotCoordinator.code:
            errors.raise_for_code(g.error, g.message or g.name)


def _raise_partition_errors(resp) -> None:
    for r in resp.partitions:
        errors.raise_for_code(r.error, r.message)


def _with_log(p: messages.GroupPartition, logs: dict) -> messages.GroupPartition:
    """``p`` with its leader's log start and high watermark from ``logs`` (-1 when not
    there: unknown) and the lag they give."""
    if p.error:
        return p
    start, hw = logs.get((p.topic, p.partition), (-1, -1))
    return msgspec.structs.replace(p, log_start_offset=start, high_watermark=hw, lag=_lag(p, logs))


def _lag(p: messages.GroupPartition, logs: dict) -> int:
    """Leader's high watermark minus the committed offset, at least 0; -1 when either is
    unknown."""
    _, hw = logs.get((p.topic, p.partition), (-1, -1))
    return max(hw - p.committed_offset, 0) if hw >= 0 and p.committed_offset >= 0 else -1
