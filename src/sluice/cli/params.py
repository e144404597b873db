"""Parameter parsing shared by the ``sluice`` commands.

Every parser here refuses bad input with ``click.BadParameter`` (a usage error: one line,
exit status 2) before anything is sent to a broker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

import click

from sluice.protocol.subscriptions import TAG_HEADER

RESERVED_HEADER_PREFIX = "sluice."  # headers the brokers and clients set and act on

MAX_OFFSET = 2**63 - 1  # offsets are signed 64-bit integers on the wire
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def key_values(items: tuple[str, ...], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items of a repeatable option as a dict; ``BadParameter`` otherwise, and
    for a key given twice."""
    out = {}
    for key, value in _pairs(items, option):
        if key in out:
            raise click.BadParameter(f"{key} is given twice ({out[key]!r}, {value!r})", param_hint=option)
        out[key] = value
    return out


def header_pairs(items: tuple[str, ...], option: str = "--header") -> list[tuple[str, bytes]]:
    """``KEY=VALUE`` headers in the order given, a key given twice kept twice (a record may
    carry a header more than once); ``BadParameter`` for a malformed one, or one in the
    ``sluice.`` namespace, whose headers the brokers and clients set and act on."""
    out = []
    for key, value in _pairs(items, option):
        if key.startswith(RESERVED_HEADER_PREFIX):
            hint = ": give --tag" if key == TAG_HEADER else ""
            raise click.BadParameter(
                f"headers starting with {RESERVED_HEADER_PREFIX!r} are set by Sluice itself, not {key!r}{hint}",
                param_hint=option,
            )
        out.append((key, value.encode()))
    return out


def _pairs(items: tuple[str, ...], option: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=option)
        out.append((key.strip(), value.strip()))
    return out


class Checked(click.ParamType):
    """A value ``check(value)`` accepts (raising one of ``refusals`` otherwise: a usage
    error with its message), kept as given."""

    def __init__(self, name: str, check: Callable[[str], object], *refusals: type[Exception]) -> None:
        self.name, self.check, self.refusals = name, check, refusals

    def convert(self, value, param, ctx):
        try:
            self.check(value)
        except self.refusals as exc:
            self.fail(str(exc), param, ctx)
        return value


def _check_bootstrap(value: str) -> None:
    from sluice.client.addresses import parse_bootstrap  # not at import: the CLI starts fast

    parse_bootstrap(value)


class Bootstrap(Checked):
    """``HOST[:PORT][,HOST[:PORT]...]``, checked now (ports 1-65535, default 7400); the
    value stays the string the clients take."""

    def __init__(self) -> None:
        from sluice.errors import ConfigError

        super().__init__("HOST:PORT", _check_bootstrap, ConfigError)


class Start(NamedTuple):
    """Where ``consume --from`` starts: ``kind`` is earliest, latest, offset or time
    (``arg`` the offset, or the time in ms since the epoch)."""

    kind: str
    arg: int | None = None


_OFFSET = re.compile(r"[+-]?[0-9]+")
_MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)


class StartPosition(click.ParamType):
    """``earliest``, ``latest``, an offset (0 to 2**63-1) or an ISO-8601 time (from
    1970; without a zone it is UTC) -> ``Start``."""

    name = "earliest|latest|OFFSET|ISO-TIME"

    def convert(self, value, param, ctx):
        if isinstance(value, Start):
            return value
        v = value.strip()
        if v.lower() in ("earliest", "latest"):
            return Start(v.lower())
        if _OFFSET.fullmatch(v):
            n = int(v)
            if not 0 <= n <= MAX_OFFSET:
                self.fail(f"offset {v} is out of range: offsets are 0 to {MAX_OFFSET}", param, ctx)
            return Start("offset", n)
        try:
            when = _parse_time(v)
        except _TooEarly as exc:
            self.fail(str(exc), param, ctx)
        except ValueError:
            self.fail(f"expected earliest, latest, an offset or an ISO-8601 time, got {value!r}", param, ctx)
        return Start("time", int(when.timestamp() * 1000))


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.|$)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\"}


def unescape(text: str) -> bytes:
    """``\\n \\t \\r \\0 \\\\ \\xHH`` in ``text`` -> bytes (other characters as UTF-8);
    ``ValueError`` for any other escape."""

    def one(m: re.Match) -> str:
        code = m.group(1)
        if code.startswith("x") and len(code) == 3:
            return chr(int(code[1:], 16))  # a byte: latin-1 below
        if code in _ESCAPES:
            return _ESCAPES[code]
        raise ValueError(f"unknown escape '\\{code}' (use \\n \\t \\r \\0 \\\\ or \\xHH)")

    # \xHH must give the byte HH, so escapes become latin-1 characters and the rest UTF-8
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        out += text[pos : m.start()].encode("utf-8", "surrogateescape")
        out += one(m).encode("latin-1")
        pos = m.end()
    out += text[pos:].encode("utf-8", "surrogateescape")
    return bytes(out)


class Escaped(click.ParamType):
    """A separator with backslash escapes (``\\n``, ``\\t``, ``\\0``, ``\\xHH``) -> bytes."""

    name = "SEP"

    def __init__(self, allow_empty: bool = False) -> None:
        self.allow_empty = allow_empty

    def convert(self, value, param, ctx):
        if isinstance(value, bytes):
            return value
        try:
            out = unescape(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not out and not self.allow_empty:
            self.fail("must not be empty", param, ctx)
        return out


def iso_time(value: str, option: str) -> datetime:
    """An ISO-8601 time (``2026-11-22T10:00:00``, ``…+01:00``, ``…Z``) from 1970 on; without
    a zone it is UTC.  ``BadParameter`` naming ``option`` otherwise."""
    try:
        return _parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


class _TooEarly(ValueError):
    """A well-formed time before the epoch: negative ms mean "latest" / "earliest" on the wire."""


def _parse_time(value: str) -> datetime:
    """``iso_time`` without the option: ``ValueError`` (``_TooEarly``) saying what is wrong."""
    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"expected an ISO-8601 time such as 2026-11-22T10:00:00 (UTC unless a zone is given), got {value!r}"
        ) from None
    dt = dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
    if dt < _MIN_TIME:
        raise _TooEarly(f"time {value!r} is before 1970-01-01T00:00:00Z")
    return dt
