"""The partition writer keeps the offsets of its open half messages (storage/producers.py),
on leaders and followers, across restarts and crashes: a new leader reads its log for
transaction state from the oldest open half on, never from the log start."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from batches import request, request_of

from sluice.broker.partition import Partition
from sluice.broker.transactions.partition import PartitionTransactions
from sluice.config import TopicConfig
from sluice.protocol import transactions as tx
from sluice.protocol.records import iter_batches, validate_batches
from sluice.storage.log import PartitionLog

pytestmark = pytest.mark.timeout(60)


def half(value: bytes, seq: int) -> bytes:
    return tx.half_batch("g", None, value, (), 1_000, (77, 0, seq))


async def end(part: Partition, offset: int, commit: bool) -> None:
    data = part.log.read(offset, 1, part.log_end_offset).data
    h, pos = next(iter_batches(data))
    half_id = tx.format_id("t", 0, offset)
    if commit:
        batch = bytearray(tx.commit_copy(data[pos : pos + h.size], half_id))
    else:
        batch = bytearray(tx.rollback_batch(half_id, offset, "test", 2_000))
    await part.append(batch, validate_batches(batch, 1 << 30, broker=True))


async def test_open_halves_follow_the_log_on_leader_follower_and_restart(tmp_path, open_partition):
    leader = open_partition("leader", **{"segment.bytes": "1024"})
    await leader.append(*request([b"plain"]))
    offsets = []
    for i in range(4):
        offsets.append((await leader.append(*request_of(half(b"h%d" % i + b"." * 300, i)))).base_offset)
    await end(leader, offsets[0], commit=True)
    await end(leader, offsets[2], commit=False)
    assert leader.log.producers.open_halves == {offsets[1], offsets[3]}

    follower = open_partition("follower", leader=False)
    while follower.log_end_offset < leader.log_end_offset:  # a read stops at a segment's end
        data = leader.log.read(follower.log_end_offset, 1 << 20, leader.log_end_offset).data
        await follower.append_as_follower(bytearray(data))
    assert follower.log.producers.open_halves == {offsets[1], offsets[3]}
    await follower.truncate_to(offsets[3])  # a cut tail takes a half and both ends along
    assert follower.log.producers.open_halves == set(offsets[:3])

    ex = ThreadPoolExecutor(1)
    try:
        for crash in (False, True):
            directory = leader.log.directory
            if crash:
                await leader.writer.stop()  # no close: no snapshot, no index saved
                for seg in leader.log.segments:
                    seg.close()
            else:
                await leader.close()
            config = TopicConfig.parse({"segment.bytes": "1024"})
            leader = Partition("t", 0, PartitionLog.open(directory, config.log_config), config, ex, ex)
            assert leader.log.producers.open_halves == {offsets[1], offsets[3]}
        # a new leader's transaction state reads the log from the oldest open half on
        assert PartitionTransactions(leader, ex).scanned_to == offsets[1]
        await leader.close()
    finally:
        ex.shutdown()
