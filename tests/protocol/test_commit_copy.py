"""The commit of a half message: ``commit_copy`` copies the half's batch bytes and adds
``sluice.txn.id`` to its first record only.  Checked against the commit built the old way
(every record decoded and encoded again, each with the id): readers see the same keys,
values, headers, timestamps and offsets, and whoever reads the log for transaction state
finds the same half ended."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import CorruptRecord
from sluice.protocol import compression, records
from sluice.protocol import transactions as tx
from sluice.protocol.records import (
    COMMIT_BIT,
    TRANSACTIONAL_BIT,
    Record,
    assign_offsets,
    build_batch,
    decode_batch,
    decode_first,
    decode_records,
    encode_record,
    iter_batches,
    parse_header,
    validate_batches,
)

BIG = 1 << 30
CODECS = [compression.NO_COMPRESSION, compression.LZ4, compression.ZSTD]
HALF_ID = "orders/2/1234"


def old_commit_batch(half_id: str, recs) -> bytes:
    """The commit as the broker built it before: every record encoded again with the id."""
    base = min(r.timestamp for r in recs)
    body = b"".join(
        encode_record(i, r.timestamp - base, r.key, r.value, [*r.headers, (tx.ID_HEADER, half_id.encode())])
        for i, r in enumerate(recs)
    )
    return build_batch(body, len(recs), base, max(r.timestamp for r in recs), flags=COMMIT_BIT)


def stored(batch: bytes, base_offset: int, append_time: int | None = None) -> bytes:
    """``batch`` as a partition log holds it: validated, offsets (and append time) patched."""
    buf = bytearray(batch)
    assign_offsets(buf, validate_batches(buf, BIG, broker=True), base_offset, 3, append_time)
    return bytes(buf)


def readable(batch: bytes) -> list[Record]:
    return decode_records(batch, "orders", 2)


headers_st = st.lists(
    st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=3
)
record_st = st.tuples(
    st.none() | st.binary(max_size=30),
    st.none() | st.binary(max_size=300),
    headers_st,
    st.integers(0, 100_000),  # timestamp delta
)


@settings(max_examples=200, deadline=None)
@given(
    recs=st.lists(record_st, min_size=1, max_size=12),
    base_ts=st.integers(0, 2**42),
    codec=st.sampled_from(CODECS),
    producer=st.tuples(st.integers(-1, 2**40), st.integers(-1, 100), st.integers(-1, 2**20)),
    append_time=st.none() | st.integers(0, 2**42),
    half_at=st.integers(0, 2**40),
)
def test_commit_copy_reads_as_the_old_commit(recs, base_ts, codec, producer, append_time, half_at):
    body = b"".join(encode_record(i, d, k, v, h) for i, (k, v, h, d) in enumerate(recs))
    max_ts = base_ts + max(d for *_, d in recs)
    half = stored(
        build_batch(body, len(recs), base_ts, max_ts, codec, *producer, flags=TRANSACTIONAL_BIT),
        half_at, append_time,
    )
    half_id = tx.format_id("orders", 2, half_at)
    at = half_at + len(recs) + 7

    new = stored(tx.commit_copy(half, half_id), at)
    old = stored(old_commit_batch(half_id, decode_batch(half, parse_header(half), 0)), at)

    h = parse_header(new)
    assert h.attributes & COMMIT_BIT and not h.attributes & (TRANSACTIONAL_BIT | records.CONTROL_BIT)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    assert h.compression == codec and h.records_count == len(recs)
    assert list(iter_batches(new, check_crc=True))  # a fresh CRC
    ids = [(tx.ID_HEADER, half_id.encode())]
    got, want = readable(new), readable(old)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == [
        (r.offset, r.timestamp, r.key, r.value) for r in want
    ]
    # the id on the first record; every other record keeps exactly the half's headers
    assert got[0].headers == want[0].headers
    assert [r.headers for r in got[1:]] == [tuple(r.headers[:-1]) for r in want[1:]]
    assert [list(r.headers) for r in got[1:]] == [[tuple(x) for x in hs] for _, _, hs, _ in recs[1:]]
    assert list(got[0].headers) == [tuple(x) for x in recs[0][2]] + ids
    # the log's readers of transaction state find the same half ended
    assert tx.resolved_offset(h.attributes, [decode_first(new, h, 0)]) == half_at


def test_one_record_half_commits_to_the_same_bytes_as_before():
    """A transactional message's half is one record: its commit is byte for byte the old one."""
    half = stored(tx.half_batch("shop", b"k", b"paid", [("h", b"1"), ("n", None)], 1_700_000_000_123, (9, 0, 4)), 40)
    half_id = tx.format_id("orders", 0, 40)
    assert tx.commit_copy(half, half_id) == old_commit_batch(half_id, decode_batch(half, parse_header(half), 0))


def test_delayed_half_commit_keeps_every_record_and_its_delivery_time():
    msgs = [(b"k%d" % i, b"v%d" % i * i, [("app", b"%d" % i)]) for i in range(300)]
    half = stored(tx.delayed_batch(msgs, 1_700_000_060_000, 1_700_000_000_000, (5, 1, 0)), 10)
    commit = stored(tx.commit_copy(half, "orders/0/10"), 400)
    got = readable(commit)
    assert [(r.offset, r.key, r.value) for r in got] == [(400 + i, k, v) for i, (k, v, _) in enumerate(msgs)]
    assert {r.timestamp for r in got} == {1_700_000_000_000}
    for r, (_, _, hs) in zip(got, msgs, strict=True):
        h = dict(r.headers)
        assert h["app"] == hs[0][1] and h[tx.DELIVER_AT_HEADER] == b"1700000060000"
        assert h[tx.GROUP_HEADER] == tx.DELAY_GROUP.encode()
    assert dict(got[0].headers)[tx.ID_HEADER] == b"orders/0/10"


@pytest.mark.parametrize("cut", [1, 10, 61])
def test_a_partial_half_is_corrupt(cut):
    half = stored(tx.half_batch("g", None, b"v", (), 1000), 0)
    with pytest.raises(CorruptRecord):
        tx.commit_copy(half[:-cut], "t/0/0")


def test_a_half_with_a_malformed_first_record_is_corrupt():
    bad = build_batch(b"\x7f\x00\x00", 1, 1000, 1000, flags=TRANSACTIONAL_BIT)  # length runs past the body
    with pytest.raises(CorruptRecord):
        tx.commit_copy(bad, "t/0/0")
