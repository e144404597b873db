"""A new leader answers a repeated commit "already committed" only once the commit's copy
is below its high watermark: a copy it holds above it (copied from the old leader, not yet
on every in-sync replica) could still be cut by another failover."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from batches import request_of

from sluice.broker.transactions.partition import PartitionTransactions
from sluice.errors import RequestTimedOut
from sluice.protocol import transactions as tx

pytestmark = pytest.mark.timeout(60)


async def test_already_committed_waits_for_the_high_watermark(open_partition):
    old = open_partition("old")
    half = (await old.append(*request_of(tx.half_batch("g", None, b"v", (), 1_000, (77, 0, 0))))).base_offset
    ex = ThreadPoolExecutor(1)
    try:
        assert (await PartitionTransactions(old, ex).end(half, True, 5))[2] is False  # committed
        new = open_partition("new", leader=False)
        data = old.log.read(0, 1 << 20, old.log_end_offset).data
        await new.append_as_follower(bytearray(data))  # copied; its high watermark stays 0
        assert new.log_end_offset == old.log_end_offset == 2 and new.high_watermark == 0
        new.make_leader(1, [0, 7], [0, 7])  # 7 in sync but not heard from: the copy is above the HW
        st = PartitionTransactions(new, ex)
        with pytest.raises(RequestTimedOut):
            await st.end(half, True, 0.5)  # the producer's retry of its commit
        new.follower_fetched(7, 2)  # 7 has the commit too
        state, at, already = await st.end(half, True, 5)
        assert (state, at, already) == ("committed", 1, True) and new.high_watermark == 2
    finally:
        ex.shutdown()
