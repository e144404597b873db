"""Record sizes for the producer: exact encoded sizes of a record, as
``protocol.records.encode_record`` writes it, and the callback sink of
``Producer.send_nowait``.  Pure functions and one small class; no asyncio.
"""

from __future__ import annotations

import logging

log = logging.getLogger("sluice.client.producer")


def zz_len(n: int) -> int:
    """Bytes of the zig-zag varint of ``n`` (``records.encode_varint``)."""
    u = n << 1 if n >= 0 else (~n << 1) | 1
    return (u.bit_length() + 6) // 7 or 1


def tail_size(key: bytes | None, value: bytes | None, headers) -> int:
    """Exact bytes of an encoded record after its offset delta: key, value, headers.

    Mirrors ``records.encode_record``; ``record_size`` adds the framing around it.
    """
    n = 1 if key is None else zz_len(len(key)) + len(key)
    n += 1 if value is None else zz_len(len(value)) + len(value)
    if headers:
        n += zz_len(len(headers))
        for hk, hv in headers:
            kl = len(hk.encode())
            n += zz_len(kl) + kl + (1 if hv is None else zz_len(len(hv)) + len(hv))
    else:
        n += 1
    return n


def record_size(tail: int, timestamp_delta: int, offset_delta: int) -> int:
    """Exact ``len(records.encode_record(offset_delta, timestamp_delta, ...))``."""
    body = 1 + zz_len(timestamp_delta) + zz_len(offset_delta) + tail
    return zz_len(body) + body


class Callback:
    """A record's outcome handed to ``callback(metadata, error)`` (``send_nowait``): the
    sink interface of ``Batch`` (``done``, ``set_result``, ``set_exception``)."""

    __slots__ = ("callback", "called")

    def __init__(self, callback) -> None:
        self.callback = callback
        self.called = False

    def done(self) -> bool:
        return self.called

    def set_result(self, metadata) -> None:
        self.called = True
        self._call(metadata, None)

    def set_exception(self, exc: BaseException) -> None:
        self.called = True
        self._call(None, exc)

    def _call(self, metadata, exc) -> None:
        try:
            self.callback(metadata, exc)
        except Exception:
            log.exception("send_nowait callback %r raised", self.callback)
