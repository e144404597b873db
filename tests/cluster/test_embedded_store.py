"""What only the embedded store has: its files, in today's format and the one before."""

from __future__ import annotations

import json

import pytest

from sluice.cluster.embedded import EmbeddedStore
from sluice.cluster.store import PartitionState, TopicRecord, initial_states
from sluice.errors import InvalidRequest, StorageError

# meta/topics.json as brokers wrote it before partition states were kept
FIRST_FORMAT = {
    "topics": {
        "orders": {"partitions": 2, "config": {"retention.ms": "60000"}, "internal": False},
        "__offsets": {"partitions": 1, "config": {}, "internal": True},
    }
}


async def opened(data_dir, node_id: int = 0) -> EmbeddedStore:
    store = EmbeddedStore(data_dir, node_id)
    await store.start()
    return store


async def test_first_format_loads_unchanged(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "topics.json").write_text(json.dumps(FIRST_FORMAT))
    store = await opened(tmp_path, node_id=3)
    topics = await store.topics()
    assert topics == {
        "orders": TopicRecord("orders", 2, {"retention.ms": "60000"}, assignment=[[3], [3]]),
        "__offsets": TopicRecord("__offsets", 1, {}, internal=True, assignment=[[3]]),
    }
    assert await store.partition_states("orders") == [PartitionState(3, 0, [3], 0)] * 2

    # a leader epoch survives a restart, and the file still reads as the first format did
    assert await store.cas_partition_state("orders", 1, 0, PartitionState(3, 1, [3]))
    await store.close()
    raw = json.loads((tmp_path / "meta" / "topics.json").read_text())
    for name, first in FIRST_FORMAT["topics"].items():
        assert {k: raw["topics"][name][k] for k in first} == first
    store = await opened(tmp_path, node_id=3)
    assert [s.leader_epoch for s in await store.partition_states("orders")] == [0, 1]
    await store.close()


async def test_a_single_node_holds_every_replica(tmp_path):
    store = await opened(tmp_path, node_id=1)
    two = TopicRecord("t", 1, replication_factor=2, assignment=[[1, 2]])
    with pytest.raises(InvalidRequest, match="more replicas need more brokers"):
        await store.create_topic(two, initial_states(two))
    one = TopicRecord("t", 1, assignment=[[1]])
    await store.create_topic(one, initial_states(one))
    version = (await store.partition_states("t"))[0].version
    with pytest.raises(InvalidRequest):
        await store.cas_partition_state("t", 0, version, PartitionState(2, 1, [2]))
    await store.close()


async def test_unreadable_metadata_stops_the_start(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "topics.json").write_text('{"topics": {"t": {"partitions": "x"}}}')
    with pytest.raises(StorageError, match="topics.json is unreadable"):
        await opened(tmp_path)
    (tmp_path / "meta" / "topics.json").write_text("{not json")
    with pytest.raises(StorageError, match="restore it from a backup") as ei:
        await opened(tmp_path)
    assert "forgets every topic" in str(ei.value) and "committed offsets" in str(ei.value)
