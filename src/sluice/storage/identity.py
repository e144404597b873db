"""The data directory's owner: which node's replicas it holds (``<data_dir>/meta.json``).

A data directory holds the replicas of one node, and the cluster's metadata says which
partitions that node holds.  Two mistakes then lose acknowledged messages:

- a directory started under another ``--node-id``: every partition in it looks reassigned
  away from this node, and goes to the trash;
- a new, empty directory started under a node id the cluster lists as a replica (a disk
  replaced, a directory wiped): the broker would lead, or stay in sync, with logs it no
  longer has, and the followers of a leader with an empty log truncate theirs to match.

``claim`` refuses the first (``ConfigError``, nothing touched) and tells the broker about
the second: a directory with neither an owner nor a partition in it is new, and the broker
leaves the ISR and the leadership of every partition the cluster lists it for before it
registers (broker.py ``_withdraw_lost_replicas``), then copies them back as a follower.  The
owner is recorded only after that, so a crash in between is a new directory again.
"""

from __future__ import annotations

import json
from pathlib import Path

from sluice.errors import ConfigError
from sluice.storage.checkpoint import write_json

META_NAME = "meta.json"


def claim(data_dir: Path, node_id: int) -> bool:
    """Check that ``data_dir`` may be node ``node_id``'s; True when it is new (no owner
    recorded and no partition in ``logs/``).  ``ConfigError`` when it belongs to another
    node or its owner cannot be read.  Call ``record`` once the broker has started."""
    path = data_dir / META_NAME
    try:
        owner = json.loads(path.read_bytes())["node_id"]
        if not isinstance(owner, int) or isinstance(owner, bool):
            raise TypeError(f"node_id is {owner!r}")
    except FileNotFoundError:
        owner = None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot tell which node data directory {data_dir} belongs to: {path}: {exc}; "
            f'fix it (it holds {{"node_id": N}}) or remove it to let this broker claim the directory'
        ) from None
    if owner is not None and owner != node_id:
        raise ConfigError(
            f"data directory {data_dir} belongs to node {owner} ({path}), not node {node_id}: "
            f"start it with --node-id {owner}, or give node {node_id} a data directory of its own"
        )
    if owner is not None:
        return False
    logs = data_dir / "logs"
    return not (logs.is_dir() and any(not p.name.startswith(".") for p in logs.iterdir()))


def record(data_dir: Path, node_id: int) -> None:
    """Record ``node_id`` as the owner of ``data_dir`` (atomically; once is enough)."""
    path = data_dir / META_NAME
    if not path.exists():
        write_json(path, {"node_id": node_id})
