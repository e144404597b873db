"""Batch rewrite (storage/compaction.py): kept records keep their bytes, offsets and
timestamps; the header keeps every field but length, count and CRC."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import CorruptRecord
from sluice.protocol.compression import LZ4, NO_COMPRESSION, ZSTD
from sluice.protocol.records import (
    assign_offsets,
    batch_crc_ok,
    build_batch,
    decode_records,
    encode_record,
    parse_header,
    validate_batches,
    validate_replica_batches,
)
from sluice.storage.compaction import batch_body, iter_records, rewrite_batch

KEYS = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"dd", b""]))
VALUES = st.one_of(st.none(), st.binary(max_size=40))
RECORDS = st.lists(st.tuples(KEYS, VALUES, st.integers(0, 5000)), min_size=1, max_size=30)


def producer_batch(records, codec=NO_COMPRESSION, base=100, epoch=3, append_time=None) -> bytes:
    """A batch as the broker stores it: producer id/sequence, offsets and epoch assigned."""
    body = b"".join(encode_record(i, ts, k, v, [("h", b"x")] if i % 3 else None) for i, (k, v, ts) in enumerate(records))
    data = bytearray(build_batch(body, len(records), 1_000, 1_000 + max(ts for *_, ts in records),
                                 codec, producer_id=77, producer_epoch=2, base_sequence=40))
    assign_offsets(data, validate_batches(data, 1 << 30), base, epoch, append_time)
    return bytes(data)


@settings(max_examples=200, deadline=None)
@given(RECORDS, st.sampled_from([NO_COMPRESSION, LZ4, ZSTD]), st.data(), st.sampled_from([None, 5_000]))
def test_rewrite_keeps_chosen_records_and_the_header(records, codec, data, append_time):
    batch = producer_batch(records, codec, append_time=append_time)
    before = decode_records(batch, "t", 0)
    keep_offsets = set(data.draw(st.sets(st.sampled_from([r.offset for r in before]))))
    out, kept = rewrite_batch(batch, lambda r: r.offset in keep_offsets)

    h0, h1 = parse_header(batch), parse_header(out)
    assert kept == h1.records_count == len(keep_offsets)
    assert batch_crc_ok(out, 0, len(out)) and h1.size == len(out)
    for field in ("base_offset", "leader_epoch", "magic", "attributes", "last_offset_delta",
                  "base_timestamp", "max_timestamp", "producer_id", "producer_epoch", "base_sequence"):
        assert getattr(h1, field) == getattr(h0, field), field
    assert h1.next_offset == h0.next_offset
    after = decode_records(out, "t", 0)
    assert after == [r for r in before if r.offset in keep_offsets]  # offsets, timestamps, keys, values, headers
    # followers accept it as a leader's batch
    assert validate_replica_batches(out)[0].next_offset == h0.next_offset
    if len(keep_offsets) == len(before):
        assert out == batch  # nothing removed: the very bytes, no recompression


@given(RECORDS)
def test_iter_records_finds_keys_and_tombstones(records):
    batch = producer_batch(records)
    h = parse_header(batch)
    slices = list(iter_records(batch_body(batch, h), h))
    assert [(s.offset, s.key, s.tombstone) for s in slices] == [
        (100 + i, k, v is None) for i, (k, v, _) in enumerate(records)
    ]


def test_an_emptied_batch_keeps_its_offsets_and_decodes_to_nothing():
    batch = producer_batch([(b"k", b"v", 0), (b"k", b"w", 1)], ZSTD)
    out, kept = rewrite_batch(batch, lambda r: False)
    h = parse_header(out)
    assert kept == 0 and h.records_count == 0
    assert (h.base_offset, h.next_offset) == (100, 102)
    assert decode_records(out, "t", 0) == []


def test_a_record_running_past_its_batch_is_corrupt():
    batch = bytearray(producer_batch([(b"k", b"value", 0)]))
    batch[61] = 0x7E  # record length 63: past the body
    with pytest.raises(CorruptRecord):
        rewrite_batch(bytes(batch), lambda r: True)
