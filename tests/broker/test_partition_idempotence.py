"""The partition writer's idempotence: duplicates answered with their original offsets and
never written twice, gaps and fenced epochs refused with nothing written, the state kept
across restarts, crashes, truncations and on followers."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from batches import idempotent, request, request_of

from sluice.broker.partition import Partition
from sluice.config import TopicConfig
from sluice.errors import OutOfOrderSequence, ProducerFenced
from sluice.protocol.records import decode_records
from sluice.storage.log import PartitionLog
from sluice.storage.producers import snapshot_offsets

pytestmark = pytest.mark.timeout(60)

PID = 42


def values(part: Partition) -> list[bytes]:
    data = part.log.read(part.log_start_offset, 1 << 24, part.log_end_offset).data
    return [r.value for r in decode_records(data, "t", 0)]


async def test_a_retried_batch_is_answered_with_its_first_offset_and_stored_once(open_partition):
    part = open_partition()
    await part.append(*request([b"other"]))
    first = await part.append(*request_of(idempotent([b"a", b"b"], PID, 0)))
    again = await part.append(*request_of(idempotent([b"a", b"b"], PID, 0)))
    assert first.batch_offsets == again.batch_offsets == (1,)
    assert part.log_end_offset == 3
    assert values(part) == [b"other", b"a", b"b"]


async def test_a_request_mixing_duplicates_and_new_batches_gets_each_batch_offset(open_partition):
    part = open_partition()
    b0, b1, b2 = (idempotent([b"%d" % i], PID, i) for i in range(3))
    await part.append(*request_of(b0, b1))
    r = await part.append(*request_of(b0, b1, b2))
    assert r.batch_offsets == (0, 1, 2) and r.base_offset == 0
    assert values(part) == [b"0", b"1", b"2"]


async def test_two_copies_in_one_write_group_are_stored_once(open_partition):
    part = open_partition()
    futs = [part.append(*request_of(idempotent([b"x"], PID, 0))) for _ in range(2)]
    results = await asyncio.gather(*futs)
    assert [r.batch_offsets for r in results] == [(0,), (0,)]
    assert part.log_end_offset == 1


async def test_a_gap_and_an_old_epoch_write_nothing(open_partition):
    part = open_partition()
    await part.append(*request_of(idempotent([b"a"], PID, 0, epoch=1)))
    with pytest.raises(OutOfOrderSequence):
        await part.append(*request_of(idempotent([b"b"], PID, 1, epoch=1), idempotent([b"c"], PID, 5, epoch=1)))
    with pytest.raises(ProducerFenced):
        await part.append(*request_of(idempotent([b"old"], PID, 1, epoch=0)))
    assert part.log_end_offset == 1
    # the refused request left no trace: the next batch in order is accepted
    ok = await part.append(*request_of(idempotent([b"b"], PID, 1, epoch=1)))
    assert ok.batch_offsets == (1,)


async def test_a_refused_request_in_a_group_does_not_disturb_the_others(open_partition):
    part = open_partition()
    await part.append(*request_of(idempotent([b"a"], PID, 0)))
    futs = [
        part.append(*request_of(idempotent([b"b"], PID, 1))),
        part.append(*request_of(idempotent([b"gap"], PID, 9))),
        part.append(*request_of(idempotent([b"c"], PID, 2))),
        part.append(*request([b"plain"])),
    ]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(results[1], OutOfOrderSequence)
    assert [results[i].batch_offsets for i in (0, 2, 3)] == [(1,), (2,), (3,)]
    assert values(part) == [b"a", b"b", b"c", b"plain"]


async def test_an_acks_all_duplicate_waits_for_the_high_watermark(open_partition, monkeypatch):
    part = open_partition()
    monkeypatch.setattr(part.leadership, "log_end_moved", lambda: None)  # a slow follower
    original = part.append(*request_of(idempotent([b"a"], PID, 0)), acks_all=True)
    await asyncio.sleep(0.05)
    dup = part.append(*request_of(idempotent([b"a"], PID, 0)), acks_all=True)
    await asyncio.sleep(0.05)
    assert not original.done() and not dup.done()
    part.advance_high_watermark(1)
    assert (await dup).batch_offsets == (0,)
    assert (await original).batch_offsets == (0,)


def _open(path, **raw) -> tuple[PartitionLog, TopicConfig]:
    config = TopicConfig.parse(raw)
    return PartitionLog.open(path, config.log_config), config


@pytest.mark.parametrize("clean", [True, False], ids=["closed", "crashed"])
async def test_the_state_survives_a_restart(tmp_path, clean):
    ex = ThreadPoolExecutor(1)
    try:
        plog, config = _open(tmp_path / "p", **{"segment.bytes": "1024"})
        part = Partition("t", 0, plog, config, ex, ex)
        for i in range(40):  # several segments: snapshots at each roll
            await part.append(*request_of(idempotent([b"v%03d" % i + b"." * 40], PID, i)))
        assert len(plog.segments) > 3 and snapshot_offsets(plog.directory)
        if clean:
            await part.close()
        else:  # a crash: no snapshot at the end; the tail is folded in from the log
            await part.writer.stop()  # no close: no snapshot, no index saved
            for seg in plog.segments:
                seg.close()
        plog, config = _open(tmp_path / "p", **{"segment.bytes": "1024"})
        part = Partition("t", 0, plog, config, ex, ex)
        for i in range(35, 40):
            r = await part.append(*request_of(idempotent([b"v%03d" % i + b"." * 40], PID, i)))
            assert r.batch_offsets == (i,)
        assert (await part.append(*request_of(idempotent([b"new"], PID, 40)))).batch_offsets == (40,)
        assert part.log_end_offset == 41
        await part.close()
    finally:
        ex.shutdown()


async def test_truncation_rebuilds_the_state_below_the_cut(open_partition):
    part = open_partition(leader=False)
    leader = open_partition("leader")
    for i in range(4):
        await leader.append(*request_of(idempotent([b"%d" % i], PID, i)))
    data = leader.log.read(0, 1 << 20, 4).data
    await part.append_as_follower(bytearray(data))
    assert part.log.producers.producers[PID].batches[-1].last_seq == 3, "followers keep the state"
    await part.truncate_to(2)
    assert part.log.producers.producers[PID].batches[-1].last_seq == 1
    part.make_leader(part.leader_epoch + 1)  # a new leader dedups from the state it rebuilt
    assert (await part.append(*request_of(idempotent([b"1"], PID, 1)))).batch_offsets == (1,)
    assert (await part.append(*request_of(idempotent([b"2"], PID, 2)))).batch_offsets == (2,)


async def test_retention_deletes_segments_not_the_state(tmp_path):
    ex = ThreadPoolExecutor(1)
    raw = {"segment.bytes": "1024", "retention.bytes": "1024"}
    try:
        plog, config = _open(tmp_path / "p", **raw)
        part = Partition("t", 0, plog, config, ex, ex)
        await part.append(*request_of(idempotent([b"early"], PID, 0)))
        for i in range(40):  # another producer's batches push the first out of the log
            await part.append(*request_of(idempotent([b"x" * 60], PID + 1, i)))
        for seg in part.take_expired(0):
            seg.delete()
            seg.close()
        assert part.log_start_offset > 0, "retention removed the first producer's batch"
        await part.close()
        plog, config = _open(tmp_path / "p", **raw)
        part = Partition("t", 0, plog, config, ex, ex)
        again = await part.append(*request_of(idempotent([b"early"], PID, 0)))
        assert again.batch_offsets == (0,), "the duplicate is known after its segment is gone"
        assert part.log_end_offset == 41
        await part.close()
    finally:
        ex.shutdown()
