"""The compiled record codec (``sluice._crecords``) against its pure-Python reference.

Same records for random batches (keys, values, headers, timestamps, compression, log-append
time, a start offset), the same bytes for keyless bodies, and the same verdict — equal
records or ``CorruptRecord`` from both — for bodies with bytes flipped, cut or added.
"""

from __future__ import annotations

import os
import shutil
import sysconfig

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice import native
from sluice.errors import CorruptRecord
from sluice.protocol import compression, records, records_py
from sluice.protocol.records import Record, build_batch, encode_record

crecords = pytest.importorskip("sluice._crecords")
crecords.init(CorruptRecord)  # records.py does it only when it uses the build (not with SLUICE_PURE_PYTHON)

CODECS = [compression.NO_COMPRESSION, compression.LZ4, compression.ZSTD]
headers_st = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=3)
record_st = st.tuples(
    st.none() | st.binary(max_size=40),  # key
    st.none() | st.binary(max_size=300),  # value: lengths past one varint byte
    headers_st,
    st.integers(-(2**63), 2**63 - 1),  # timestamp delta: sums past int64 included
    st.integers(-(2**40), 2**40),  # offset delta: not always the record's index
)


def test_compiled_where_a_compiler_is():
    """``pip install`` builds the codec wherever a C compiler and Python's headers are."""
    have_cc = shutil.which("cc") or shutil.which("gcc")
    have_headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not (have_cc and have_headers):
        pytest.skip("no C compiler or Python headers: the pure-Python codec runs")
    if native.pure_python():
        pytest.skip("SLUICE_PURE_PYTHON is set")
    assert records.COMPILED


def both(body: bytes, count: int, base_offset: int, base_ts: int, append_ts, min_offset: int,
         max_offset=None, factory=Record, extra=()):
    """(records or the exception type) from the compiled codec and from the reference."""
    h = records.BatchHeader(base_offset, 0, 0, 2, 0, records.TIMESTAMP_TYPE_BIT if append_ts is not None else 0,
                            count - 1, base_ts, append_ts or 0, -1, -1, -1, count)
    out = []
    for decode in (
        lambda o: crecords.decode_body(
            body, count, base_offset, base_ts, append_ts, min_offset, "t", 3, factory, o, max_offset, extra
        ),
        lambda o: records_py.decode_body(body, h, "t", 3, min_offset, o, max_offset, factory, extra),
    ):
        got: list = []
        try:
            decode(got)
        except CorruptRecord:
            got = CorruptRecord
        out.append(got)
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    recs=st.lists(record_st, min_size=1, max_size=8),
    base_offset=st.integers(0, 2**62),
    base_ts=st.integers(-(2**63), 2**63 - 1),
    append_ts=st.none() | st.integers(0, 2**42),
    min_offset=st.integers(0, 2**62),
    max_offset=st.none() | st.integers(0, 2**62),
)
def test_same_records_as_the_reference(recs, base_offset, base_ts, append_ts, min_offset, max_offset):
    body = b"".join(encode_record(od, td, k, v, h) for k, v, h, td, od in recs)
    compiled, reference = both(body, len(recs), base_offset, base_ts, append_ts, min_offset, max_offset)
    assert compiled == reference
    assert reference is not CorruptRecord


def test_a_factory_of_the_callers_with_extra_arguments():
    body = b"".join(encode_record(i, i, None, b"v%d" % i, [("h", b"x")]) for i in range(5))
    compiled, reference = both(body, 5, 10, 1000, None, 11, 14, lambda *a: a, ("extra", 7))
    assert compiled == reference == [
        ("t", 3, o, 1000 + o - 10, None, b"v%d" % (o - 10), (("h", b"x"),), "extra", 7) for o in (11, 12, 13)
    ]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    recs=st.lists(record_st, min_size=1, max_size=6),
    codec=st.sampled_from(CODECS),
    append_time=st.none() | st.integers(0, 2**42),
    split=st.integers(0, 8),
)
def test_decode_records_same_with_and_without_the_compiled_codec(recs, codec, append_time, split):
    """Whole batches through ``decode_records``: compression, log-append time, a start offset."""
    body = b"".join(encode_record(i, td % 2**31, k, v, h) for i, (k, v, h, td, _) in enumerate(recs))
    batch = bytearray(build_batch(body, len(recs), 1_700_000_000_000, 1_700_000_000_000, codec))
    spans = records.validate_batches(batch, 1 << 30)
    records.assign_offsets(batch, spans, 100, 0, append_time)
    compiled = records.decode_records(bytes(batch), "t", 1, 100 + split)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(records, "_C", None)
        reference = records.decode_records(bytes(batch), "t", 1, 100 + split)
    assert compiled == reference


def mutations():
    valid = st.lists(record_st, min_size=1, max_size=4).map(
        lambda recs: (b"".join(encode_record(i, 0, k, v, h) for i, (k, v, h, _, _) in enumerate(recs)), len(recs))
    )
    edit = st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
        st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
        st.tuples(st.just("add"), st.integers(0, 10_000), st.integers(0, 255)),
    )
    return st.tuples(valid, st.lists(edit, min_size=1, max_size=3), st.integers(-1, 2))


def apply(body: bytes, edits) -> bytes:
    buf = bytearray(body)
    for kind, at, byte in edits:
        at = at % (len(buf) + 1)
        if kind == "flip" and at < len(buf):
            buf[at] ^= byte
        elif kind == "cut":
            del buf[at:]
        elif kind == "add":
            buf.insert(at, byte)
    return bytes(buf)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_same_verdict_on_corrupt_bodies(case):
    (body, count), edits, count_change = case
    compiled, reference = both(apply(body, edits), max(0, count + count_change), 10, 1000, None, 0)
    assert compiled == reference


@pytest.mark.parametrize(
    "body",
    [
        b"\xff" * 11,  # a varint longer than 64 bits
        b"\x02\x00\x00",  # a record that ends inside its fields
        b"\x0e\x00\x00\x00\x03\x01\x00\x00",  # a negative key length other than -1
        b"\x0e\x00\x00\x00\x01\x03\x00\x00",  # a negative value length other than -1
        b"\x0c\x00\x00\x00\x01\x01\x02\x02\xff\xfe\x01",  # a header key that is not UTF-8
        b"\x0a\x00\x00\x00\x01\x01\x02\x01\x01",  # a null header key
    ],
)
def test_both_refuse(body):
    compiled, reference = both(body, 1, 0, 0, None, 0)
    assert compiled is reference is CorruptRecord


@given(
    values=st.lists(st.binary(max_size=20_000) | st.binary(max_size=20), max_size=40),
    first=st.integers(0, 30_000),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_keyless_bodies_byte_for_byte(values, first, kind):
    values = [kind(v) for v in values[: records.VARINT_TABLE_SIZE - first]]
    assert crecords.encode_keyless(values, first) == records_py.encode_keyless(values, first)


def test_keyless_refuses_what_is_not_bytes():
    with pytest.raises(TypeError):
        crecords.encode_keyless(["text"], 0)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    rec=record_st,
    kind=st.sampled_from([bytes, bytearray, memoryview]),
    pairs=st.sampled_from([tuple, list]),
    none_headers=st.booleans(),
)
def test_records_byte_for_byte(rec, kind, pairs, none_headers):
    key, value, headers, td, od = rec
    key = None if key is None else kind(key)
    value = None if value is None else kind(value)
    headers = None if none_headers and not headers else [pairs((k, v)) for k, v in headers]
    assert crecords.encode_record(od, td, key, value, headers) == records_py.encode_record(od, td, key, value, headers)


@pytest.mark.parametrize(
    "args",
    [
        (0, 0, None, "text", None),  # a value that is not bytes
        (0, 0, 5, b"v", None),  # nor a key
        (0, 0, None, b"v", [(b"name", b"v")]),  # a header name that is not str
        (0, 0, None, b"v", [("name", b"v", b"extra")]),  # a header that is not a pair
        (0, 0, None, b"v", [("name", "text")]),  # a header value that is not bytes
        (0, 0, None, b"v", 5),  # headers that are not a sequence
    ],
)
def test_encode_record_refuses_what_the_reference_refuses(args):
    with pytest.raises((TypeError, ValueError, AttributeError)):
        records_py.encode_record(*args)
    with pytest.raises((TypeError, ValueError)):
        crecords.encode_record(*args)
    buf = bytearray(b"before")
    with pytest.raises((TypeError, ValueError)):
        crecords.append_record(buf, 1 << 20, *args)
    assert buf == b"before"  # nothing appended


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(record_st, max_size=8), room=st.integers(0, 2000))
def test_append_record_byte_for_byte(recs, room):
    """Records appended one by one under a byte limit: the same bytes and the same
    verdicts (size, or 0 when a record would not fit) from both codecs."""
    limit = len(b"start") + room
    ours, reference = bytearray(b"start"), bytearray(b"start")
    for key, value, headers, td, od in recs:
        got = crecords.append_record(ours, limit, od, td, key, value, headers or None)
        want = records_py.append_record(reference, limit, od, td, key, value, headers or None)
        assert got == want
        assert ours == reference
        if got:
            assert ours.endswith(encode_record(od, td, key, value, headers or None))


def test_append_record_needs_a_bytearray():
    with pytest.raises(TypeError):
        crecords.append_record(b"bytes", 100, 0, 0, None, b"v", None)


# --------------------------------------------------------------------------- check_body


def check_verdicts(body: bytes, count: int) -> list:
    """``records.check_body``'s verdict (None or CorruptRecord), compiled and reference."""
    out = []
    for codec in (records._C, None):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(records, "_C", codec)
            try:
                records.check_body(body, count)
                out.append(None)
            except CorruptRecord:
                out.append(CorruptRecord)
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(record_st, min_size=1, max_size=8))
def test_check_body_accepts_what_producers_write(recs):
    body = b"".join(encode_record(i, td, k, v, h) for i, (k, v, h, td, _) in enumerate(recs))
    assert check_verdicts(body, len(recs)) == [None, None]


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_check_body_same_verdict_as_the_reference(case):
    (body, count), edits, count_change = case
    compiled, reference = check_verdicts(apply(body, edits), max(0, count + count_change))
    assert compiled == reference


def test_check_body_refuses_offset_deltas_out_of_sequence():
    body = b"".join(encode_record(d, 0, None, b"v", []) for d in (0, 2))
    assert check_verdicts(body, 2) == [CorruptRecord, CorruptRecord]


@pytest.mark.parametrize("codec", [compression.NO_COMPRESSION, compression.LZ4, compression.ZSTD])
def test_validate_batches_refuses_records_a_consumer_could_not_read(codec):
    good = b"".join(encode_record(i, 0, None, b"v%d" % i, []) for i in range(3))
    assert len(records.validate_batches(build_batch(good, 3, 0, 0, codec), 1 << 20)) == 1
    for body, count in [
        (b"\xff" * 50, 1),  # garbage behind a sound header and CRC
        (good, 4),  # fewer records than the header counts
        (good + b"\x00", 3),  # bytes after the last record
        (b"".join(encode_record(d, 0, None, b"v", []) for d in (0, 5, 6)), 3),  # offsets 0, 5, 6
    ]:
        with pytest.raises(CorruptRecord):
            records.validate_batches(build_batch(body, count, 0, 0, codec), 1 << 20)


@pytest.mark.parametrize("codec", [compression.LZ4, compression.ZSTD])
def test_validate_batches_refuses_a_compressed_batch_that_grows_past_the_limit(codec):
    batch = build_batch(bytes(compression.MAX_DECOMPRESSED_BYTES + 1), 1, 0, 0, codec)
    assert len(batch) < 1 << 20  # within max.message.bytes
    with pytest.raises(CorruptRecord, match="decompresses to more than"):
        records.validate_batches(batch, 1 << 20)
    truncated = build_batch(compression.compress(codec, b"x" * 1000)[:-5], 1, 0, 0)
    truncated = truncated[:21] + bytes([codec]) + truncated[22:]  # the header names the codec
    with pytest.raises(CorruptRecord):
        records.validate_batches(truncated, 1 << 20)
