"""Subscription records in a partition's log (protocol/subscriptions.py): cursor batches
round trip, other control batches are not read as cursors; settings, backoff, names."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import InvalidSubscription
from sluice.protocol.records import (
    CONTROL_BIT,
    HIDDEN_BITS,
    Record,
    build_batch,
    decode_batch,
    decode_records,
    encode_record,
    iter_batches,
    validate_batches,
)
from sluice.protocol.subscriptions import (
    SNAPSHOT_KEY,
    STATE_PREFIX,
    CursorState,
    SubscriptionConfig,
    check_config,
    check_name,
    cursor_batch,
    dlq_topic,
    fold,
    read_cursor_records,
)
from sluice.protocol.transactions import commit_copy, half_batch, rollback_batch

NAME_CHARS = "abcXYZ019._-"

names = st.text(NAME_CHARS, min_size=1, max_size=100)
configs = st.builds(
    SubscriptionConfig,
    mode=st.sampled_from(["unordered", "ordered"]),
    max_attempts=st.integers(0, 1000),
    ack_timeout_ms=st.integers(1, 86_400_000),
    backoff_initial_ms=st.integers(0, 86_400_000),
    backoff_multiplier=st.floats(1.0, 100.0),
    backoff_max_ms=st.integers(1, 86_400_000),
).filter(lambda c: c.backoff_initial_ms <= c.backoff_max_ms)


@st.composite
def states(draw):
    confirmed = draw(st.integers(0, 1 << 40))
    acked, at = [], confirmed + 1
    for width, gap in draw(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), max_size=5)):
        acked.append((at, at + width))
        at += width + gap
    return CursorState(
        name=draw(names), config=draw(configs), confirmed=confirmed, acked=acked,
        dead_lettered=draw(st.integers(0, 1 << 40)), expired=draw(st.integers(0, 1 << 40)),
        created_ms=draw(st.integers(0, 1 << 45)), deleted=draw(st.booleans()),
    )


def records_of(batch: bytes) -> tuple[int, list[Record]]:
    [(h, pos)] = list(iter_batches(batch))
    return h.attributes, decode_batch(batch, h, pos)


@given(st.lists(states(), max_size=6), st.booleans(), st.integers(0, 1 << 45))
def test_cursor_batch_round_trip(found, snapshot, now):
    batch = cursor_batch(found, now, snapshot=snapshot)
    attributes, recs = records_of(batch)
    assert attributes & CONTROL_BIT  # never shown to readers
    assert decode_records(batch, "t", 0) == []
    if not found and not snapshot:  # never appended (the broker writes only with states)
        assert read_cursor_records(recs) is None
        return
    validate_batches(bytearray(batch), len(batch), broker=True)  # as the partition checks it
    assert read_cursor_records(recs) == (snapshot, found)
    keys = [r.key for r in recs]
    assert keys == ([SNAPSHOT_KEY] if snapshot else []) + [STATE_PREFIX + s.name.encode() for s in found]


def test_deleted_state_round_trips_with_defaults():
    batch = cursor_batch([CursorState(name="gone", deleted=True)], 1)
    _, recs = records_of(batch)
    assert read_cursor_records(recs) == (False, [CursorState(name="gone", deleted=True)])


def test_other_control_batches_are_not_cursor_records():
    _, rollback = records_of(rollback_batch("orders/0/5", 5, "timed out", 1000))
    assert read_cursor_records(rollback) is None
    half = half_batch("g", b"k", b"v", (), 1000)
    _, commit = records_of(commit_copy(half, "orders/0/5"))
    assert read_cursor_records(commit) is None
    plain = build_batch(encode_record(0, 0, b"sluice.subx", b"v", []), 1, 0, 0, flags=CONTROL_BIT)
    assert read_cursor_records(records_of(plain)[1]) is None
    keyless = build_batch(encode_record(0, 0, None, b"v", []), 1, 0, 0, flags=CONTROL_BIT)
    assert read_cursor_records(records_of(keyless)[1]) is None
    assert read_cursor_records([]) is None


def test_undecodable_states_are_skipped():
    good = CursorState(name="ok", confirmed=7)
    body = b"".join([
        encode_record(0, 0, STATE_PREFIX + b"bad", b"\xc1 not msgpack", []),
        encode_record(1, 0, STATE_PREFIX + b"ok", msgspec.msgpack.encode(good), []),
        encode_record(2, 0, STATE_PREFIX + b"null", None, []),
    ])
    batch = build_batch(body, 3, 0, 0, flags=CONTROL_BIT)
    attributes, recs = records_of(batch)
    assert attributes & HIDDEN_BITS
    assert read_cursor_records(recs) == (False, [good])


# --------------------------------------------------------------------------- settings


def test_backoff_doubles_up_to_the_max():
    cfg = SubscriptionConfig(backoff_initial_ms=100, backoff_multiplier=2.0, backoff_max_ms=1000)
    assert [cfg.backoff_ms(n) for n in range(-1, 7)] == [0, 0, 100, 200, 400, 800, 1000, 1000]
    flat = SubscriptionConfig(backoff_initial_ms=250, backoff_multiplier=1.0)
    assert {flat.backoff_ms(n) for n in range(1, 50)} == {250}
    assert SubscriptionConfig(backoff_initial_ms=0).backoff_ms(5) == 0
    huge = SubscriptionConfig(backoff_initial_ms=10, backoff_multiplier=100.0, backoff_max_ms=5000)
    assert huge.backoff_ms(1000) == 5000  # overflows a float: the max


@given(configs, st.integers(1, 2000))
def test_backoff_is_within_bounds_and_never_decreases(cfg, attempt):
    wait = cfg.backoff_ms(attempt)
    assert 0 <= wait <= cfg.backoff_max_ms
    assert wait <= cfg.backoff_ms(attempt + 1) or cfg.backoff_ms(attempt + 1) == cfg.backoff_max_ms
    assert check_config(cfg) is cfg


@pytest.mark.parametrize(("changes", "needle"), [
    ({"mode": "fifo"}, "mode must be one of unordered, ordered"),
    ({"max_attempts": -1}, "max_attempts must be 0-1000"),
    ({"max_attempts": 1001}, "max_attempts must be 0-1000"),
    ({"ack_timeout_ms": 0}, "ack_timeout_ms must be 1-86400000"),
    ({"ack_timeout_ms": 86_400_001}, "ack_timeout_ms must be 1-86400000"),
    ({"backoff_max_ms": 0}, "backoff_max_ms must be 1-86400000"),
    ({"backoff_initial_ms": -1}, "backoff_initial_ms must be 0-86400000"),
    ({"backoff_multiplier": 0.5}, "backoff_multiplier must be 1-100"),
    ({"backoff_multiplier": 101.0}, "backoff_multiplier must be 1-100"),
    ({"backoff_initial_ms": 2000, "backoff_max_ms": 1000}, r"backoff_initial_ms \(2000\) is above backoff_max_ms \(1000\)"),
])
def test_check_config_says_which_setting(changes, needle):
    with pytest.raises(InvalidSubscription, match=needle):
        check_config(SubscriptionConfig(**changes))


def test_check_config_accepts_the_bounds():
    for cfg in [
        SubscriptionConfig(),
        SubscriptionConfig(mode="ordered", max_attempts=1000, ack_timeout_ms=1, backoff_initial_ms=0,
                           backoff_multiplier=100.0, backoff_max_ms=86_400_000),
    ]:
        assert check_config(cfg) is cfg


@pytest.mark.parametrize("name", ["a", "orders-v2", "A.b_c-9", "x" * 100])
def test_check_name_accepts(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 101, "with space", "slash/y", "é", "a\n", "tab\t", None, 5])
def test_check_name_refuses(name):
    with pytest.raises(InvalidSubscription, match="invalid subscription name"):
        check_name(name)


def test_dlq_topic_name():
    assert dlq_topic("orders", "billing") == "orders.billing.dlq"


# ------------------------------------------------------------------ the retry journal


def st_(name="s", full=False, retries=(), **kw) -> CursorState:
    return CursorState(name=name, full=full, retries=list(retries), **kw)


def test_fold_keeps_the_last_record_and_journals_retries():
    folded = fold([
        (True, [st_(full=True, confirmed=5, retries=[(10, 20, 1, 500)])]),
        (False, [st_(confirmed=6, retries=[(30, 31, 2, 100)])]),
        (False, [st_(confirmed=7)]),  # an ack written down: the journal goes on
        (False, [st_(confirmed=8, retries=[(15, 17, 3, 900)])]),  # overrides 15-17 of the first
    ])
    s = folded["s"]
    assert s.confirmed == 8 and s.full
    assert s.retries == [(30, 31, 2, 100), (10, 15, 1, 500), (17, 20, 1, 500), (15, 17, 3, 900)]


def test_a_full_record_starts_the_journal_again():
    folded = fold([
        (False, [st_(retries=[(1, 2, 1, 10)])]),
        (False, [st_(full=True, retries=[(5, 6, 2, 20)])]),  # a seek, say
        (False, [st_(retries=[(7, 8, 1, 30)])]),
    ])
    assert folded["s"].retries == [(5, 6, 2, 20), (7, 8, 1, 30)]


def test_records_of_before_the_journal_are_full():
    """A record without the ``full`` field (as written before the journal) holds every
    retry of its subscription: the last one wins, as it always did."""
    old = msgspec.msgpack.encode({"name": "s", "confirmed": 3, "retries": [(4, 5, 1, 10)]})
    state = msgspec.msgpack.decode(old, type=CursorState)
    assert state.full
    folded = fold([(False, [st_(full=True, retries=[(1, 2, 1, 1)])]), (False, [state])])
    assert folded["s"].retries == [(4, 5, 1, 10)]


def test_snapshots_and_deletions_forget():
    folded = fold([
        (False, [st_("a", retries=[(1, 2, 1, 1)]), st_("b")]),
        (True, [st_("a", full=True)]),  # b is gone: not in the snapshot
        (False, [st_("c", full=True), st_("a", deleted=True)]),
        (False, [st_("a", retries=[(9, 10, 1, 1)])]),  # a again, after its deletion
    ])
    assert sorted(folded) == ["a", "c"]
    assert folded["a"].retries == [(9, 10, 1, 1)]


@given(st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), max_size=4)),
                max_size=12))
def test_fold_gives_each_offset_its_newest_entry(records):
    """Against a model: the journal as a dict offset -> (attempt, due), reset by full records."""
    model: dict[int, tuple[int, int]] = {}
    batches = []
    for n, (full, spans) in enumerate(records):
        retries = [(a, a + k, n, 1000 - n) for a, k in spans]
        if full or not batches:
            model = {}
        for a, b, attempt, due in retries:
            model.update({o: (attempt, due) for o in range(a, b)})
        batches.append((False, [st_(full=full, retries=retries)]))
    if not batches:
        return
    got = {o: (attempt, due) for a, b, attempt, due in fold(batches)["s"].retries for o in range(a, b)}
    assert got == model
    entries = fold(batches)["s"].retries
    assert [e[3] for e in entries] == sorted(e[3] for e in entries)
