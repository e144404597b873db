"""Committed offsets of consumer groups, kept durable in the data directory.

One JSON file per group under ``<data>/groups/`` (tmp + fsync + rename).  Commits are
coalesced like produce requests: while a group's file is being written, new commits gather
and the next write carries them all, so a consumer committing every 100 messages costs one
file write per round, not one per commit.  A commit is answered, and becomes visible to
offset fetches, once a write that includes it is durable.

A group file that cannot be read is set aside as ``<name>.bad`` and reported; the broker
starts without it.

Concurrency: event loop only; file writes run in the given executor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from concurrent.futures import Executor
from pathlib import Path

from sluice.errors import InvalidGroup, storage_error_from_os
from sluice.storage.checkpoint import read_json, write_json

log = logging.getLogger("sluice.broker")

_GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")

Offsets = dict[tuple[str, int], tuple[int, str]]


def check_group_name(name: str) -> None:
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        raise InvalidGroup(f"invalid group name {name!r}: use 1-200 characters from A-Z a-z 0-9 . _ -")


def _load(path: Path) -> Offsets:
    raw = read_json(path, default={})
    return {
        (str(e["topic"]), int(e["partition"])): (int(e["offset"]), str(e.get("metadata", "")))
        for e in raw["offsets"]
    }


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
        for path in self.directory.glob("*.json"):
            try:
                self._durable[path.stem] = _load(path)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                bad = path.with_name(path.name + ".bad")
                if path.exists():
                    os.replace(path, bad)
                log.error("offsets of group %s are unreadable (%s); set aside as %s", path.stem, exc, bad)

    def get(self, group: str) -> Offsets:
        check_group_name(group)
        return dict(self._durable.get(group, {}))

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
        fut = self._next.pop(group)
        staged = self._staged.pop(group, {})
        merged = {
            k: v for k, v in {**self._durable.get(group, {}), **staged}.items() if k[0] not in self._deleted
        }
        snapshot = {
            "offsets": [
                {"topic": t, "partition": p, "offset": o, "metadata": m}
                for (t, p), (o, m) in sorted(merged.items())
            ]
        }
        self._writing.add(group)
        path = self.directory / f"{group}.json"
        task = asyncio.get_running_loop().run_in_executor(self._executor, write_json, path, snapshot)
        task.add_done_callback(lambda t: self._written(group, fut, merged, staged, t))

    def _written(self, group: str, fut: asyncio.Future, merged: Offsets, staged: Offsets, task) -> None:
        self._writing.discard(group)
        exc = task.exception()
        if exc is None:
            self._durable[group] = {k: v for k, v in merged.items() if k[0] not in self._deleted}
            fut.set_result(None)
        else:
            # not durable: not visible either; a later commit of the same group retries them
            later = self._staged.setdefault(group, {})
            self._staged[group] = {**staged, **later}
            err = storage_error_from_os(exc, f"commit of group {group}") if isinstance(exc, OSError) else exc
            fut.set_exception(err)
        if group in self._next:
            self._start_write(group)


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
