"""Committed offsets of consumer groups, kept durable in the data directory.

One JSON file per group under ``<data>/groups/`` (tmp + fsync + rename).  Commits are
coalesced like produce requests: while a group's file is being written, new commits gather
and the next write carries them all, so a consumer committing every 100 messages costs one
file write per round, not one per commit.  A commit is answered, and becomes visible to
offset fetches, once a write that includes it is durable.

A group exists from its first commit until it is deleted; there is no membership protocol,
so the broker knows of a group only its offsets and, per partition, when the last commit
came and from which client address.  Deleting a group removes its file; commits answered
before a deletion are deleted with it, a commit after it starts the group again from
nothing (a consumer still running recreates the group this way).

A group file that cannot be read is set aside as ``<name>.bad`` and reported; the broker
starts without it.

Concurrency: event loop only; file writes run in the given executor.

``GroupHandlers`` is the part of ``Broker`` (a mixin) that answers the group and offset
commit APIs from this store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import NamedTuple

from sluice.broker.peer import client_address
from sluice.broker.topics import error_fields
from sluice.errors import (
    BrokerError,
    InvalidGroup,
    InvalidRequest,
    UnknownGroup,
    storage_error_from_os,
)
from sluice.protocol import messages as m
from sluice.storage.checkpoint import fsync_dir, read_json, write_json

log = logging.getLogger("sluice.broker")

MAX_COMMIT_METADATA = 4096

_GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class Committed(NamedTuple):
    """One committed offset and what the broker knows of its commit."""

    offset: int
    metadata: str = ""
    time_ms: int = -1  # broker time of the commit; -1 in files written before it was kept
    client: str = ""  # client address (host:port) of the committing connection


Offsets = dict[tuple[str, int], Committed]


def check_group_name(name: str) -> None:
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        raise InvalidGroup(f"invalid group name {name!r}: use 1-200 characters from A-Z a-z 0-9 . _ -")


def _load(path: Path) -> Offsets:
    raw = read_json(path, default={})
    return {
        (str(e["topic"]), int(e["partition"])): Committed(
            int(e["offset"]), str(e.get("metadata", "")), int(e.get("time", -1)), str(e.get("client", ""))
        )
        for e in raw["offsets"]
    }


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


class GroupOffsets:
    def __init__(self, data_dir: Path, executor: Executor) -> None:
        self.directory = data_dir / "groups"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._executor = executor
        self._durable: dict[str, Offsets] = {}  # what the files hold
        self._staged: dict[str, Offsets] = {}  # commits waiting for the next write
        self._writing: set[str] = set()
        self._next: dict[str, asyncio.Future] = {}
        # topics deleted since: a write that started before the deletion must not bring
        # their offsets back; a commit to a re-created topic of the same name clears it
        self._deleted: set[str] = set()
        # groups deleted since their last write: the commits staged before the deletion,
        # dropped by it (restored if the deletion fails)
        self._cleared: dict[str, Offsets] = {}
        for path in self.directory.glob("*.json"):
            try:
                self._durable[path.stem] = _load(path)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                bad = path.with_name(path.name + ".bad")
                if path.exists():
                    os.replace(path, bad)
                log.error("offsets of group %s are unreadable (%s); set aside as %s", path.stem, exc, bad)

    def get(self, group: str) -> Offsets:
        """The durable offsets of ``group`` (empty if it has none)."""
        check_group_name(group)
        return dict(self._durable.get(group, {}))

    def names(self) -> list[str]:
        """Every group with a durable file, sorted."""
        return sorted(self._durable)

    def existing(self, group: str) -> Offsets:
        """The durable offsets of ``group``; ``UnknownGroup`` if it has none: it never
        committed, or it was deleted."""
        check_group_name(group)
        if group not in self._durable:
            raise UnknownGroup(f"group {group!r} has no committed offsets")
        return dict(self._durable[group])

    async def delete(self, group: str) -> None:
        """Forget ``group`` durably (its file is removed); ``UnknownGroup`` if it has none.

        Ordered with commits: those staged before are dropped with the group; those made
        after start it again.  Returns once the deletion is durable.
        """
        self.existing(group)
        self._cleared[group] = {**self._cleared.get(group, {}), **self._staged.pop(group, {})}
        await asyncio.shield(self._schedule(group))

    async def commit(self, group: str, offsets: Offsets) -> None:
        """Store ``offsets`` for ``group``; returns once they are durable."""
        check_group_name(group)
        self._deleted.difference_update(t for t, _ in offsets)
        self._staged.setdefault(group, {}).update(offsets)
        await asyncio.shield(self._schedule(group))

    async def forget_topic(self, topic: str) -> None:
        """Drop every group's offsets of a deleted topic, durably (a new topic of the same
        name must not inherit them)."""
        self._deleted.add(topic)
        waits = []
        for group, offsets in self._durable.items():
            if any(t == topic for t, _ in offsets):
                self._durable[group] = {k: v for k, v in offsets.items() if k[0] != topic}
                waits.append(self._schedule(group))
        for staged in self._staged.values():
            for key in [k for k in staged if k[0] == topic]:
                del staged[key]
        results = await asyncio.gather(*waits, return_exceptions=True)
        for exc in results:
            if isinstance(exc, BaseException):
                log.error("could not drop offsets of deleted topic %s: %s", topic, exc)

    def _schedule(self, group: str) -> asyncio.Future:
        """The future of the next write of ``group``'s file (started now if none runs)."""
        fut = self._next.get(group)
        if fut is None:
            fut = self._next[group] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_retrieve)
            if group not in self._writing:
                self._start_write(group)
        return fut

    def _start_write(self, group: str) -> None:
        """Write the group's file (or remove it: a deletion no commit followed)."""
        fut = self._next.pop(group)
        staged = self._staged.pop(group, {})
        dropped = self._cleared.pop(group, None)
        base = self._durable.get(group, {}) if dropped is None else {}
        merged = {k: v for k, v in {**base, **staged}.items() if k[0] not in self._deleted}
        path = self.directory / f"{group}.json"
        if dropped is not None and not merged:
            job = (_remove, path)
        else:
            snapshot = {
                "offsets": [
                    {"topic": t, "partition": p, "offset": c.offset, "metadata": c.metadata,
                     "time": c.time_ms, "client": c.client}
                    for (t, p), c in sorted(merged.items())
                ]
            }
            job = (write_json, path, snapshot)
        self._writing.add(group)
        task = asyncio.get_running_loop().run_in_executor(self._executor, *job)
        task.add_done_callback(lambda t: self._written(group, fut, merged, staged, dropped, t))

    def _written(
        self, group: str, fut: asyncio.Future, merged: Offsets, staged: Offsets, dropped: Offsets | None, task
    ) -> None:
        self._writing.discard(group)
        exc = task.exception()
        deletion = dropped is not None and not merged
        if exc is None:
            if deletion:
                self._durable.pop(group, None)
            else:
                self._durable[group] = {k: v for k, v in merged.items() if k[0] not in self._deleted}
            fut.set_result(None)
        else:
            # not durable: not visible either; a later commit of the same group retries them
            # (a failed deletion is not retried: its caller was told it failed)
            later = self._staged.setdefault(group, {})
            self._staged[group] = {**(dropped or {}), **staged, **later}
            what = f"{'deletion' if deletion else 'commit'} of group {group}"
            err = storage_error_from_os(exc, what) if isinstance(exc, OSError) else exc
            fut.set_exception(err)
        if group in self._next:
            self._start_write(group)


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


class GroupHandlers:
    """The group and committed-offset handlers of ``Broker`` (a mixin)."""

    def _group_partition(self, topic: str, index: int, c: Committed | None) -> m.GroupPartition:
        """What is known of one partition for a group: its commit (if any) and the log."""
        known = {} if c is None else {
            "committed_offset": c.offset, "metadata": c.metadata,
            "commit_time_ms": c.time_ms, "committed_by": c.client,
        }
        try:
            part = self.partition(topic, index)
        except BrokerError as exc:
            return m.GroupPartition(topic=topic, partition=index, **known, **error_fields(exc))
        hw = part.high_watermark
        return m.GroupPartition(
            topic=topic, partition=index, **known, log_start_offset=part.log_start_offset,
            high_watermark=hw, lag=-1 if c is None else max(hw - c.offset, 0),
        )

    async def list_groups(self, req: m.ListGroupsRequest, _att):
        out = []
        for name in self.groups.names():
            committed = self.groups.get(name)
            lags = (self._group_partition(t, p, c).lag for (t, p), c in committed.items())
            out.append(
                m.GroupListing(
                    name=name, topics=sorted({t for t, _ in committed}), partitions=len(committed),
                    lag=sum(lag for lag in lags if lag > 0),
                    last_commit_ms=max((c.time_ms for c in committed.values()), default=-1),
                )
            )
        return m.ListGroupsResponse(groups=out), ()

    async def describe_groups(self, req: m.DescribeGroupsRequest, _att):
        """Per group: every partition of every topic it committed to, committed or not."""
        out = []
        for name in req.names:
            try:
                committed = self.groups.existing(name)
            except BrokerError as exc:
                out.append(m.GroupDescription(name=name, **error_fields(exc)))
                continue
            keys = set(committed)
            for t in {t for t, _ in committed}:
                if t in self.topics:
                    keys.update((t, i) for i in range(self.topics[t].count))
            partitions = [self._group_partition(t, p, committed.get((t, p))) for t, p in sorted(keys)]
            out.append(m.GroupDescription(name=name, partitions=partitions))
        return m.DescribeGroupsResponse(groups=out), ()

    async def delete_groups(self, req: m.DeleteGroupsRequest, _att):
        """Delete groups' offsets.  No membership exists to check: a consumer of the group
        still running recreates it with its next commit."""
        results = []
        for name in req.names:
            try:
                await self.groups.delete(name)
                results.append(m.GroupResult(name=name))
            except BrokerError as exc:
                results.append(m.GroupResult(name=name, **error_fields(exc)))
        return m.DeleteGroupsResponse(groups=results), ()

    async def offset_commit(self, req: m.OffsetCommitRequest, _att):
        check_group_name(req.group)
        now_ms, client = int(time.time() * 1000), client_address.get()
        ok: dict = {}
        results = []
        for c in req.offsets:
            try:
                self.check_partition(c.topic, c.partition)
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
                await self.groups.commit(req.group, ok)
            except BrokerError as exc:
                results = [
                    r if r.error else m.PartitionError(topic=r.topic, partition=r.partition, **error_fields(exc))
                    for r in results
                ]
        return m.OffsetCommitResponse(partitions=results), ()

    async def offset_fetch(self, req: m.OffsetFetchRequest, _att):
        committed = self.groups.get(req.group)
        keys = committed.keys() if req.partitions is None else [(tp.topic, tp.partition) for tp in req.partitions]
        out = []
        for key in sorted(keys):
            c = committed.get(key, Committed(-1))
            out.append(m.FetchedOffset(topic=key[0], partition=key[1], offset=c.offset, metadata=c.metadata))
        return m.OffsetFetchResponse(offsets=out), ()
