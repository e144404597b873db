"""Leadership (broker/leadership.py) as a state machine, driven directly: followers'
fetches, ISR changes and role changes in, high watermark, lag verdicts and failed waits
out.  The partition around it only writes the log the high watermark is taken from."""

from __future__ import annotations

import asyncio
import time

import pytest
from batches import request

from sluice.errors import LeadershipLost, NotEnoughReplicasAfterAppend

pytestmark = pytest.mark.timeout(60)


async def leading(open_partition, records: int, replicas=(0, 1, 2), **config: str):
    """A partition led here in epoch 1 with ``replicas`` all in sync, holding ``records``
    records (acks=leader: appended, not acknowledged by the followers); its Leadership."""
    part = open_partition(**config)
    lead = part.leadership
    lead.make_leader(1, list(replicas), list(replicas))
    for i in range(records):
        await part.append(*request([b"r%d" % i]))
    assert part.log_end_offset == records
    return part, lead


async def test_the_high_watermark_is_the_lowest_log_end_in_the_isr(open_partition):
    part, lead = await leading(open_partition, 4)
    assert part.high_watermark == 0, "a follower not heard from in this epoch holds it"
    lead.follower_fetched(1, 4)
    assert part.high_watermark == 0
    lead.follower_fetched(2, 2)
    assert part.high_watermark == 2
    lead.follower_fetched(2, 3)
    assert part.high_watermark == 3
    lead.set_isr([0, 1])  # replica 2 left the ISR: it holds nothing back any more
    assert part.high_watermark == 4
    lead.follower_fetched(2, 1)  # an out-of-sync follower's fetch never moves it down
    assert part.high_watermark == 4


async def test_a_pending_expansion_holds_the_high_watermark_until_settled(open_partition):
    part, lead = await leading(open_partition, 3)
    lead.set_isr([0, 1])
    lead.follower_fetched(1, 3)
    assert part.high_watermark == 3
    await part.append(*request([b"more"]))
    lead.expanding([2])  # replica 2 joins as far as the store may already say
    assert lead.maximal_isr == (0, 1, 2)
    lead.follower_fetched(1, 4)
    assert part.high_watermark == 3, "the joiner has not fetched offset 3 yet"
    lead.follower_fetched(2, 4)
    assert part.high_watermark == 4
    lead.set_isr([0, 1])  # the store's state settles the expansion: it did not take effect
    assert lead.joining == () and lead.maximal_isr == (0, 1)


async def test_lagging_and_caught_up_followers(open_partition):
    part, lead = await leading(open_partition, 2)
    time.sleep(0.05)  # the election (make_leader) was 50 ms ago
    lead.follower_fetched(1, 2)  # has the whole log: caught up now
    lead.follower_fetched(2, 0)  # behind since the election
    assert lead.lagging(0.03) == [2]
    assert lead.lagging(10.0) == []
    lead.set_isr([0, 1])
    assert lead.caught_up(10.0) == [], "no fetch since it left the ISR"
    lead.follower_fetched(2, 1)
    assert lead.caught_up(10.0) == [], "below the high watermark"
    lead.follower_fetched(1, 2)
    lead.follower_fetched(2, 2)
    assert part.high_watermark == 2 and lead.caught_up(10.0) == [2]


async def test_an_isr_below_min_insync_replicas_is_short(open_partition):
    part, lead = await leading(open_partition, 1, replicas=(0, 1), **{"min.insync.replicas": "2"})
    assert lead.isr_short() is None
    lead.set_isr([0])
    assert isinstance(lead.isr_short(), NotEnoughReplicasAfterAppend)
    lead.expanding([1])  # counted as in sync while the expansion is written
    assert lead.isr_short() is None


async def test_make_follower_fails_waits_and_wakes_every_waiter(open_partition):
    part, lead = await leading(open_partition, 1)
    waiting = part.append(*request([b"w"]), acks_all=True)
    woken: list[str] = []
    part.add_waiter(lambda: woken.append("fetch"))
    part.add_replica_waiter(lambda: woken.append("replica"))
    while lead.acks.requests == 0 or part.log_end_offset < 2:  # appended, waiting for followers
        await asyncio.sleep(0.002)
    assert not waiting.done()
    lead.make_follower(2)
    assert not lead.is_leader and lead.leader_epoch == 2 and lead.followers == {}
    with pytest.raises(LeadershipLost):
        await waiting
    assert sorted(woken) == ["fetch", "replica"]
    with pytest.raises(ValueError):
        lead.make_leader(1)
