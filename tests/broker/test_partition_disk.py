"""A partition's writer when its disk fails or hangs (faults from storage/faults.py):
a leader reports disk trouble (``on_disk_failure``), never cuts a published group in the
epoch it was published in, and answers its producers at once when deposed."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from batches import request

from sluice.broker.replication.follower import cut_point
from sluice.errors import LeadershipLost, NotLeader, StorageError
from sluice.storage import faults

pytestmark = pytest.mark.timeout(30)  # a write that hangs on the event loop would hang the test


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """inject(**rules): the fault rules of the disk under ``tmp_path`` (no rules: none)."""
    monkeypatch.setenv(faults.ENV, faults.ARMED)
    injector = faults.arm_from_env(tmp_path)

    def inject(**rules) -> None:
        (tmp_path / faults.CONTROL_FILE).write_text(json.dumps(rules))
        time.sleep(faults.POLL_S * 2)  # past the injector's re-read interval

    yield inject
    assert faults.injector is injector
    faults.injector = None


def troubled(part) -> list[StorageError]:
    """The disk trouble ``part`` reports from now on."""
    reports: list[StorageError] = []
    part.disk.on_failure = reports.append
    return reports


async def test_a_published_group_whose_fsync_fails_is_not_cut_in_its_epoch(open_partition, disk):
    part = open_partition(**{"flush.messages": "1"})
    reports = troubled(part)
    part.make_leader(0, [0, 1], [0, 1])  # a follower in the ISR: groups are published before their fsync
    assert (await part.append(*request([b"a"]))).base_offset == 0
    disk(fsync="EIO")
    with pytest.raises(LeadershipLost) as info:  # followers may have it: maybe stored
        await part.append(*request([b"b"]))
    assert info.value.appended_nothing is False
    assert part.fenced and len(reports) == 1
    assert part.log_end_offset == 2  # kept: a cut would let offset 1 be written again in epoch 0
    with pytest.raises(NotLeader):
        await part.append(*request([b"c"]))
    disk()
    part.make_leader(1, [0, 1], [0])  # the hand-over's new epoch, with no other in-sync replica
    assert not part.fenced
    assert (await part.append(*request([b"d"]))).base_offset == 1  # "b" was cut, in epoch 1
    assert part.log.epochs.entries() == [(0, 0), (1, 1)]


async def test_a_deposed_leader_answers_its_hung_writes_at_once(open_partition, disk):
    part = open_partition()
    reports = troubled(part)
    disk(write="hang")
    hung = part.append(*request([b"a"]))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not part.stalled:
        assert loop.time() < deadline, "the hung write was not found stalled"
        await asyncio.sleep(0.01)
    assert "stalls" in str(reports[0])
    queued = part.append(*request([b"b"]))
    part.make_follower(1)
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(hung, 1)
    with pytest.raises(NotLeader):
        await asyncio.wait_for(queued, 1)
    disk()  # the write lands in the end (a follower truncates it away)
    deadline = loop.time() + 5
    while part.log_end_offset != 1:
        assert loop.time() < deadline
        await asyncio.sleep(0.01)
    assert not part.stalled


async def test_a_fenced_leaders_cut_does_not_count_a_follower_that_copied_the_cut_tail(open_partition, disk):
    """A follower copied a group whose fsync then failed on the leader; the leader leads on
    in a new epoch (no other heir), the follower's first fetch there is at the end of that
    tail (its epoch ends there: the stamp of the new epoch), and only then does the leader
    cut the tail at its first write.  The follower's offset from before the cut must not
    count: it holds other records at the offsets the new write takes."""
    part = open_partition(**{"flush.messages": "1"})
    troubled(part)
    part.make_leader(0, [0, 1], [0, 1])
    first = part.append(*request([b"a"]), acks_all=True)
    await asyncio.sleep(0.1)
    part.follower_fetched(1, 1)
    assert (await first).base_offset == 0 and part.high_watermark == 1
    disk(fsync="EIO")
    with pytest.raises(LeadershipLost):
        await part.append(*request([b"b", b"c"]))  # published at 1..2, then its fsync failed
    disk()
    part.follower_fetched(1, 3)  # the follower had copied "b" and "c"
    assert part.high_watermark == 1
    part.make_leader(1, [0, 1], [0, 1])  # the fenced leader's own new epoch, the ISR kept
    assert part.end_offset_for_epoch(0) == (0, 3)  # so its fetch at 3 (epoch 0) is no divergence
    part.follower_fetched(1, 3)
    write = part.append(*request([b"d"]), acks_all=True)  # cuts "b", "c"; "d" goes to 1
    done, _ = await asyncio.wait([write], timeout=1)
    assert part.log_end_offset == 2 and part.log.epochs.entries() == [(0, 0), (1, 1)]
    assert not done, "acknowledged by a follower holding other records at its offset"
    assert part.high_watermark == 1
    assert part.end_offset_for_epoch(0) == (0, 1)  # the follower's next fetch at 3 diverges
    part.follower_fetched(1, 2)  # it cut to 1 and copied "d"
    assert (await asyncio.wait_for(write, 1)).base_offset == 1


async def test_a_fenced_leader_turned_follower_cuts_the_tail_it_could_not_fsync(open_partition, disk):
    """The heir copied the group whose fsync failed here, so the leader's epochs give no
    reason to cut it; its bytes may still be gone from this disk: the follower's cut point
    stops below them, and they are fetched again."""
    part = open_partition(**{"flush.messages": "1"})
    troubled(part)
    part.make_leader(0, [0, 1], [0, 1])
    await part.append(*request([b"a"]))
    disk(fsync="EIO")
    with pytest.raises(LeadershipLost):
        await part.append(*request([b"b"]))
    disk()
    part.make_follower(1)  # the heir leads in epoch 1, holding "b" at offset 1 in epoch 0
    assert part.unsynced_from == 1
    assert cut_point(part, 0, 2) == 1  # epochs alone would keep offset 1
    await part.truncate_to(cut_point(part, 0, 2))
    assert part.log_end_offset == 1 and part.unsynced_from is None


async def test_a_copy_that_lands_after_the_partition_took_the_lead_stays_below_its_epoch(open_partition, disk):
    """A follower is made leader (epoch 1) while a copy it fetched in epoch 0 is still in
    the disk's hands.  When the copy lands, the new epoch starts after it: the log's epochs
    say epoch 0 ends where the copy ends.  (Stamped at the log end of the moment, epoch 1
    would start below a batch of epoch 0: a follower holding the same copy would be told
    its epoch 0 ends before it, cut it, fetch the same batch again, and never catch up.)"""
    leader = open_partition("leader")
    follower = open_partition("follower", leader=False)
    await leader.append(*request([b"a"]))
    await leader.append(*request([b"b"]))
    first = await leader.read(0, 1 << 20, 1)
    await follower.append_as_follower(first.data, fetched_in=0)
    assert follower.log_end_offset == 1
    second = await leader.read(1, 1 << 20, 2)
    disk(write="hang", only="follower")
    late = follower.append_as_follower(second.data, fetched_in=0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not follower.stalled:  # the copy is in the disk's hands
        assert loop.time() < deadline, "the hung replica write was not found stalled"
        await asyncio.sleep(0.01)
    follower.make_leader(1)  # the old leader's disk failed: this replica takes over
    disk()
    await asyncio.wait_for(late, 5)
    assert follower.log_end_offset == 2
    assert follower.log.epochs.entries() == [(0, 0), (1, 2)]
    assert follower.log.epochs.end_offset_for_epoch(0, 2) == (0, 2)
    assert (await follower.append(*request([b"c"]))).base_offset == 2
    assert follower.log.epochs.entries() == [(0, 0), (1, 2)]
