"""Record batches: Kafka RecordBatch v2 byte tables, varint tables, round trips, corruption.

Expected bytes are written out field by field from the table at the top of records.py, with
the CRC-32C taken from the ``crc32c`` package directly, so an encoder bug cannot hide behind
the module's own helpers.
"""

from __future__ import annotations

import struct

import crc32c
import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import CorruptRecord
from sluice.protocol import compression, records, records_py
from sluice.protocol.records import (
    BatchTooLarge,
    Record,
    assign_offsets,
    build_batch,
    decode_records,
    decode_varint,
    encode_keyless_records,
    encode_record,
    encode_varint,
    iter_batches,
    parse_header,
    validate_batches,
)

BIG = 1 << 30  # a max_batch_bytes no test batch reaches
INT64 = st.integers(-(2**63), 2**63 - 1)
CODECS = [compression.NO_COMPRESSION, compression.LZ4, compression.ZSTD]


def batch_header(
    *,
    base_offset=0,
    batch_length,
    leader_epoch=-1,
    magic=2,
    crc,
    attributes=0,
    last_offset_delta,
    base_timestamp,
    max_timestamp,
    producer_id=-1,
    producer_epoch=-1,
    base_sequence=-1,
    records_count,
) -> bytes:
    """The 61-byte header, one struct.pack per field of the table in records.py."""
    out = (
        struct.pack(">q", base_offset)  # 0  base_offset
        + struct.pack(">i", batch_length)  # 8  batch_length
        + struct.pack(">i", leader_epoch)  # 12 partition_leader_epoch
        + struct.pack(">b", magic)  # 16 magic
        + struct.pack(">I", crc)  # 17 crc
        + struct.pack(">h", attributes)  # 21 attributes
        + struct.pack(">i", last_offset_delta)  # 23 last_offset_delta
        + struct.pack(">q", base_timestamp)  # 27 base_timestamp
        + struct.pack(">q", max_timestamp)  # 35 max_timestamp
        + struct.pack(">q", producer_id)  # 43 producer_id
        + struct.pack(">h", producer_epoch)  # 51 producer_epoch
        + struct.pack(">i", base_sequence)  # 53 base_sequence
        + struct.pack(">i", records_count)  # 57 records_count
    )
    assert len(out) == 61
    return out


def seal(buf: bytes | bytearray) -> bytes:
    """Recompute batch_length and the CRC of a single batch (for targeted corruption)."""
    b = bytearray(buf)
    struct.pack_into(">i", b, 8, len(b) - 12)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


# --------------------------------------------------------------------------- byte tables

# key b"k", value b"v", header ("h", b"x"), offset delta 0, timestamp delta 0
REC0 = bytes.fromhex(
    "18"  # length 12 (zig-zag 24)
    "00"  # attributes
    "00"  # timestamp delta 0
    "00"  # offset delta 0
    "02"
    "6b"  # key length 1, b"k"
    "02"
    "76"  # value length 1, b"v"
    "02"  # 1 header
    "02"
    "68"  # header key length 1, "h"
    "02"
    "78"  # header value length 1, b"x"
)
# key None, value None, no headers, offset delta 1, timestamp delta 5
REC1 = bytes.fromhex("0c 00 0a 02 01 01 00")
# key b"", value of 200 bytes (two-byte varint), header ("hé", None), ts delta -3, offset 2
REC2 = (
    bytes.fromhex("a803")  # length 212 (zig-zag 424)
    + bytes.fromhex("00")  # attributes
    + bytes.fromhex("05")  # timestamp delta -3
    + bytes.fromhex("04")  # offset delta 2
    + bytes.fromhex("00")  # key length 0: an empty key, not a null one
    + bytes.fromhex("9003")  # value length 200 (zig-zag 400)
    + b"\xaa" * 200
    + bytes.fromhex("02")  # 1 header
    + bytes.fromhex("06")
    + b"h\xc3\xa9"  # header key length 3: "hé" in UTF-8
    + bytes.fromhex("01")  # header value null
)


def test_record_byte_table():
    assert encode_record(0, 0, b"k", b"v", [("h", b"x")]) == REC0
    assert encode_record(1, 5, None, None) == REC1
    assert encode_record(1, 5, None, None, []) == REC1
    assert len(REC2) == 2 + 212
    assert encode_record(2, -3, b"", b"\xaa" * 200, [("hé", None)]) == REC2


def test_record_byte_table_decodes():
    body = REC0 + REC1 + REC2
    got = decode_records(build_batch(body, 3, 1000, 1005), "t", 0)
    assert got == [
        Record("t", 0, 0, 1000, b"k", b"v", (("h", b"x"),)),
        Record("t", 0, 1, 1005, None, None, ()),
        Record("t", 0, 2, 997, b"", b"\xaa" * 200, (("hé", None),)),
    ]


BASE_TS = 1_700_000_000_000


def test_batch_byte_table_uncompressed():
    body = REC0 + REC1
    tail_after_crc = (
        struct.pack(">h", 0)
        + struct.pack(">i", 1)
        + struct.pack(">q", BASE_TS)
        + struct.pack(">q", BASE_TS + 5)
        + struct.pack(">q", -1)
        + struct.pack(">h", -1)
        + struct.pack(">i", -1)
        + struct.pack(">i", 2)
        + body
    )
    crc = crc32c.crc32c(tail_after_crc)
    total = 61 + len(body)
    expected = (
        batch_header(
            batch_length=total - 12,
            crc=crc,
            last_offset_delta=1,
            base_timestamp=BASE_TS,
            max_timestamp=BASE_TS + 5,
            records_count=2,
        )
        + body
    )
    assert expected[21:] == tail_after_crc
    got = build_batch(body, 2, BASE_TS, BASE_TS + 5)
    assert got == expected
    h = parse_header(got)
    assert (h.size, h.crc, h.records_count, h.last_offset, h.compression) == (total, crc, 2, 1, 0)


def test_batch_byte_table_idempotent_producer():
    body = REC1
    tail = struct.pack(">hiqqqhii", 0, 0, 7, 7, 12345, 3, 42, 1) + body
    expected = (
        batch_header(
            batch_length=49 + len(body),
            crc=crc32c.crc32c(tail),
            last_offset_delta=0,
            base_timestamp=7,
            max_timestamp=7,
            producer_id=12345,
            producer_epoch=3,
            base_sequence=42,
            records_count=1,
        )
        + body
    )
    got = build_batch(body, 1, 7, 7, producer_id=12345, producer_epoch=3, base_sequence=42)
    assert got == expected


@pytest.mark.parametrize(
    ("codec", "decompress"),
    [
        (compression.LZ4, lz4.frame.decompress),
        (compression.ZSTD, lambda d: zstandard.ZstdDecompressor().decompressobj().decompress(d)),
    ],
)
def test_batch_byte_table_compressed(codec, decompress):
    body = (REC0 + REC1) * 20
    got = build_batch(body, 40, BASE_TS, BASE_TS + 5, codec=codec)
    compressed = got[61:]
    assert decompress(compressed) == body
    expected = batch_header(
        batch_length=49 + len(compressed),
        crc=crc32c.crc32c(got[21:]),
        attributes=codec,
        last_offset_delta=39,
        base_timestamp=BASE_TS,
        max_timestamp=BASE_TS + 5,
        records_count=40,
    )
    assert got[:61] == expected
    # The CRC covers attributes .. end: it must change when only the compressed body changes.
    assert crc32c.crc32c(got[21:-1] + bytes([got[-1] ^ 1])) != parse_header(got).crc


def test_assign_offsets_byte_table():
    body = REC0 + REC1
    buf = bytearray(build_batch(body, 2, BASE_TS, BASE_TS + 5))
    spans = validate_batches(buf, BIG)
    assert [(s.pos, s.size, s.count, s.max_timestamp) for s in spans] == [
        (0, len(buf), 2, BASE_TS + 5)
    ]
    before = bytes(buf)
    assert assign_offsets(buf, spans, 100, 7, None) == 102
    # Create time: only base offset and leader epoch change; both lie outside the CRC.
    assert buf == struct.pack(">q", 100) + before[8:12] + struct.pack(">i", 7) + before[16:]

    assert assign_offsets(buf, spans, 100, 7, BASE_TS + 99) == 102
    tail = struct.pack(">hiqqqhii", 0x08, 1, BASE_TS, BASE_TS + 99, -1, -1, -1, 2) + body
    expected = (
        batch_header(
            base_offset=100,
            batch_length=len(buf) - 12,
            leader_epoch=7,
            crc=crc32c.crc32c(tail),
            attributes=0x08,
            last_offset_delta=1,
            base_timestamp=BASE_TS,
            max_timestamp=BASE_TS + 99,
            records_count=2,
        )
        + body
    )
    assert buf == expected
    assert validate_batches(buf, BIG) == [records.BatchSpan(0, len(buf), 2, BASE_TS + 99, attributes=records.TIMESTAMP_TYPE_BIT)]


def test_crc32c_is_castagnoli():
    # The standard check value of CRC-32C, and the module uses that very function.
    assert crc32c.crc32c(b"123456789") == 0xE3069283
    assert records.crc32c(b"123456789") == 0xE3069283


def test_keyless_records_byte_table():
    assert encode_keyless_records([b"ab", b""]) == (
        bytes.fromhex("10 00 00 00 01 04")
        + b"ab"
        + bytes.fromhex("00")
        + bytes.fromhex("0c 00 00 02 01 00 00")
    )
    assert encode_keyless_records([b"z"], first_delta=64) == bytes.fromhex("100000800101027a00")


# --------------------------------------------------------------------------- varints

VARINTS = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (150, "ac02"),
    (8191, "fe7f"),
    (-8192, "ff7f"),
    (8192, "808001"),
    (16383, "fe ff 01"),
    (32767, "feff03"),  # last entry of the lookup table
    (32768, "808004"),  # first computed one
    (-32768, "ffff03"),
    (2**31 - 1, "feffffff0f"),
    (-(2**31), "ffffffff0f"),
    (2**63 - 1, "feffffffffffffffff01"),
    (-(2**63), "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("n", "hexbytes"), VARINTS)
def test_varint_table(n, hexbytes):
    encoded = bytes.fromhex(hexbytes)
    assert encode_varint(n) == encoded
    assert decode_varint(encoded, 0) == (n, len(encoded))
    assert decode_varint(b"\xff" + encoded + b"\xff", 1) == (n, 1 + len(encoded))


@given(INT64, st.binary(max_size=4), st.binary(max_size=4))
def test_varint_round_trip(n, before, after):
    encoded = encode_varint(n)
    assert 1 <= len(encoded) <= 10
    assert decode_varint(before + encoded + after, len(before)) == (n, len(before) + len(encoded))


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff\xff", b"\xff" * 9])
def test_varint_truncated(data):
    with pytest.raises(CorruptRecord, match="truncated"):
        decode_varint(data, 0)


def test_varint_too_long():
    with pytest.raises(CorruptRecord, match="overflows 64 bits"):
        decode_varint(b"\xff" * 10 + b"\x01", 0)


# --------------------------------------------------------------------------- round trips

header_keys = st.text(max_size=8)
headers_st = st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=16)), max_size=3)
record_st = st.tuples(
    st.none() | st.binary(max_size=40),  # key
    st.none() | st.binary(max_size=300),  # value (lengths beyond one varint byte)
    headers_st,
    st.integers(-(2**31), 2**31),  # timestamp delta
)
TS = st.integers(0, 2**42)


def build(recs, base_ts, codec, first=0):
    body = b"".join(encode_record(first + i, d, k, v, h) for i, (k, v, h, d) in enumerate(recs))
    max_ts = base_ts + max(d for *_, d in recs)
    return build_batch(body, len(recs), base_ts, max_ts, codec=codec)


def expected_records(recs, base_offset, base_ts, append_time, topic="t", partition=3):
    return [
        Record(
            topic,
            partition,
            base_offset + i,
            append_time if append_time is not None else base_ts + d,
            k,
            v,
            tuple(tuple(x) for x in h),
        )
        for i, (k, v, h, d) in enumerate(recs)
    ]


@settings(max_examples=150, deadline=None)
@given(
    recs=st.lists(record_st, min_size=1, max_size=8),
    base_ts=TS,
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(0, 2**62),
    epoch=st.integers(-1, 2**31 - 1),
    append_time=st.none() | TS,
)
def test_batch_round_trip(recs, base_ts, codec, base_offset, epoch, append_time):
    buf = bytearray(build(recs, base_ts, codec))
    spans = validate_batches(buf, BIG)
    assert len(spans) == 1 and spans[0].count == len(recs)
    assert assign_offsets(buf, spans, base_offset, epoch, append_time) == base_offset + len(recs)
    h = parse_header(buf)
    assert (h.base_offset, h.leader_epoch, h.compression) == (base_offset, epoch, codec)
    assert h.log_append_time == (append_time is not None)
    validate_batches(buf, BIG)  # still intact after patching
    got = decode_records(buf, "t", 3)
    assert got == expected_records(recs, base_offset, base_ts, append_time)
    assert decode_records(bytes(buf), "t", 3) == got


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    split=st.integers(0, 20),
    base_ts=TS,
    codec=st.sampled_from(CODECS),
)
def test_keyless_round_trip(values, split, base_ts, codec):
    split = min(split, len(values))
    body = encode_keyless_records(values[:split]) + encode_keyless_records(
        values[split:], first_delta=split
    )
    # The bulk path must be byte-identical to the general encoder.
    assert body == b"".join(encode_record(i, 0, None, v) for i, v in enumerate(values))
    buf = bytearray(build_batch(body, len(values), base_ts, base_ts, codec=codec))
    assign_offsets(buf, validate_batches(buf, BIG), 5, 0, None)
    assert decode_records(buf, "t", 0) == [
        Record("t", 0, 5 + i, base_ts, None, v) for i, v in enumerate(values)
    ]


# A keyless record at offset delta 0 is 4 + len(varint(size)) + size + 1 bytes long; from
# 32_760 bytes of value on, that length (>= 32_768) is past the varint lookup table.
@pytest.mark.parametrize("size", [0, 127, 8191, 32_700, 32_758, 32_759])
def test_keyless_large_values_match_encode_record(size):
    value = b"\x5a" * size
    assert encode_keyless_records([value]) == encode_record(0, 0, None, value)


@pytest.mark.parametrize("size", [32_760, 32_761, 40_000, 1 << 20])
def test_keyless_values_past_the_varint_table(size):
    value = b"\x5a" * size
    assert encode_keyless_records([value]) == encode_record(0, 0, None, value)


def test_varint_overflowing_64_bits_is_corrupt():
    with pytest.raises(CorruptRecord, match="overflows"):
        decode_varint(b"\xff" * 9 + b"\x7f", 0)


def test_keyless_too_many_records():
    with pytest.raises(ValueError):
        encode_keyless_records([b""] * 10, first_delta=32_760)


batches_st = st.lists(st.lists(record_st, min_size=1, max_size=4), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(
    batches=batches_st,
    codecs=st.lists(st.sampled_from(CODECS), min_size=4, max_size=4),
    base_ts=TS,
    base_offset=st.integers(0, 2**40),
    append_time=st.none() | TS,
    data=st.data(),
)
def test_concatenated_batches(batches, codecs, base_ts, base_offset, append_time, data):
    parts = [build(recs, base_ts, codec) for recs, codec in zip(batches, codecs, strict=False)]
    buf = bytearray(b"".join(parts))
    spans = validate_batches(buf, BIG)
    assert [(s.pos, s.size) for s in spans] == [
        (sum(map(len, parts[:i])), len(p)) for i, p in enumerate(parts)
    ]
    n = sum(map(len, batches))
    assert assign_offsets(buf, spans, base_offset, 1, append_time) == base_offset + n

    expected = []
    offset = base_offset
    for recs in batches:
        expected += expected_records(recs, offset, base_ts, append_time)
        offset += len(recs)
    assert decode_records(buf, "t", 3) == expected
    assert [h.base_offset for h, _ in iter_batches(buf)] == [
        base_offset + sum(map(len, batches[:i])) for i in range(len(batches))
    ]

    # min_offset anywhere (before, inside, after) keeps exactly the records at or past it.
    min_offset = data.draw(st.integers(base_offset - 2, base_offset + n + 1), "min_offset")
    assert decode_records(buf, "t", 3, min_offset=min_offset) == [
        r for r in expected if r.offset >= min_offset
    ]

    # A partial batch at the end (a fetch cut by a size cap) is ignored by readers, but a
    # produce carrying one is corrupt.
    extra = build(batches[0], base_ts, codecs[0])
    cut = data.draw(st.integers(1, len(extra) - 1), "cut")
    truncated = bytes(buf) + extra[:cut]
    assert decode_records(truncated, "t", 3) == expected
    assert [pos for _, pos in iter_batches(truncated)] == [s.pos for s in spans]
    with pytest.raises(CorruptRecord):
        validate_batches(truncated, BIG)


def test_decode_records_skips_whole_batches_below_min_offset():
    a = bytearray(build([(None, b"a", [], 0)] * 3, 0, 0))
    b = bytearray(build([(None, b"b", [], 0)] * 2, 0, 0))
    buf = a + b
    assign_offsets(buf, validate_batches(buf, BIG), 10, 0, None)
    assert [r.offset for r in decode_records(buf, "t", 0, min_offset=13)] == [13, 14]
    assert [r.offset for r in decode_records(buf, "t", 0, min_offset=12)] == [12, 13, 14]
    assert decode_records(buf, "t", 0, min_offset=15) == []


def test_decode_records_skips_control_batches():
    buf = bytearray(build([(None, b"x", [], 0)], 0, 0))
    buf[22] |= records.CONTROL_BIT
    buf = bytearray(seal(buf))
    assert decode_records(buf, "t", 0) == []


# --------------------------------------------------------------------------- corruption

ONE = build([(b"key", b"value" * 10, [("h", b"v")], 3), (None, b"second", [], 0)], BASE_TS, 0)


@settings(max_examples=200)
@given(pos=st.integers(21, len(ONE) - 1), mask=st.integers(1, 255))
def test_any_flip_in_crc_region_is_caught(pos, mask):
    buf = bytearray(ONE)
    buf[pos] ^= mask
    with pytest.raises(CorruptRecord):
        validate_batches(buf, BIG)
    with pytest.raises(CorruptRecord):
        decode_records(buf, "t", 0)


# batch_length, magic and crc; the leader epoch (12..15) is patched by the broker.
@given(pos=st.sampled_from([*range(8, 12), *range(16, 21)]), mask=st.integers(1, 255))
def test_any_flip_of_length_magic_or_crc_is_caught(pos, mask):
    buf = bytearray(ONE)
    buf[pos] ^= mask
    with pytest.raises(CorruptRecord):
        validate_batches(buf, BIG)


@given(pos=st.sampled_from([*range(0, 8), *range(12, 16)]), mask=st.integers(1, 255))
def test_base_offset_and_epoch_are_outside_the_crc(pos, mask):
    buf = bytearray(ONE)
    buf[pos] ^= mask
    assert len(validate_batches(buf, BIG)) == 1


def patched(fmt: str, offset: int, value: int, *, reseal: bool = True) -> bytearray:
    buf = bytearray(ONE)
    struct.pack_into(fmt, buf, offset, value)
    if reseal:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return buf


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_bad_magic(magic):
    with pytest.raises(CorruptRecord, match="magic"):
        validate_batches(patched(">b", 16, magic), BIG)
    with pytest.raises(CorruptRecord, match="magic"):
        decode_records(patched(">b", 16, magic), "t", 0)


@pytest.mark.parametrize("length", [-1, 0, 48, -(2**31)])
def test_batch_length_below_header(length):
    buf = patched(">i", 8, length)
    with pytest.raises(CorruptRecord, match="below the header"):
        validate_batches(buf, BIG)
    with pytest.raises(CorruptRecord):
        decode_records(buf, "t", 0)


@pytest.mark.parametrize("extra", [1, 1000, 2**31 - 1 - (len(ONE) - 12)])
def test_batch_length_past_buffer(extra):
    buf = patched(">i", 8, len(ONE) - 12 + extra)
    with pytest.raises(CorruptRecord, match="declares"):
        validate_batches(buf, BIG)
    assert decode_records(buf, "t", 0) == []  # to a reader it is a partial batch


def test_batch_length_short_of_the_data_is_caught():
    with pytest.raises(CorruptRecord):
        validate_batches(patched(">i", 8, len(ONE) - 13), BIG)


@pytest.mark.parametrize(
    ("count", "last_delta"), [(0, -1), (1, 1), (3, 1), (2, 0), (-1, -2), (2**31 - 1, 1)]
)
def test_count_and_last_offset_delta_mismatch(count, last_delta):
    buf = patched(">i", 57, count)
    struct.pack_into(">i", buf, 23, last_delta)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    with pytest.raises(CorruptRecord, match="records but last offset delta"):
        validate_batches(buf, BIG)


@pytest.mark.parametrize("codec", [1, 2, 5, 6, 7])
def test_unsupported_codec(codec):
    with pytest.raises(CorruptRecord, match="codec"):
        validate_batches(patched(">h", 21, codec), BIG)
    with pytest.raises(CorruptRecord, match="codec"):
        decode_records(patched(">h", 21, codec), "t", 0)


@pytest.mark.parametrize("bits", [records.CONTROL_BIT, records.COMMIT_BIT, records.CONTROL_BIT | records.TRANSACTIONAL_BIT])
def test_control_and_commit_batches_refused(bits):
    with pytest.raises(CorruptRecord, match="brokers only"):
        validate_batches(patched(">h", 21, bits), BIG)


def test_transactional_batches_accepted_never_decoded_for_readers():
    half = build_batch(encode_record(0, 0, b"k", b"half", [("sluice.txn.group", b"g")]), 1, 5, 5,
                       flags=records.TRANSACTIONAL_BIT)
    plain = build_batch(encode_record(0, 0, None, b"plain"), 1, 5, 5)
    commit = build_batch(encode_record(0, 0, None, b"copy"), 1, 5, 5, flags=records.COMMIT_BIT)
    buf = bytearray(half + plain)
    spans = validate_batches(buf, BIG)
    assert [records.batch_attributes(buf, s.pos) for s in spans] == [records.TRANSACTIONAL_BIT, 0]
    assign_offsets(buf, spans, 40, 0, None)
    buf += seal(bytearray(commit))
    assert [(r.offset, r.value) for r in decode_records(buf, "t", 0)] == [(41, b"plain"), (0, b"copy")]
    h, pos = next(iter_batches(buf))
    (rec,) = records.decode_batch(buf, h, pos, "t", 3)
    assert (rec.offset, rec.key, rec.value, rec.headers) == (40, b"k", b"half", (("sluice.txn.group", b"g"),))


def test_crc_mismatch_message():
    buf = bytearray(ONE)
    buf[-2] ^= 1  # the last byte of b"second"
    with pytest.raises(CorruptRecord, match="CRC"):
        validate_batches(buf, BIG)
    with pytest.raises(CorruptRecord, match="CRC"):
        list(iter_batches(buf))
    # Without the CRC check the flip in the last value byte decodes, to the wrong value.
    assert decode_records(buf, "t", 0, check_crc=False)[1].value == b"secone"


@pytest.mark.parametrize("data", [b"", bytearray(), memoryview(b"")])
def test_empty_produce_is_corrupt(data):
    with pytest.raises(CorruptRecord, match="no record batch"):
        validate_batches(data, BIG)
    assert decode_records(data, "t", 0) == []


@pytest.mark.parametrize("cut", [1, 12, 60])
def test_truncated_header_is_corrupt(cut):
    with pytest.raises(CorruptRecord, match="truncated"):
        validate_batches(ONE[:cut], BIG)
    with pytest.raises(CorruptRecord, match="truncated"):
        parse_header(ONE[:cut])


def test_batch_over_max_bytes():
    assert validate_batches(ONE, len(ONE))[0].size == len(ONE)
    with pytest.raises(BatchTooLarge) as info:
        validate_batches(ONE, len(ONE) - 1)
    assert info.value.size == len(ONE)
    assert isinstance(info.value, ValueError)
    # The second batch is the large one: still refused.
    small = build([(None, b"", [], 0)], 0, 0)
    with pytest.raises(BatchTooLarge) as info:
        validate_batches(small + ONE, len(small))
    assert info.value.size == len(ONE)


@pytest.mark.parametrize(
    ("body", "count", "match"),
    [
        (bytes.fromhex("01"), 1, "record length"),  # record length -1
        (bytes.fromhex("7e"), 1, "record length"),  # 63 bytes declared, none there
        (bytes.fromhex("0c 00 00 00 03 01 00"), 1, "key length"),  # key length -2
        (bytes.fromhex("0c 00 00 00 01 03 00"), 1, "value length"),  # value length -2
        (bytes.fromhex("0c 00 00 00 01 01 03"), 1, "header count"),  # header count -2
        (bytes.fromhex("10 00 00 00 01 01 02 01 01"), 1, "null header key"),
        (bytes.fromhex("12 00 00 00 01 01 02 02 ff 01"), 1, "UTF-8"),
        (bytes.fromhex("0c 00 00 00 01 01 00 00"), 1, "stray"),  # a byte after the record
        (bytes.fromhex("0c 00 00 00 01 01 00"), 2, "runs past"),  # fewer records than count
        (bytes.fromhex("0c 00 00 00 01 0a 00"), 1, "runs past"),  # value runs past
        (bytes.fromhex("0c 00 80 80 80 80"), 1, "varint|runs past"),  # truncated varint
    ],
)
def test_record_body_errors(body, count, match):
    with pytest.raises(CorruptRecord, match=match):
        decode_records(build_batch(body, count, 0, 0), "t", 0)


def test_record_length_must_match_its_fields():
    # REC1 declares 6 bytes; declare 7 and append one junk byte inside the record.
    body = bytes.fromhex("0e 00 0a 02 01 01 00 ff")
    with pytest.raises(CorruptRecord):
        decode_records(build_batch(body, 1, 0, 0), "t", 0)


def test_header_keys_decode_the_same_first_and_again_long_and_multibyte():
    long_key = "k" * 200
    hdrs = [("sluice.deliver_at", b"1"), ("é", None), (long_key, b"x" * 70), ("", b"")]
    body = b"".join(encode_record(i, 0, None, b"v", hdrs) for i in range(3))
    got = decode_records(build_batch(body, 3, 0, 0), "t", 0)
    assert [list(r.headers) for r in got] == [hdrs] * 3
    assert all(type(k) is str for r in got for k, _ in r.headers)
    assert long_key.encode() not in records_py.KEYS  # only short keys are kept
    assert len(records_py.KEYS) <= records_py.MAX_KEYS


def test_a_bad_header_key_is_corrupt_after_good_ones():
    good = encode_record(0, 0, None, b"v", [("ok", b"1")])
    bad = bytes.fromhex("12 00 00 02 01 01 02 02 ff 01")  # key 0xff: not UTF-8
    decode_records(build_batch(good, 1, 0, 0), "t", 0)
    with pytest.raises(CorruptRecord, match="UTF-8"):
        decode_records(build_batch(good + bad, 2, 0, 0), "t", 0)


@pytest.mark.parametrize("codec", [compression.LZ4, compression.ZSTD])
def test_undecompressible_body(codec):
    buf = bytearray(build_batch(REC1, 1, 0, 0))
    struct.pack_into(">h", buf, 21, codec)  # claims compression; the body is plain
    with pytest.raises(CorruptRecord, match="decompress"):
        decode_records(seal(buf), "t", 0)


# --------------------------------------------------------------------------- fuzz


def decode_or_corrupt(data, **kwargs):
    try:
        out = decode_records(data, "t", 0, **kwargs)
    except CorruptRecord:
        return None
    assert all(isinstance(r, Record) for r in out)
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.booleans())
def test_garbage_decodes_or_raises_corrupt_record(data, check_crc):
    decode_or_corrupt(data, check_crc=check_crc)


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=200),
    codec=st.sampled_from(CODECS),
    count=st.integers(-2, 2**31 - 1) | st.integers(0, 5),
    flags=st.integers(0, 0x7FF8) | st.sampled_from([0, records.TIMESTAMP_TYPE_BIT]),
    timestamps=st.tuples(INT64, INT64),
)
def test_garbage_records_in_a_sealed_batch(body, codec, count, flags, timestamps):
    """Garbage that passes the header and CRC checks (and decompresses) reaches the decoder."""
    tail = struct.pack(
        ">hiqqqhii", (flags & ~7) | codec, count - 1, *timestamps, -1, -1, -1, count
    ) + compression.compress(codec, body)
    batch = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c.crc32c(tail)) + tail
    decode_or_corrupt(batch)


@settings(max_examples=200, deadline=None)
@given(
    recs=st.lists(record_st, min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_mutated_records_in_a_sealed_batch(recs, edits):
    """Valid records with a few bytes overwritten, then resealed: decode or CorruptRecord."""
    buf = bytearray(build(recs, 0, 0))
    for pos, value in edits:
        buf[61 + pos % (len(buf) - 61)] = value
    decode_or_corrupt(seal(buf))


@pytest.mark.parametrize("codec", [compression.NO_COMPRESSION, compression.LZ4, compression.ZSTD])
@pytest.mark.parametrize("pid, epoch, seq", [(7, 0, 0), ((1 << 63) - 1, 32767, (1 << 31) - 1), (1 << 62, 3, 12345)])
def test_stamp_producer_equals_building_with_the_fields(codec, pid, epoch, seq):
    body = b"".join(records.encode_record(i, i, None, b"v%d" % i) for i in range(5))
    plain = records.build_batch(body, 5, 1000, 1004, codec)
    stamped = records.stamp_producer(plain, pid, epoch, seq)
    assert stamped == records.build_batch(body, 5, 1000, 1004, codec, pid, epoch, seq)
    span = records.validate_batches(bytearray(stamped), 1 << 20)[0]  # the CRC holds
    assert (span.producer_id, span.producer_epoch, span.base_sequence) == (pid, epoch, seq)
    assert records.stamp_producer(stamped, -1, -1, -1) == plain


@settings(max_examples=100, deadline=None)
@given(recs=st.lists(record_st, min_size=1, max_size=8), base_ts=TS, codec=st.sampled_from(CODECS))
def test_decode_first_is_the_first_of_decode_batch(recs, base_ts, codec):
    buf = build(recs, base_ts, codec)
    h = parse_header(buf)
    assert records.decode_first(buf, h, 0) == records.decode_batch(buf, h, 0)[0]
