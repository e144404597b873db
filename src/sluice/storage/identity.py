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
leaves the ISR and the leadership of every partition the cluster lists it for right after
it registers, before it opens any (broker/replication/states.py ``withdraw_lost_replicas``; a broker
refused its node id has changed nothing), then copies them back as a follower.  The owner
is recorded only after that, so a crash in between is a new directory again.

The directory also records the id of its cluster (``cluster_id``: the metadata store's, see
``MetadataStore.claim_cluster_id``; ``"embedded"`` for a single-node broker).  A broker
checks it against the store at start and before it deletes data the store no longer lists:
an etcd that was wiped or replaced would otherwise list no topic, and every broker would
delete every replica it holds.  A directory recorded before cluster ids existed takes the
store's id at its next start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import ConfigError
from sluice.storage.checkpoint import write_json

META_NAME = "meta.json"


@dataclass(frozen=True)
class Claim:
    """What ``claim`` found: ``new`` (no owner recorded, no partition in ``logs/``) and the
    recorded ``cluster_id`` (None if none is recorded)."""

    new: bool
    cluster_id: str | None


def claim(data_dir: Path, node_id: int) -> Claim:
    """Check that ``data_dir`` may be node ``node_id``'s.  ``ConfigError`` when it belongs
    to another node or its record cannot be read.  Call ``record`` once the broker has
    started."""
    path = data_dir / META_NAME
    try:
        meta = json.loads(path.read_bytes())
        owner, cluster_id = meta["node_id"], meta.get("cluster_id")
        if not isinstance(owner, int) or isinstance(owner, bool):
            raise TypeError(f"node_id is {owner!r}")
        if cluster_id is not None and not isinstance(cluster_id, str):
            raise TypeError(f"cluster_id is {cluster_id!r}")
    except FileNotFoundError:
        owner = cluster_id = None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"cannot tell which node data directory {data_dir} belongs to: {path}: {exc}; "
            f'fix it (it holds {{"node_id": N, "cluster_id": "..."}}) or remove it to let this broker '
            "claim the directory"
        ) from None
    if owner is not None and owner != node_id:
        raise ConfigError(
            f"data directory {data_dir} belongs to node {owner} ({path}), not node {node_id}: "
            f"start it with --node-id {owner}, or give node {node_id} a data directory of its own"
        )
    if owner is not None:
        return Claim(False, cluster_id)
    return Claim(not holds_partitions(data_dir), None)


def holds_partitions(data_dir: Path) -> bool:
    """Whether ``data_dir/logs`` holds a partition (deletions left over do not count)."""
    logs = data_dir / "logs"
    return logs.is_dir() and any(not p.name.startswith(".") for p in logs.iterdir())


def record(data_dir: Path, node_id: int, cluster_id: str) -> None:
    """Record ``node_id`` and ``cluster_id`` as the owner of ``data_dir`` (atomically;
    written only when they change)."""
    path = data_dir / META_NAME
    meta = {"node_id": node_id, "cluster_id": cluster_id}
    try:
        if json.loads(path.read_bytes()) == meta:
            return
    except (OSError, ValueError):
        pass
    write_json(path, meta)
