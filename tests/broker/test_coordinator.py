"""GroupCoordinator over real ``__groups`` partitions: every state it answers from is the
one reading the log gives (checked by loading a second coordinator from the same logs);
deletions ordered with commits; failed appends change nothing; NotCoordinator when the
partition is not led or still loading."""

from __future__ import annotations

import asyncio
import errno
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice import errors
from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.partition import Partition
from sluice.config import TopicConfig
from sluice.protocol.coordinator import GROUPS_TOPIC, group_partition
from sluice.protocol.group_records import Committed
from sluice.storage import syncer as syncer_module
from sluice.storage.log import PartitionLog
from sluice.storage.syncer import Syncer

pytestmark = pytest.mark.timeout(30)


def c(offset: int, client: str = "10.0.0.1:5000") -> Committed:
    return Committed(offset, "", 1_700_000_000_000 + offset, client)


class Groups:
    """``__groups`` partitions on fresh logs in ``tmp_path``, one write thread that a test
    can hold (their fsyncs too run in it), and coordinators over them."""

    def __init__(self, tmp_path, count: int) -> None:
        self.write_ex = ThreadPoolExecutor(1, thread_name_prefix="test-write")
        self.read_ex = ThreadPoolExecutor(2, thread_name_prefix="test-read")
        config = TopicConfig.parse({"cleanup.policy": "compact", "flush.messages": "1"})
        self.parts = [
            Partition(GROUPS_TOPIC, p, PartitionLog.open(tmp_path / f"{GROUPS_TOPIC}-{p}", config.log_config),
                      config, self.write_ex, self.read_ex, syncer=Syncer(1, self.write_ex, native=False))
            for p in range(count)
        ]

    async def coordinator(self) -> GroupCoordinator:
        """A coordinator that loaded every partition (what a restarted broker sees)."""
        coord = GroupCoordinator(self.replica, len(self.parts), self.read_ex)
        for p in range(len(self.parts)):
            await coord.load(p)
        return coord

    def replica(self, p: int) -> Partition:
        return self.parts[p]

    def hold_writes(self) -> threading.Event:
        """Block the write thread until the returned event is set: appends queue up."""
        gate = threading.Event()
        self.write_ex.submit(gate.wait)
        return gate

    async def close(self) -> None:
        for part in self.parts:
            await part.close()
        self.write_ex.shutdown(wait=True)
        self.read_ex.shutdown(wait=True)


@pytest.fixture
async def groups(tmp_path):
    g = Groups(tmp_path, 1)
    yield g
    await g.close()


async def test_commits_are_read_back_from_the_log_with_their_details(groups):
    coord = await groups.coordinator()
    await coord.commit("billing", {("orders", 0): c(5), ("orders", 1): c(7, "10.0.0.2:6000")})
    await coord.commit("billing", {("orders", 0): c(9)})
    await coord.commit("audit", {("orders", 0): c(1)})
    expected = {("orders", 0): c(9), ("orders", 1): c(7, "10.0.0.2:6000")}
    assert coord.existing("billing") == expected
    assert coord.names() == ["audit", "billing"]
    again = await groups.coordinator()
    assert again.existing("billing") == expected and again.names() == ["audit", "billing"]
    assert groups.parts[0].log_end_offset == 4  # one record per committed partition


async def test_groups_are_spread_over_the_partitions_by_their_hash(tmp_path):
    g = Groups(tmp_path, 4)
    try:
        coord = await g.coordinator()
        names = [f"group-{i}" for i in range(12)]
        for name in names:
            await coord.commit(name, {("t", 0): c(1)})
        for p, part in enumerate(g.parts):
            assert part.log_end_offset == sum(1 for n in names if group_partition(n, 4) == p)
        assert (await g.coordinator()).names() == sorted(names)
    finally:
        await g.close()


async def test_delete_writes_tombstones(groups):
    coord = await groups.coordinator()
    await coord.commit("g", {("t", 0): c(1), ("t", 1): c(2)})
    await coord.commit("other", {("t", 0): c(3)})
    await coord.delete("g")
    assert coord.names() == ["other"] and coord.get("g") == {}
    with pytest.raises(errors.UnknownGroup):
        coord.existing("g")
    with pytest.raises(errors.UnknownGroup):
        await coord.delete("g")
    with pytest.raises(errors.InvalidGroup):
        await coord.delete("bad name")
    assert (await groups.coordinator()).names() == ["other"]
    await coord.commit("g", {("t", 5): c(4)})  # starts the group again from nothing
    assert (await groups.coordinator()).existing("g") == {("t", 5): c(4)}


async def test_delete_takes_the_commits_written_before_it_and_not_those_after(groups):
    coord = await groups.coordinator()
    await coord.commit("g", {("t", 0): c(1)})
    gate = groups.hold_writes()
    try:
        before = asyncio.ensure_future(coord.commit("g", {("t", 1): c(2)}))  # in flight
        await asyncio.sleep(0.01)
        deletion = asyncio.ensure_future(coord.delete("g"))
        await asyncio.sleep(0.01)
        after = asyncio.ensure_future(coord.commit("g", {("t", 2): c(3)}))
        await asyncio.sleep(0.01)
        assert coord.existing("g") == {("t", 0): c(1)}, "nothing visible before it is written"
    finally:
        gate.set()
    await asyncio.gather(before, deletion, after)
    assert coord.existing("g") == {("t", 2): c(3)}
    assert (await groups.coordinator()).existing("g") == {("t", 2): c(3)}


async def test_a_failed_append_answers_the_error_and_changes_nothing(groups, monkeypatch):
    coord = await groups.coordinator()
    await coord.commit("g", {("t", 0): c(1)})

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(syncer_module, "_append_blocking", full)  # the partition's Python syncer
    with pytest.raises(errors.DiskFull):
        await coord.commit("g", {("t", 0): c(2), ("t", 1): c(2)})
    with pytest.raises(errors.DiskFull):
        await coord.delete("g")
    assert coord.existing("g") == {("t", 0): c(1)}
    monkeypatch.undo()
    await coord.commit("g", {("t", 1): c(3)})  # the group carries on as before
    assert coord.existing("g") == {("t", 0): c(1), ("t", 1): c(3)}
    assert (await groups.coordinator()).existing("g") == {("t", 0): c(1), ("t", 1): c(3)}


async def test_deleting_a_topic_tombstones_its_offsets_in_every_group(groups):
    coord = await groups.coordinator()
    await coord.commit("a", {("gone", 0): c(1), ("kept", 0): c(2)})
    await coord.commit("b", {("gone", 1): c(3)})
    await coord.forget_topic("gone")
    assert coord.names() == ["a"] and coord.existing("a") == {("kept", 0): c(2)}
    again = await groups.coordinator()
    assert again.names() == ["a"] and again.existing("a") == {("kept", 0): c(2)}


async def test_not_coordinator_when_the_partition_is_not_led(groups):
    coord = await groups.coordinator()
    await coord.commit("g", {("t", 0): c(1)})
    groups.parts[0].make_follower(1)
    for call in (lambda: coord.get("g"), lambda: coord.existing("g")):
        with pytest.raises(errors.NotCoordinator, match="does not lead __groups-0"):
            call()
    with pytest.raises(errors.NotCoordinator):
        await coord.commit("g", {("t", 0): c(2)})
    assert coord.names() == []
    groups.parts[0].make_leader(2)
    coord.unload(0)  # what leadership changes call, with load on the way back
    with pytest.raises(errors.NotCoordinator):
        coord.get("g")
    await coord.load(0)
    assert coord.existing("g") == {("t", 0): c(1)}


async def test_groups_answer_not_coordinator_while_their_partition_loads(groups):
    coord = await groups.coordinator()
    await coord.commit("g", {("t", 0): c(1)})
    coord.unload(0)
    gate = threading.Event()
    groups.read_ex.submit(gate.wait)
    groups.read_ex.submit(gate.wait)  # both read threads busy: the load waits
    loading = asyncio.ensure_future(coord.load(0))
    await asyncio.sleep(0.01)
    try:
        with pytest.raises(errors.NotCoordinator, match="loading"):
            coord.get("g")
        with pytest.raises(errors.NotCoordinator, match="loading"):
            await coord.commit("g", {("t", 0): c(2)})
    finally:
        gate.set()
    await loading
    assert coord.existing("g") == {("t", 0): c(1)}


async def test_an_unload_during_a_load_wins(groups):
    coord = await groups.coordinator()
    await coord.commit("g", {("t", 0): c(1)})
    gate = threading.Event()
    groups.read_ex.submit(gate.wait)
    groups.read_ex.submit(gate.wait)
    loading = asyncio.ensure_future(coord.load(0))
    await asyncio.sleep(0.01)
    coord.unload(0)
    gate.set()
    await loading
    with pytest.raises(errors.NotCoordinator, match="does not lead"):
        coord.get("g")
