"""A partition's writer when its disk fails or hangs (faults from storage/faults.py):
a leader reports disk trouble (``on_disk_failure``), never cuts a published group in the
epoch it was published in, and answers its producers at once when deposed."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from batches import request

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
    part._on_disk_failure = lambda p, err: reports.append(err)
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
