"""Produce-request bytes for the broker unit tests."""

from __future__ import annotations

from sluice.protocol.records import build_batch, encode_keyless_records, validate_batches

BIG = 1 << 30  # a max.message.bytes no test batch reaches


def request(values: list[bytes]) -> tuple[bytearray, list]:
    """One keyless batch of ``values`` and its validated spans, as a produce hands them over."""
    data = bytearray(build_batch(encode_keyless_records(values), len(values), 1_000, 1_000))
    return data, validate_batches(data, BIG)
