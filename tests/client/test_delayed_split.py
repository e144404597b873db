"""``split_delayed``: delayed messages in runs whose stored batch fits the topic's
``max.message.bytes`` (``sluice produce --delay-ms`` sends one batch per run)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.client.transaction import split_delayed
from sluice.protocol import transactions as tx
from sluice.protocol.records import HEADER_SIZE

AT, NOW = 1_700_000_060_000, 1_700_000_000_000


def batch_size(run) -> int:
    return len(tx.delayed_batch(run, AT, NOW))


def test_lines_of_1400_bytes_fill_batches_up_to_the_limit():
    recs = [(None, b"x" * 1400, ()) for _ in range(5000)]
    runs = split_delayed(recs, AT, 1 << 20, 1000)
    assert [r for run in runs for r in run] == recs
    for i, run in enumerate(runs):
        assert batch_size(run) <= 1 << 20
        if i + 1 < len(runs):  # as full as it can be: one more would not fit
            assert batch_size([*run, runs[i + 1][0]]) > 1 << 20
    assert all(len(run) > 700 for run in runs[:-1])  # ~1.47 KB stored a message: ~710 a batch


def test_the_count_cap_holds_for_small_messages():
    recs = [(b"k", str(i).encode(), [("h", b"v")]) for i in range(20_000)]
    runs = split_delayed(recs, AT, 65536, 1000)
    assert [r for run in runs for r in run] == recs
    assert all(batch_size(run) <= 65536 for run in runs)
    assert max(len(run) for run in runs) < 1000  # 65536 bytes hold fewer than 1000 of these


def test_a_message_too_large_alone_is_a_run_of_its_own():
    small, big = (None, b"s", ()), (None, b"b" * 70_000, ())
    assert split_delayed([small, big, small], AT, 65536) == [[small], [big], [small]]
    assert split_delayed([], AT, 65536) == []


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=300),
    keyed=st.booleans(),
    limit=st.integers(HEADER_SIZE + 200, 20_000),
)
def test_every_run_fits_and_none_could_take_the_next(sizes, keyed, limit):
    recs = [(b"key" if keyed else None, b"v" * n, [("src", b"file")]) for n in sizes]
    runs = split_delayed(recs, AT, limit)
    assert [r for run in runs for r in run] == recs
    for i, run in enumerate(runs):
        assert run
        assert len(run) == 1 or batch_size(run) <= limit
        if i + 1 < len(runs):
            assert batch_size([*run, runs[i + 1][0]]) > limit
