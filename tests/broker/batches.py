"""Produce-request bytes for the broker unit tests."""

from __future__ import annotations

from sluice.protocol.records import build_batch, encode_keyless_records, validate_batches

BIG = 1 << 30  # a max.message.bytes no test batch reaches


def request(values: list[bytes]) -> tuple[bytearray, list]:
    """One keyless batch of ``values`` and its validated spans, as a produce hands them over."""
    data = bytearray(build_batch(encode_keyless_records(values), len(values), 1_000, 1_000))
    return data, validate_batches(data, BIG)


def idempotent(values: list[bytes], pid: int, seq: int, epoch: int = 0) -> bytes:
    """One keyless batch of ``values`` from idempotent producer ``pid`` at sequence ``seq``."""
    return build_batch(encode_keyless_records(values), len(values), 1_000, 1_000, 0, pid, epoch, seq)


def request_of(*batches: bytes) -> tuple[bytearray, list]:
    """Concatenated batches and their validated spans, as a produce hands them over."""
    data = bytearray(b"".join(batches))
    return data, validate_batches(data, BIG)
