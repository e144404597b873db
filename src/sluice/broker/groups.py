"""Committed offsets of consumer groups, kept durable in the data directory.

One JSON file per group under ``<data>/groups/`` (tmp + fsync + rename).  Commits are
coalesced like produce requests: while a group's file is being written, new commits gather
and the next write carries them all, so a consumer committing every 100 messages costs one
file write per round, not one per commit.  A commit is answered once a write that includes
it is durable.

Concurrency: event loop only; file writes run in the given executor.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import Executor
from pathlib import Path

from sluice.errors import InvalidGroup, storage_error_from_os
from sluice.storage.checkpoint import read_json, write_json

_GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

Offsets = dict[tuple[str, int], tuple[int, str]]


def check_group_name(name: str) -> None:
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        raise InvalidGroup(f"invalid group name {name!r}: use 1-249 characters from A-Z a-z 0-9 . _ -")


class GroupOffsets:
    def __init__(self, data_dir: Path, executor: Executor) -> None:
        self.directory = data_dir / "groups"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._executor = executor
        self._offsets: dict[str, Offsets] = {}
        self._writing: dict[str, asyncio.Future] = {}
        self._next: dict[str, asyncio.Future] = {}
        for path in self.directory.glob("*.json"):
            raw = read_json(path, default={})
            self._offsets[path.stem] = {
                (e["topic"], e["partition"]): (e["offset"], e.get("metadata", "")) for e in raw.get("offsets", [])
            }

    def get(self, group: str) -> Offsets:
        check_group_name(group)
        return dict(self._offsets.get(group, {}))

    async def commit(self, group: str, offsets: Offsets) -> None:
        """Store ``offsets`` for ``group``; returns once they are durable."""
        check_group_name(group)
        self._offsets.setdefault(group, {}).update(offsets)
        fut = self._next.get(group)
        if fut is None:
            fut = self._next[group] = asyncio.get_running_loop().create_future()
            if group not in self._writing:
                self._start_write(group)
        await asyncio.shield(fut)

    def forget_topic(self, topic: str) -> None:
        """Drop offsets of a deleted topic from memory (files follow on the next commit)."""
        for offsets in self._offsets.values():
            for key in [k for k in offsets if k[0] == topic]:
                del offsets[key]

    def _start_write(self, group: str) -> None:
        fut = self._next.pop(group)
        self._writing[group] = fut
        snapshot = {
            "offsets": [
                {"topic": t, "partition": p, "offset": o, "metadata": m}
                for (t, p), (o, m) in sorted(self._offsets[group].items())
            ]
        }
        path = self.directory / f"{group}.json"
        task = asyncio.get_running_loop().run_in_executor(self._executor, write_json, path, snapshot)
        task.add_done_callback(lambda t: self._written(group, fut, t))

    def _written(self, group: str, fut: asyncio.Future, task: asyncio.Future) -> None:
        del self._writing[group]
        exc = task.exception()
        if exc is None:
            fut.set_result(None)
        elif isinstance(exc, OSError):
            fut.set_exception(storage_error_from_os(exc, f"commit of group {group}"))
        else:
            fut.set_exception(exc)
        if group in self._next:
            self._start_write(group)
