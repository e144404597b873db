"""Leader-epoch cache: Kafka's OffsetsForLeaderEpoch answers, and the cache rebuilt from
batch headers of crafted logs (several segments, clean and crashed closes)."""

from __future__ import annotations

import dataclasses

import pytest
from storage_helpers import append_batches

from sluice.storage.epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache
from sluice.storage.log import LogConfig, PartitionLog

CONFIG = LogConfig(segment_bytes=400, retention_ms=-1, index_interval_bytes=100)
UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


# --------------------------------------------------------------------------- the cache alone


def test_empty_cache_knows_no_epoch():
    cache = LeaderEpochCache()
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.end_offset_for_epoch(0, 10) == UNDEFINED


@pytest.mark.parametrize(
    ("epoch", "answer"),
    [
        (5, (5, 42)),  # the latest epoch: it ends at the log end
        (3, (3, 20)),  # ends where the next epoch starts
        (1, (1, 10)),
        (4, (3, 20)),  # unknown, between known ones: the largest epoch below, its end
        (2, (1, 10)),
        (0, (0, 3)),  # below every known epoch: the first entry's start is its end
        (6, UNDEFINED),  # above the latest: the leader knows nothing of it
        (UNDEFINED_EPOCH, UNDEFINED),
    ],
)
def test_end_offset_for_epoch_follows_kafka(epoch, answer):
    cache = LeaderEpochCache([(1, 3), (3, 10), (5, 20)])
    assert cache.end_offset_for_epoch(epoch, 42) == answer


def test_assign_ignores_old_epochs_and_refuses_going_back_in_offsets():
    cache = LeaderEpochCache()
    assert cache.assign(0, 0)
    assert not cache.assign(0, 5)  # later batches of the same run
    assert cache.assign(2, 5)
    assert not cache.assign(1, 9)  # an older epoch never starts a run again
    with pytest.raises(ValueError):
        cache.assign(3, 4)
    assert cache.entries() == [(0, 0), (2, 5)]


def test_truncation_from_both_ends():
    cache = LeaderEpochCache([(0, 0), (2, 10), (4, 20)])
    cache.truncate_from_end(20)
    assert cache.entries() == [(0, 0), (2, 10)]
    cache.truncate_from_end(15)  # the cut falls inside epoch 2: it stays
    assert cache.entries() == [(0, 0), (2, 10)]
    cache.truncate_from_start(12)  # epoch 2 is in force at the new log start
    assert cache.entries() == [(2, 12)]
    cache.truncate_from_start(5)  # below the first entry: nothing to do
    assert cache.entries() == [(2, 12)]
    cache.truncate_from_end(12)
    assert cache.entries() == []


# --------------------------------------------------------------------------- crafted logs


def craft(plog: PartitionLog, runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Append ``count`` one-record batches in ``epoch`` for each (epoch, count); return the
    expected cache entries."""
    expected = []
    for epoch, count in runs:
        expected.append((epoch, plog.log_end_offset))
        for i in range(count):
            append_batches(plog, [[b"e%d-%d" % (epoch, i) * 4]], epoch=epoch)
    return expected


@pytest.mark.parametrize("close", ["clean", "crash"])
def test_cache_is_rebuilt_from_batch_headers(tmp_path, close):
    plog = PartitionLog.open(tmp_path, CONFIG)
    # runs that start mid-segment, span segments, and fill whole segments alone
    expected = craft(plog, [(0, 7), (1, 1), (4, 12), (5, 2), (9, 9)])
    assert len(plog.segments) >= 4
    assert plog.epochs.entries() == expected
    if close == "clean":
        plog.close()  # indexes saved: segments below the recovery point are not scanned
    else:
        for seg in plog.segments:
            seg.close()  # no saved indexes, no recovery point: every segment is checked
    reopened = PartitionLog.open(tmp_path, CONFIG)
    try:
        assert reopened.epochs.entries() == expected
        assert reopened.epochs.end_offset_for_epoch(4, reopened.log_end_offset) == (4, 20)
        assert reopened.epochs.end_offset_for_epoch(3, reopened.log_end_offset) == (1, 8)
        assert reopened.epochs.end_offset_for_epoch(9, reopened.log_end_offset) == (9, 31)
    finally:
        reopened.close()


def test_cache_follows_truncation_and_retention(tmp_path):
    plog = PartitionLog.open(tmp_path, CONFIG)
    craft(plog, [(0, 6), (2, 6), (3, 6)])
    plog.truncate_to(14)  # inside epoch 3's run
    assert plog.epochs.entries() == [(0, 0), (2, 6), (3, 12)]
    plog.truncate_to(12)
    assert plog.epochs.entries() == [(0, 0), (2, 6)]
    assert plog.epochs.end_offset_for_epoch(3, plog.log_end_offset) == UNDEFINED
    craft(plog, [(6, 3)])
    plog.config = dataclasses.replace(CONFIG, retention_bytes=0)
    for seg in plog.expired_segments(0):
        seg.delete()
        seg.close()
    start = plog.log_start_offset
    assert start > 0
    assert plog.epochs.entries()[0][1] == start
    assert plog.epochs.entries()[-1] == (6, 12)
    plog.close()
    reopened = PartitionLog.open(tmp_path, CONFIG)
    try:
        assert reopened.epochs.entries() == plog.epochs.entries()
    finally:
        reopened.close()
