"""Small state files written atomically: tmp -> fsync -> rename -> fsync(dir).

After a crash a state file holds either its old or its new content, never a mix.  A file
that cannot be parsed is quarantined as ``<name>.bad`` by the caller and reported, never
silently dropped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or unlink inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably. Raises ``OSError`` as is."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, sort_keys=True, indent=1).encode())


def read_json(path: Path, default=None):
    """The parsed content of ``path``; ``default`` if it does not exist.

    A file that is not valid JSON is renamed to ``<name>.bad`` and ``ValueError`` raised
    naming both files, so the caller can report it.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(data)
    except ValueError as exc:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        raise ValueError(f"{path} is corrupt ({exc}); moved to {bad}") from exc


# --------------------------------------------------------------------------- offsets checkpoint
#
# Kafka's offset checkpoint layout (``replication-offset-checkpoint``), one text file for
# all partitions of a data directory::
#
#     0                       format version
#     2                       number of entries
#     orders 0 1200           topic partition offset (topic names hold no spaces)
#     orders 1 1187

OFFSETS_VERSION = 0


def write_offsets(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    """Replace the offsets checkpoint at ``path`` atomically and durably."""
    lines = [str(OFFSETS_VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    write_atomic(path, ("\n".join(lines) + "\n").encode())


def read_offsets(path: Path) -> dict[tuple[str, int], int]:
    """The offsets in the checkpoint at ``path``; empty if it does not exist.

    A file that does not parse is renamed to ``<name>.bad`` and ``ValueError`` raised
    naming both, so the caller can report it (and go on without: the data is derived).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        lines = text.splitlines()
        if int(lines[0]) != OFFSETS_VERSION:
            raise ValueError(f"unknown version {lines[0]!r}")
        count = int(lines[1])
        out = {}
        for line in lines[2:]:
            topic, partition, offset = line.split(" ")
            out[(topic, int(partition))] = int(offset)
        if len(out) != count or len(lines) != count + 2:
            raise ValueError(f"{count} entries announced, {len(lines) - 2} present")
        return out
    except (ValueError, IndexError) as exc:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        raise ValueError(f"{path} is corrupt ({exc}); moved to {bad}") from exc
