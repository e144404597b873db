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
