"""Embedded single-node metadata store: topic definitions in the broker's data directory.

The default when no etcd is configured: ``sluice serve`` just works.  One JSON document,
``<data>/meta/topics.json``, written atomically (tmp + fsync + rename) on every change, so a
crash leaves either the old or the new definition of every topic.

Concurrency: changes come one at a time (the broker's admin lock) and run in a worker
thread; reads of ``topics`` happen on the event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import StorageError
from sluice.storage.checkpoint import write_json


@dataclass
class TopicRecord:
    """What the store keeps of one topic."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)  # only the overrides
    internal: bool = False


class EmbeddedMetadata:
    def __init__(self, data_dir: Path, node_id: int = 0) -> None:
        self.node_id = node_id
        self.path = data_dir / "meta" / "topics.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.topics: dict[str, TopicRecord] = self._load()

    def _load(self) -> dict[str, TopicRecord]:
        """Read the topic definitions; a file that cannot be read stops the broker.

        Unlike other state files it is not set aside: starting without it would make every
        topic vanish while its data stays on disk.  The operator restores it (or moves it
        away to start empty) and starts again.
        """
        try:
            raw = json.loads(self.path.read_bytes())
            return {
                name: TopicRecord(
                    name=name, partitions=int(t["partitions"]),
                    config={str(k): str(v) for k, v in t.get("config", {}).items()},
                    internal=bool(t.get("internal", False)),
                )
                for name, t in raw["topics"].items()
            }
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(
                f"{self.path} is unreadable ({type(exc).__name__}: {exc}); restore it, or move "
                f"it away to start with no topics (their data stays in {self.path.parent.parent / 'logs'})"
            ) from exc

    def _save(self) -> None:
        write_json(
            self.path,
            {
                "topics": {
                    t.name: {"partitions": t.partitions, "config": t.config, "internal": t.internal}
                    for t in self.topics.values()
                }
            },
        )

    def put_topic(self, record: TopicRecord) -> None:
        """Create or replace a topic definition, durably. Raises ``OSError`` as is."""
        previous = self.topics.get(record.name)
        self.topics[record.name] = record
        try:
            self._save()
        except OSError:
            self._restore(record.name, previous)
            raise

    def delete_topic(self, name: str) -> None:
        previous = self.topics.pop(name, None)
        try:
            self._save()
        except OSError:
            self._restore(name, previous)
            raise

    def _restore(self, name: str, previous: TopicRecord | None) -> None:
        if previous is None:
            self.topics.pop(name, None)
        else:
            self.topics[name] = previous
