"""Import of committed offsets from the files older brokers kept, into ``__groups``.

Brokers before ``__groups`` kept one JSON file per group, ``<data>/groups/<group>.json``::

    {"offsets": [{"topic": str, "partition": int, "offset": int,
                  "metadata": str, "time": int, "client": str}, ...]}

(``metadata``, ``time`` and ``client`` may be missing in the oldest files.)  At start, a
broker that finds that directory commits every group's offsets to ``__groups`` through its
coordinator, then moves the directory aside to ``<data>/groups.migrated``: it is never
deleted, and a file that cannot be read is reported and stays there (a file that is not JSON
as ``<group>.json.bad``, see storage/checkpoint.py).  All or nothing:
when some group is coordinated by another broker, or a write fails, nothing is moved and
the next start tries again (re-importing the same offsets is harmless: no client commits
before the broker has started).
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import Executor
from pathlib import Path

from sluice.broker.coordinator import GroupCoordinator, Offsets, check_group_name
from sluice.errors import BrokerError, InvalidGroup
from sluice.protocol.group_records import Committed
from sluice.storage.checkpoint import fsync_dir, read_json

log = logging.getLogger("sluice.broker")

LEGACY_DIR = "groups"
MIGRATED_DIR = "groups.migrated"


def read_legacy_groups(directory: Path) -> tuple[dict[str, Offsets], list[Path]]:
    """The offsets of every readable ``<group>.json`` in ``directory``, and the paths of
    the files that could not be read (a bad name, not JSON, not this layout)."""
    groups: dict[str, Offsets] = {}
    unreadable: list[Path] = []
    for path in sorted(directory.glob("*.json")):
        try:
            check_group_name(path.stem)
            raw = read_json(path, default={})
            groups[path.stem] = {
                (str(e["topic"]), int(e["partition"])): Committed(
                    int(e["offset"]), str(e.get("metadata", "")), int(e.get("time", -1)), str(e.get("client", ""))
                )
                for e in raw["offsets"]
            }
        except (ValueError, KeyError, TypeError, AttributeError, InvalidGroup) as exc:
            log.error("offsets of group %s are unreadable (%s); not imported", path.stem, exc)
            unreadable.append(path)
    return groups, unreadable


def _move_aside(directory: Path, target: Path) -> None:
    os.replace(directory, target)
    fsync_dir(directory.parent)


async def migrate_legacy_groups(data_dir: Path, coordinator: GroupCoordinator, executor: Executor) -> int:
    """Import ``<data>/groups/*.json`` into ``__groups`` and move the directory aside (see
    the module docstring); returns how many groups were imported (0 with no directory).
    A failed write raises its ``BrokerError``: the directory then stays where it is."""
    directory = data_dir / LEGACY_DIR
    if not directory.is_dir():
        return 0
    loop = asyncio.get_running_loop()
    groups, unreadable = await loop.run_in_executor(executor, read_legacy_groups, directory)
    elsewhere = []
    for group in groups:
        try:
            coordinator.check(group)
        except BrokerError:
            elsewhere.append(group)
    if elsewhere:
        log.warning(
            "%s holds offsets of %d group(s) this broker does not coordinate (%s): "
            "not imported yet; the next start tries again",
            directory, len(elsewhere), ", ".join(sorted(elsewhere)[:10]),
        )
        return 0
    for group, offsets in groups.items():
        if offsets:
            await coordinator.commit(group, offsets)
    target = data_dir / MIGRATED_DIR
    if target.exists():  # an earlier migration's: keep both
        n = 1
        while (data_dir / f"{MIGRATED_DIR}.{n}").exists():
            n += 1
        target = data_dir / f"{MIGRATED_DIR}.{n}"
    await loop.run_in_executor(executor, _move_aside, directory, target)
    partitions = sum(len(o) for o in groups.values())
    log.info(
        "imported the committed offsets of %d group(s) (%d partition(s)) from %s into __groups: %s; "
        "the files are kept in %s", len(groups), partitions, directory, ", ".join(sorted(groups)) or "none", target,
    )
    if unreadable:
        log.error("not imported (unreadable), kept in %s: %s", target, ", ".join(p.name for p in unreadable))
    return len(groups)
