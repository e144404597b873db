"""The broker's own writes (broker/internal_writes.py): a partition led here is written
in-process through the partition's append, acknowledged by its in-sync replicas; one led
elsewhere goes to its leader through the client to the other brokers, never to this
broker (with none known, it is refused, nothing written)."""

from __future__ import annotations

import pytest
from batches import request
from in_memory import local_writes, topic_of

from sluice.errors import NotLeader
from sluice.protocol.records import decode_records

pytestmark = pytest.mark.timeout(30)


async def test_a_partition_led_here_is_written_in_process(open_partition):
    part = open_partition()
    await part.append(*request([b"before"]))
    writes = local_writes({"t": topic_of("t", part)})
    data, _ = request([b"own-1", b"own-2"])
    assert await writes.write("t", 0, data) == 1
    assert part.high_watermark == part.log_end_offset == 3
    got = decode_records(part.log.read(1, 1 << 20, 3).data, "t", 0, 1)
    assert [r.value for r in got] == [b"own-1", b"own-2"]
    await writes.close()


async def test_a_partition_led_elsewhere_is_never_written_here(open_partition):
    follower = open_partition(leader=False)
    writes = local_writes({"t": topic_of("t", follower)})
    data, _ = request([b"own"])
    with pytest.raises(NotLeader, match="no other live broker"):
        await writes.write("t", 0, data)
    assert follower.log_end_offset == 0
    await writes.close()
