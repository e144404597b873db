"""The group APIs of a real in-process ``Broker`` (handlers called directly, no sockets):
``__groups`` created at start, commits readable from it, NotCoordinator when the group's
partition is not led, internal topics closed to clients' writes, old group files migrated
once."""

from __future__ import annotations

import json

import pytest
from batches import request

from sluice import errors
from sluice.broker.broker import Broker
from sluice.broker.peer import LOCAL
from sluice.config import ServerConfig
from sluice.protocol import messages as m
from sluice.protocol.coordinator import GROUPS_TOPIC, group_partition
from sluice.protocol.group_records import Committed, OffsetKey, decode_offset_record
from sluice.protocol.records import BatchSpan, build_batch, decode_records, parse_header

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def open_broker(tmp_path):
    """open_broker(**server_config) -> a started Broker on ``tmp_path / "data"``.  Opening
    another closes the one before (a restart on the same data); the last is closed at the
    end of the test."""
    current: list[Broker] = []

    async def open_(**kw) -> Broker:
        if current:
            await current.pop().close()
        broker = Broker(ServerConfig(data_dir=tmp_path / "data", port=0, **kw))
        await broker.start()
        current.append(broker)
        return broker

    yield open_
    if current:
        await current.pop().close()


async def create(broker: Broker, name: str, partitions: int = 1) -> None:
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name=name, partitions=partitions)]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message


async def commit(broker: Broker, group: str, offsets: dict) -> list[m.PartitionError]:
    req = m.OffsetCommitRequest(
        group=group, offsets=[m.CommitOffset(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()]
    )
    return (await broker.group_service.offset_commit(req, (), LOCAL))[0].partitions


async def fetched(broker: Broker, group: str) -> dict:
    resp, _ = await broker.group_service.offset_fetch(m.OffsetFetchRequest(group=group), (), LOCAL)
    return {(r.topic, r.partition): r.offset for r in resp.offsets}


async def test_groups_topic_is_created_internal_and_compacted(open_broker):
    broker = await open_broker(groups_partitions=3)
    topic = broker.topics[GROUPS_TOPIC]
    assert topic.internal and len(topic.partitions) == 3
    assert topic.config.cleanup_policy == "compact" and topic.config.retention_ms == -1
    meta, _ = await broker.topic_service.metadata_(m.MetadataRequest(topics=None), (), LOCAL)
    assert [(t.name, t.internal) for t in meta.topics] == [(GROUPS_TOPIC, True)]
    again = await open_broker(groups_partitions=5)  # an existing __groups keeps its count
    assert len(again.topics[GROUPS_TOPIC].partitions) == 3


async def test_commits_are_records_of_the_groups_partition(open_broker):
    broker = await open_broker(groups_partitions=4)
    await create(broker, "orders", 2)
    assert [r.error for r in await commit(broker, "billing", {("orders", 0): 5, ("orders", 1): 7})] == [0, 0]
    assert await fetched(broker, "billing") == {("orders", 0): 5, ("orders", 1): 7}
    part = broker.partition(GROUPS_TOPIC, group_partition("billing", 4))
    data = (await part.read(0, 1 << 20, part.high_watermark)).data
    entries = [decode_offset_record(r) for r in decode_records(data, GROUPS_TOPIC, part.index)]
    assert [(e.key, e.value.offset) for e in entries] == [
        (OffsetKey("billing", "orders", 0), 5), (OffsetKey("billing", "orders", 1), 7)
    ]
    assert all(isinstance(e.value, Committed) and e.value.time_ms > 0 for e in entries)


async def test_group_apis_answer_not_coordinator_when_the_partition_is_not_led(open_broker):
    broker = await open_broker(groups_partitions=2)
    await create(broker, "t")
    assert (await commit(broker, "g", {("t", 0): 1}))[0].error == 0
    part = broker.partition(GROUPS_TOPIC, group_partition("g", 2))
    part.make_follower(1)
    with pytest.raises(errors.NotCoordinator):
        await commit(broker, "g", {("t", 0): 2})
    with pytest.raises(errors.NotCoordinator):
        await fetched(broker, "g")
    described, _ = await broker.group_service.describe_groups(m.DescribeGroupsRequest(names=["g"]), (), LOCAL)
    deleted, _ = await broker.group_service.delete_groups(m.DeleteGroupsRequest(names=["g"]), (), LOCAL)
    assert described.groups[0].error == deleted.groups[0].error == errors.NotCoordinator.code
    listed, _ = await broker.group_service.list_groups(m.ListGroupsRequest(), (), LOCAL)
    assert listed.groups == []
    part.make_leader(2)
    assert await fetched(broker, "g") == {("t", 0): 1}  # the cache of its last load


async def test_clients_cannot_write_delete_or_grow_internal_topics(open_broker):
    broker = await open_broker()
    data, _ = request([b"forged"])
    req = m.ProduceRequest(partitions=[m.ProducePartition(topic=GROUPS_TOPIC, partition=0, size=len(data))])
    resp, _ = await broker.produce_service.produce(req, memoryview(data), LOCAL)
    assert resp.partitions[0].error == errors.InvalidRequest.code
    assert resp.partitions[0].message == "topic __groups is internal: written by brokers only"
    # nor with the flag brokers set on the produce requests they send each other
    req = m.ProduceRequest(partitions=req.partitions, internal=True)
    resp, _ = await broker.produce_service.produce(req, memoryview(data), LOCAL)
    assert resp.partitions[0].message == "topic __groups is internal: written by brokers only"
    deleted, _ = await broker.topic_service.delete_topics(m.DeleteTopicsRequest(names=[GROUPS_TOPIC]), (), LOCAL)
    grown, _ = await broker.topic_service.create_partitions(
        m.CreatePartitionsRequest(topics=[m.PartitionsIncrease(name=GROUPS_TOPIC, total=20)]), (), LOCAL
    )
    assert deleted.topics[0].error == grown.topics[0].error == errors.InvalidRequest.code
    created, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[m.NewTopic(name="__mine")]), (), LOCAL)
    assert created.topics[0].error == errors.InvalidTopicName.code
    assert len(broker.topics[GROUPS_TOPIC].partitions) == 8
    # nor change how long it keeps records; other settings may change
    for change in (
        m.TopicConfigChange(name=GROUPS_TOPIC, config={"retention.ms": "1"}),
        m.TopicConfigChange(name=GROUPS_TOPIC, config={"cleanup.policy": "delete"}),
        m.TopicConfigChange(name=GROUPS_TOPIC, delete=["cleanup.policy"]),
    ):
        altered, _ = await broker.topic_service.alter_topic_configs(m.AlterTopicConfigsRequest(topics=[change]), (), LOCAL)
        assert altered.topics[0].error == errors.InvalidRequest.code, altered
    assert broker.topics[GROUPS_TOPIC].config.cleanup_policy == "compact"
    change = m.TopicConfigChange(name=GROUPS_TOPIC, config={"flush.messages": "1"})
    altered, _ = await broker.topic_service.alter_topic_configs(m.AlterTopicConfigsRequest(topics=[change]), (), LOCAL)
    assert altered.topics[0].error == 0, altered


async def test_old_group_files_are_migrated_once(open_broker, tmp_path):
    old = tmp_path / "data" / "groups"
    old.mkdir(parents=True)
    (old / "billing.json").write_text(json.dumps({"offsets": [
        {"topic": "orders", "partition": 0, "offset": 5, "metadata": "m", "time": 1700, "client": "10.0.0.1:1"},
        {"topic": "orders", "partition": 1, "offset": 7},  # the oldest files lack the details
    ]}))
    (old / "broken.json").write_text("{not json")
    broker = await open_broker()
    assert broker.groups.existing("billing") == {
        ("orders", 0): Committed(5, "m", 1700, "10.0.0.1:1"), ("orders", 1): Committed(7, "", -1, ""),
    }
    assert broker.groups.names() == ["billing"]
    moved = tmp_path / "data" / "groups.migrated"
    assert not old.exists() and sorted(p.name for p in moved.iterdir()) == ["billing.json", "broken.json.bad"]
    await create(broker, "orders", 2)
    assert (await commit(broker, "billing", {("orders", 0): 9}))[0].error == 0
    again = await open_broker()  # no second import: the newer commit stays
    assert again.groups.existing("billing")[("orders", 0)].offset == 9
    assert sorted(p.name for p in moved.iterdir()) == ["billing.json", "broken.json.bad"]
    assert not (tmp_path / "data" / "groups").exists()


async def test_an_unreadable_batch_of_groups_is_skipped_at_load_not_fatal(open_broker):
    """A batch of ``__groups`` whose records cannot be decoded (a sound header and CRC over
    garbage) is logged and skipped when the partition loads: the broker starts, and the
    commits before and after it are there."""
    broker = await open_broker(groups_partitions=1)
    await create(broker, "t", 2)
    assert (await commit(broker, "g", {("t", 0): 3}))[0].error == 0
    part = broker.partition(GROUPS_TOPIC, 0)
    garbage = build_batch(b"\xff" * 50, 1, 0, 0)  # past the writer, as validate_batches refuses it
    h = parse_header(garbage, 0)
    span = BatchSpan(0, h.size, h.records_count, h.max_timestamp, h.producer_id, h.producer_epoch,
                     h.base_sequence, h.attributes)  # fmt: skip
    await part.append(bytearray(garbage), [span], False)
    assert (await commit(broker, "g", {("t", 1): 4}))[0].error == 0
    broker = await open_broker(groups_partitions=1)  # a restart loads the partition again
    assert await fetched(broker, "g") == {("t", 0): 3, ("t", 1): 4}
