"""What a send was given: a clear ``TypeError`` naming the argument of the wrong type.

The producer's common path checks nothing up front; an argument of the wrong type fails
deep in the encoding (``object of type 'int' has no len()``).  Only then, after a send
failed, ``clarified`` looks at what it was given and names the argument instead, so a
correct send pays nothing for the check.
"""

from __future__ import annotations

from sluice import errors

_BYTES = (bytes, bytearray, memoryview)


def _kind(value) -> str:
    return type(value).__name__


def argument_error(topic, value, key, headers, partition, timestamp_ms) -> TypeError | None:
    """A ``TypeError`` naming the first argument of a send that is not of its type, or
    None when they all are."""
    if not isinstance(topic, str):
        return TypeError(f"topic must be a str, not {_kind(topic)}")
    for name, v in (("value", value), ("key", key)):
        if v is not None and not isinstance(v, _BYTES):
            return TypeError(f"record {name} must be bytes or None, not {_kind(v)}")
    for name, v in (("partition", partition), ("timestamp_ms", timestamp_ms)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            return TypeError(f"{name} must be an int or None, not {_kind(v)}")
    if headers is not None:
        if isinstance(headers, dict | str | bytes) or not hasattr(headers, "__iter__") or not all(
            isinstance(h, tuple | list) and len(h) == 2 for h in headers
        ):
            return TypeError(f"headers must be a list of (name, value) pairs, not {headers!r:.80}")
        for name, v in headers:
            if not isinstance(name, str) or not (v is None or isinstance(v, _BYTES)):
                return TypeError(f"a header is a (str, bytes or None) pair, not ({_kind(name)}, {_kind(v)})")
    return None


def check_partition(partition) -> None:
    """``TypeError`` unless ``partition`` is None or an int (not a bool, not a float that
    compares equal to one: it would be stored as ``partition=0.0``, or wait for ever)."""
    if partition is not None and (type(partition) is not int):
        raise TypeError(f"partition must be an int or None, not {_kind(partition)}")


def clarified(exc: BaseException, topic, value, key=None, headers=None, partition=None, timestamp_ms=None):
    """``exc``, or the clearer ``argument_error`` when ``exc`` is a plain ``TypeError`` /
    ``ValueError`` of a send given an argument of the wrong type."""
    if isinstance(exc, TypeError | ValueError | AttributeError) and not isinstance(exc, errors.SluiceError):
        better = argument_error(topic, value, key, headers, partition, timestamp_ms)
        if better is not None:
            return better
    return exc


def values_error(values) -> TypeError | None:
    """A ``TypeError`` naming the first of a bulk send's ``values`` that is not bytes."""
    if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        return TypeError(f"values must be a list of bytes, not {_kind(values)}")
    for i, v in enumerate(values):
        if not isinstance(v, _BYTES):
            return TypeError(f"values[{i}] must be bytes, not {_kind(v)}")
    return None
