"""DiskHealth (broker/disk_health.py) driven directly: a disk job that does not return is
a stall, reported once and only while leading; a full disk is no failure; the fence after
a failed fsync refuses the leader's writes in its epoch until the tail is cut."""

from __future__ import annotations

import asyncio
import errno

import pytest
from batches import request

from sluice.broker.disk_health import DISK_STALL_S, DiskHealth
from sluice.errors import DiskFull, LeadershipLost, StorageError

pytestmark = pytest.mark.timeout(60)


async def until(condition, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class _Request:
    def __init__(self) -> None:
        self.future = asyncio.get_running_loop().create_future()


@pytest.mark.parametrize("leader", [True, False])
async def test_a_disk_job_that_does_not_return_is_a_stall(open_partition, leader):
    part = open_partition(leader=leader)
    reports: list[StorageError] = []
    health = DiskHealth(part.leadership, "t-0", reports.append)
    job = asyncio.get_running_loop().create_future()  # a write the disk never returns
    watched = asyncio.ensure_future(health.watch(job, 0))
    await asyncio.sleep(DISK_STALL_S / 2)
    assert not health.stalled and reports == []
    await until(lambda: health.stalled, 10.0)
    await asyncio.sleep(DISK_STALL_S)  # reported once, not once per check
    assert len(reports) == (1 if leader else 0), "only a leader hands its partition over"
    assert all("stalls" in str(r) for r in reports)
    job.set_result("written")
    assert await watched == "written"
    assert not health.stalled


async def test_a_refused_write_fails_its_requests_and_a_full_disk_is_no_failure(open_partition):
    part = open_partition()
    reports: list[StorageError] = []
    health = DiskHealth(part.leadership, "t-0", reports.append)
    full, failed = [_Request(), _Request()], [_Request()]
    health.refused(full, OSError(errno.ENOSPC, "No space left on device"), leader=True)
    for req in full:
        assert isinstance(req.future.exception(), DiskFull)
    assert reports == [], "a full disk waits for space: no hand-over"
    health.refused(failed, OSError(errno.EIO, "Input/output error"), leader=False)
    assert isinstance(failed[0].future.exception(), StorageError)
    assert reports == [], "a follower's failure is reported by its fetcher, not here"
    health.refused([_Request()], OSError(errno.EIO, "Input/output error"), leader=True)
    assert len(reports) == 1 and not isinstance(reports[0], DiskFull)


async def test_the_fence_after_a_failed_fsync(open_partition):
    part = open_partition()
    for i in range(3):
        await part.append(*request([b"r%d" % i]))
    lead = part.leadership
    reports: list[StorageError] = []
    health = DiskHealth(lead, "t-0", reports.append)
    assert not health.fenced and health.unsynced_from is None
    lead.synced_end = 2  # offset 2 was published to followers but its fsync failed
    group = [_Request()]
    health.fence(lead.leader_epoch, group, 2, OSError(errno.EIO, "Input/output error"))
    assert isinstance(group[0].future.exception(), LeadershipLost)
    assert len(reports) == 1
    assert health.fenced and health.refuses_leader_writes() and health.unsynced_from == 2
    lead.make_follower(lead.leader_epoch + 1)
    assert not health.fenced and not health.refuses_leader_writes()
    assert health.unsynced_from == 2, "kept as a follower: its fetcher cuts there first"
    health.truncated(3)  # a cut above the unsynced tail leaves it
    assert health.unsynced_from == 2
    health.truncated(2)
    assert health.unsynced_from is None and health.fenced_epoch is None
