"""The idempotent producers' state: the check table, wrap-around at 2**31, snapshots."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import OutOfOrderSequence, ProducerFenced
from sluice.storage.producers import (
    SEQ_MOD,
    WINDOW,
    Duplicate,
    ProducerTable,
    load_snapshot,
    seq_add,
    snapshot_offsets,
    write_snapshot,
)

MAX_SEQ = SEQ_MOD - 1


def stored(table: ProducerTable, pid: int, epoch: int, seq: int, offset: int, count: int = 1) -> None:
    table.observe(pid, epoch, seq, offset, offset + count, count, 1000)


def check(table: ProducerTable, pid: int, epoch: int, seq: int, count: int = 1):
    return table.begin().check(pid, epoch, seq, count)


def test_new_producer_and_new_epoch_accept_any_sequence():
    t = ProducerTable()
    assert check(t, 7, 0, 123) is None
    stored(t, 7, 0, 0, 0, 3)
    assert check(t, 7, 1, 55) is None, "a new epoch starts where the producer says"


def test_next_sequence_is_new_and_a_gap_is_out_of_order():
    t = ProducerTable()
    stored(t, 1, 0, 0, 0, 3)  # sequences 0..2
    assert check(t, 1, 0, 3) is None
    with pytest.raises(OutOfOrderSequence, match="expected 3"):
        check(t, 1, 0, 4)


def test_duplicates_in_the_window_give_their_original_offsets():
    t = ProducerTable()
    for i in range(WINDOW):
        stored(t, 1, 0, 2 * i, 100 + 10 * i, 2)
    for i in range(WINDOW):
        assert check(t, 1, 0, 2 * i, 2) == Duplicate(100 + 10 * i, 142)
    with pytest.raises(OutOfOrderSequence):
        check(t, 1, 0, 2, 3), "a partial overlap is no duplicate"


def test_a_batch_older_than_the_window_is_a_duplicate_without_an_offset():
    t = ProducerTable()
    for i in range(WINDOW + 3):
        stored(t, 1, 0, i, i)
    assert check(t, 1, 0, 0) == Duplicate(-1, WINDOW + 3)
    assert check(t, 1, 0, 3) == Duplicate(3, WINDOW + 3)


def test_an_older_epoch_is_fenced():
    t = ProducerTable()
    stored(t, 1, 3, 0, 0)
    with pytest.raises(ProducerFenced, match="epoch 2 is fenced"):
        check(t, 1, 2, 1)


def test_sequences_wrap_at_two_to_the_31():
    t = ProducerTable()
    stored(t, 1, 0, MAX_SEQ - 2, 0, 2)  # MAX-2, MAX-1
    assert check(t, 1, 0, MAX_SEQ, 3) is None, "MAX, 0, 1 follows"
    stored(t, 1, 0, MAX_SEQ, 2, 3)
    assert t.producers[1].batches[-1].last_seq == 1
    assert check(t, 1, 0, 2) is None
    assert check(t, 1, 0, MAX_SEQ, 3) == Duplicate(2, 5), "the batch across the boundary"
    assert check(t, 1, 0, MAX_SEQ - 2, 2) == Duplicate(0, 5)
    with pytest.raises(OutOfOrderSequence):
        check(t, 1, 0, 3)
    with pytest.raises(OutOfOrderSequence):
        check(t, 1, 0, 0), "0 lies inside the batch across the boundary: a partial overlap"


@given(st.integers(0, MAX_SEQ), st.lists(st.integers(1, 50), min_size=1, max_size=12))
def test_in_order_batches_are_new_and_their_retries_duplicates(start, counts):
    t = ProducerTable()
    seq, offset, sent = start, 0, []
    for n in counts:
        assert check(t, 9, 0, seq, n) is None
        stored(t, 9, 0, seq, offset, n)
        sent.append((seq, n, offset))
        seq, offset = seq_add(seq, n), offset + n
    for s, n, off in sent[-WINDOW:]:
        assert check(t, 9, 0, s, n).base_offset == off
    for s, n, _ in sent[:-WINDOW]:
        assert check(t, 9, 0, s, n).base_offset == -1
    assert check(t, 9, 0, seq, 1) is None


def test_staging_applies_only_on_commit():
    t = ProducerTable()
    stored(t, 1, 0, 0, 0)
    st_ = t.begin()
    assert st_.check(1, 0, 1, 1) is None
    st_.record(1, 0, 1, 1, 2, 1, 1000)
    assert st_.check(1, 0, 1, 1) == Duplicate(1, 2), "a second copy in the same group"
    assert check(t, 1, 0, 1) is None, "the table is untouched before commit"
    st_.commit(2)
    assert check(t, 1, 0, 1) == Duplicate(1, 2)
    assert t.offset == 2


def test_expiry_forgets_idle_producers():
    t = ProducerTable()
    t.observe(1, 0, 0, 0, 1, 1, 1_000)
    t.observe(2, 0, 0, 1, 2, 1, 50_000)
    assert t.expire(61_000, 30_000) == 1
    assert set(t.producers) == {2}


def test_snapshots_round_trip_keep_the_newest_and_set_corrupt_ones_aside(tmp_path):
    t = ProducerTable()
    stored(t, 1, 2, MAX_SEQ, 40, 4)
    for off in (10, 20, 30, 44):
        write_snapshot(tmp_path, off, t.encode())
    assert snapshot_offsets(tmp_path) == [20, 30, 44]
    back = load_snapshot(tmp_path, 100)
    assert back.offset == 44 and check(back, 1, 2, MAX_SEQ, 4) == Duplicate(40, 44)
    assert load_snapshot(tmp_path, 25).offset == 20
    (tmp_path / "00000000000000000044.producers").write_bytes(b"\0\0\0\0garbage")
    assert load_snapshot(tmp_path, 100).offset == 30
    assert (tmp_path / "00000000000000000044.producers.bad").exists()
    assert load_snapshot(tmp_path, 5) is None
