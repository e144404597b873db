"""GroupOffsets: commit details kept and reloaded, deletion ordered with commits, failures."""

from __future__ import annotations

import asyncio
import errno
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice import errors
from sluice.broker import groups as groups_module
from sluice.broker.groups import Committed, GroupOffsets

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def executor():
    ex = ThreadPoolExecutor(1)
    yield ex
    ex.shutdown(wait=True)


def c(offset: int, client: str = "10.0.0.1:5000") -> Committed:
    return Committed(offset, "", 1_700_000_000_000 + offset, client)


async def test_commit_keeps_time_and_client_and_reloads(tmp_path, executor):
    g = GroupOffsets(tmp_path, executor)
    await g.commit("billing", {("orders", 0): c(5), ("orders", 1): c(7, "10.0.0.2:6000")})
    assert g.names() == ["billing"]
    again = GroupOffsets(tmp_path, executor)
    assert again.existing("billing") == {("orders", 0): c(5), ("orders", 1): c(7, "10.0.0.2:6000")}


async def test_files_without_commit_details_still_load(tmp_path, executor):
    (tmp_path / "groups").mkdir()
    doc = {"offsets": [{"topic": "t", "partition": 0, "offset": 3, "metadata": "m"}]}
    (tmp_path / "groups" / "old.json").write_text(json.dumps(doc))
    g = GroupOffsets(tmp_path, executor)
    assert g.existing("old") == {("t", 0): Committed(3, "m", -1, "")}


async def test_delete_removes_the_group_durably(tmp_path, executor):
    g = GroupOffsets(tmp_path, executor)
    await g.commit("g", {("t", 0): c(1)})
    await g.delete("g")
    assert g.names() == [] and g.get("g") == {}
    assert not (tmp_path / "groups" / "g.json").exists()
    with pytest.raises(errors.UnknownGroup):
        g.existing("g")
    with pytest.raises(errors.UnknownGroup):
        await g.delete("g")
    with pytest.raises(errors.InvalidGroup):
        await g.delete("bad name")
    assert GroupOffsets(tmp_path, executor).names() == []


async def test_delete_is_ordered_with_commits(tmp_path):
    """Commits staged before a deletion go with the group; commits after it start it again."""
    gate = threading.Event()
    ex = ThreadPoolExecutor(1)
    try:
        g = GroupOffsets(tmp_path, ex)
        await g.commit("g", {("t", 0): c(1)})
        ex.submit(gate.wait)  # hold the writer thread: what follows queues up
        first = asyncio.ensure_future(g.commit("g", {("t", 0): c(2)}))  # write started, blocked
        await asyncio.sleep(0)
        before = asyncio.ensure_future(g.commit("g", {("t", 1): c(3)}))  # staged
        await asyncio.sleep(0)
        deletion = asyncio.ensure_future(g.delete("g"))
        await asyncio.sleep(0)
        after = asyncio.ensure_future(g.commit("g", {("t", 2): c(4)}))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, before, deletion, after)
        assert g.existing("g") == {("t", 2): c(4)}
        assert GroupOffsets(tmp_path, ex).existing("g") == {("t", 2): c(4)}
    finally:
        gate.set()
        ex.shutdown(wait=True)


async def test_failed_delete_keeps_the_group_and_staged_commits(tmp_path, executor, monkeypatch):
    g = GroupOffsets(tmp_path, executor)
    await g.commit("g", {("t", 0): c(1)})

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(groups_module, "_remove", full)
    with pytest.raises(errors.DiskFull, match="deletion of group g"):
        await g.delete("g")
    assert g.existing("g") == {("t", 0): c(1)}
    assert (tmp_path / "groups" / "g.json").exists()
    monkeypatch.undo()
    await g.commit("g", {("t", 1): c(2)})  # the group carries on as before
    assert g.existing("g") == {("t", 0): c(1), ("t", 1): c(2)}
