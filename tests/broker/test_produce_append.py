"""The produce service's in-process append (``ProduceService.append``) and the explicit peer
of a request, on a whole single-node broker in this process."""

from __future__ import annotations

import pytest
from batches import request

from sluice import errors
from sluice.broker.broker import Broker
from sluice.broker.peer import LOCAL, LocalPeer
from sluice.cluster.store import PartitionState
from sluice.protocol import messages as m
from sluice.protocol.records import decode_records


async def create(broker: Broker, name: str, **config: str) -> None:
    new = m.NewTopic(name=name, partitions=1, config=config)
    resp, _ = await broker.topic_service.create_topics(m.CreateTopicsRequest(topics=[new]), (), LOCAL)
    assert resp.topics[0].error == 0, resp.topics[0].message


async def test_append_writes_batches_a_fetch_then_reads(broker: Broker):
    await create(broker, "t")
    first, _ = request([b"a", b"b"])
    second, _ = request([b"c"])
    assert (await broker.produce_service.append("t", 0, first)).base_offset == 0
    assert (await broker.produce_service.append("t", 0, second, acks_all=False)).base_offset == 2
    req = m.FetchRequest(partitions=[m.FetchPartition(topic="t", partition=0, offset=0, max_bytes=1 << 20)])
    resp, blobs = await broker.fetch_service.fetch(req, (), LOCAL)
    assert resp.partitions[0].error == 0 and resp.partitions[0].high_watermark == 3
    values = [r.value for blob in blobs for r in decode_records(bytes(blob), "t", 0)]
    assert values == [b"a", b"b", b"c"]


async def test_append_refuses_at_once_what_a_produce_refuses(broker: Broker):
    await create(broker, "small", **{"max.message.bytes": "100"})
    with pytest.raises(errors.UnknownTopic):
        broker.produce_service.append("nope", 0, request([b"x"])[0])
    with pytest.raises(errors.UnknownPartition):
        broker.produce_service.append("small", 1, request([b"x"])[0])
    with pytest.raises(errors.MessageTooLarge):
        broker.produce_service.append("small", 0, request([b"x" * 200])[0])
    broken = request([b"x"])[0]
    broken[-1] ^= 0xFF  # the CRC no longer matches
    with pytest.raises(errors.InvalidRecord):
        broker.produce_service.append("small", 0, broken)
    topic = broker.topics["small"]
    part = topic.partitions[0]
    broker.replication.become(topic, 0, PartitionState(-1, part.leader_epoch + 1, [broker.config.node_id]))
    with pytest.raises(errors.NotLeader):  # led here no more
        broker.produce_service.append("small", 0, request([b"x"])[0])
    assert part.log_end_offset == 0  # nothing was queued


class _Front(LocalPeer):
    """The peer a second front door would pass: it knows its client's address."""

    address = "192.0.2.7:4711"


async def test_a_commit_records_the_address_of_its_peer(broker: Broker):
    await create(broker, "t")
    req = m.OffsetCommitRequest(group="g", offsets=[m.CommitOffset(topic="t", partition=0, offset=5)])
    resp, _ = await broker.group_service.offset_commit(req, (), _Front())
    assert resp.partitions[0].error == 0, resp.partitions[0].message
    described, _ = await broker.group_service.describe_groups(m.DescribeGroupsRequest(names=["g"]), (), LOCAL)
    [p] = described.groups[0].partitions
    assert (p.committed_offset, p.committed_by) == (5, "192.0.2.7:4711")
