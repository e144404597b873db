"""A real broker's side of idempotence, over the wire: producer ids unique across restarts,
PRODUCE v2 answering each batch's offset, duplicates stored once across a SIGKILL."""

from __future__ import annotations

import pytest

from sluice.client import Admin
from sluice.client.cluster import Cluster
from sluice.errors import OutOfOrderSequence, error_for_code
from sluice.protocol import messages as m
from sluice.protocol.records import build_batch, encode_keyless_records

pytestmark = pytest.mark.timeout(90)


def batch(values: list[bytes], pid: int, seq: int, epoch: int = 0) -> bytes:
    return build_batch(encode_keyless_records(values), len(values), 1_000, 1_000, 0, pid, epoch, seq)


async def produce(cluster: Cluster, *batches: bytes) -> m.ProducePartitionResultV2:
    data = b"".join(batches)
    req = m.ProduceRequestV2(
        partitions=[m.ProducePartition(topic="t", partition=0, size=len(data))], acks=m.ACKS_ALL
    )
    resp, _ = await cluster.request(req, [data])
    assert isinstance(resp, m.ProduceResponseV2)
    return resp.partitions[0]


async def init_id(cluster: Cluster) -> int:
    resp, _ = await cluster.request(m.InitProducerIdRequest())
    assert resp.error == 0 and resp.producer_epoch == 0
    return resp.producer_id


async def test_ids_stay_unique_and_duplicates_stay_single_across_a_sigkill(broker):
    admin = Admin(broker.bootstrap)
    await admin.create_topic("t", partitions=1)
    await admin.close()
    cluster = Cluster([broker.bootstrap])
    try:
        ids = {await init_id(cluster) for _ in range(3)}
        assert len(ids) == 3 and all(0 <= i < 2**62 for i in ids)
        pid = min(ids)
        first = await produce(cluster, batch([b"a", b"b"], pid, 0))
        assert (first.error, first.batch_offsets) == (0, [0])
        mixed = await produce(cluster, batch([b"a", b"b"], pid, 0), batch([b"c"], pid, 2))
        assert (mixed.error, mixed.batch_offsets, mixed.base_offset) == (0, [0, 2], 0)
        gap = await produce(cluster, batch([b"x"], pid, 9))
        assert isinstance(error_for_code(gap.error), OutOfOrderSequence)
    finally:
        await cluster.close()

    broker.kill()  # no clean close: the state comes back from the log
    broker.start()
    cluster = Cluster([broker.bootstrap])
    try:
        again = await produce(cluster, batch([b"a", b"b"], pid, 0), batch([b"c"], pid, 2), batch([b"d"], pid, 3))
        assert (again.error, again.batch_offsets) == (0, [0, 2, 3])
        assert not ids & {await init_id(cluster) for _ in range(3)}, "ids are never handed out twice"
        end, _ = await cluster.request(m.ListOffsetsRequest(
            partitions=[m.ListOffsetsPartition(topic="t", partition=0, timestamp=-1)]
        ))
        assert end.partitions[0].offset == 4
    finally:
        await cluster.close()
