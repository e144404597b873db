"""The records of ``__groups`` (byte tables and round trips) and the group -> partition hash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import CorruptRecord
from sluice.protocol.coordinator import group_partition
from sluice.protocol.group_records import (
    Committed,
    OffsetKey,
    build_offsets_batches,
    decode_key,
    decode_offset_record,
    decode_value,
    encode_key,
    encode_value,
)
from sluice.protocol.records import Record, assign_offsets, decode_records, validate_batches

BIG = 1 << 30


def test_key_and_value_bytes():
    # msgpack: fixarray(4) [0, "g", "t", 3]
    assert encode_key(OffsetKey("g", "t", 3)) == bytes.fromhex("94 00 a1 67 a1 74 03")
    # fixarray(5) [0, 5, "m", 1, "c"]
    assert encode_value(Committed(5, "m", 1, "c")) == bytes.fromhex("95 00 05 a1 6d 01 a1 63")
    assert encode_value(None) is None  # a tombstone


def test_group_partition_is_a_stable_crc32():
    # fixed values: every client and broker, in every process, must agree
    assert [group_partition(g, 8) for g in ["billing", "audit", "", "é"]] == [2, 1, 0, 6]
    assert group_partition("billing", 1) == 0
    with pytest.raises(ValueError):
        group_partition("billing", 0)


names = st.text(min_size=0, max_size=30)
committed = st.builds(
    Committed, st.integers(0, 2**63 - 1), names, st.integers(-1, 2**62), names
)
keys = st.builds(OffsetKey, names, names, st.integers(0, 10_000))


@given(keys, st.none() | committed)
def test_round_trip(key, value):
    assert decode_key(encode_key(key)) == key
    assert decode_value(encode_value(value)) == value


def _decoded(data: bytes):
    buf = bytearray(data)
    assign_offsets(buf, validate_batches(buf, BIG), 0, 0, None)
    return [decode_offset_record(r) for r in decode_records(buf, "__groups", 0)]


@given(st.lists(st.tuples(keys, st.none() | committed), min_size=1, max_size=40), st.integers(100, 2000))
def test_batches_hold_every_entry_in_order_within_the_size_cap(entries, cap):
    data = build_offsets_batches(entries, 1_000, cap)
    spans = validate_batches(bytearray(data), BIG)
    assert all(s.size <= cap or s.count == 1 for s in spans)
    assert [(e.key, e.value) for e in _decoded(data)] == entries
    assert [e.offset for e in _decoded(data)] == list(range(len(entries)))


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError):
        build_offsets_batches([], 1_000, BIG)


def test_keys_of_another_type_are_skipped_and_bad_bytes_are_corrupt():
    assert decode_key(bytes.fromhex("92 07 a1 67")) is None  # key type 7: a later record kind
    for raw in (b"\xc1", bytes.fromhex("93 00 a1 67"), bytes.fromhex("94 00 a1 67 a1 74 a1 78")):
        with pytest.raises(CorruptRecord):
            decode_key(raw)
    for raw in (b"\xc1", bytes.fromhex("92 00 05"), bytes.fromhex("95 00 a1 78 a1 6d 01 a1 63")):
        with pytest.raises(CorruptRecord):
            decode_value(raw)
    with pytest.raises(CorruptRecord, match="no key"):
        decode_offset_record(Record("__groups", 0, 4, 0, None, b"x"))


def test_a_value_may_grow_fields_at_its_end():
    raw = bytes.fromhex("96 01 05 a1 6d 01 a1 63 c3")  # version 1 with a sixth field
    assert decode_value(raw) == Committed(5, "m", 1, "c")
