"""Embedded single-node metadata store: topic definitions in the broker's data directory.

The default when no etcd is configured: ``sluice serve`` just works.  One JSON document,
``<data>/meta/topics.json``, written atomically (tmp + fsync + rename) on every change, so a
crash leaves either the old or the new definition of every topic.

Concurrency: called from the event loop only; writes are small and rare (topic admin), so
they run inline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sluice.storage.checkpoint import read_json, write_json


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
        raw = read_json(self.path, default={"topics": {}})
        self.topics: dict[str, TopicRecord] = {
            name: TopicRecord(name=name, **t) for name, t in raw["topics"].items()
        }

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
