"""Output shared by the ``sluice`` command modules: tables on a terminal, plain lines or
JSON when piped, protocol structs as plain data, times as ISO-8601; and how ``sluice
consume`` writes records, one ``Record -> bytes`` function per output mode.

Consume's modes and what they do to bytes:

- text (default): the value, then the delimiter (a newline unless ``--delimiter`` says
  otherwise).  Bytes that are not UTF-8 are written as ``\\xNN`` escapes, so the output
  is readable but not byte-exact.
- raw (``--raw``): the value's bytes exactly as stored, then the delimiter (newline unless
  ``--delimiter`` says otherwise; it may be empty).
- format (``--format``): a kcat-like template; keys and values are inserted byte-exact.
- JSON (``--json``): one object per record; keys and values that are not UTF-8 are base64
  with a ``*_encoding`` field.

``--print-keys`` puts the key and ``--key-separator`` before the value in text and raw mode
(a record without a key prints an empty key).
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime

import click
import msgspec


def is_tty() -> bool:
    return sys.stdout.isatty()


def wants_json(flag: bool) -> bool:
    """JSON when asked for, or when stdout is not a terminal."""
    return flag or not is_tty()


def plain(obj):
    """A protocol struct as plain data, every field included (the wire omits defaults)."""
    if isinstance(obj, msgspec.Struct):
        return {k: plain(v) for k, v in msgspec.structs.asdict(obj).items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj


def echo_json(obj) -> None:
    click.echo(json.dumps(plain(obj)))


def table(title: str, columns: list[str], rows: list[list]) -> None:
    """A table on a terminal; tab-separated lines without the title when piped."""
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*(str(x) for x in r))
        Console().print(t)
    else:
        for r in rows:
            click.echo("\t".join(str(x) for x in r))


def or_dash(n: int | None) -> str | int:
    """A count or offset for a table: ``-`` when unknown (None or negative)."""
    return "-" if n is None or n < 0 else n


def node_list(nodes) -> str:
    """Broker node ids for a table: ``1,2,3``; ``-`` for none."""
    return ",".join(map(str, nodes)) or "-"


def iso_ms(ms: int) -> str:
    """ms since the epoch as UTC ISO-8601 (milliseconds); ``-`` for an unknown (negative) time."""
    if ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------- consumed records

Formatter = Callable[[object], bytes]

FORMAT_HELP = (
    "%t topic, %p partition, %o offset, %k key, %v value (%s too), %h headers (k=v,k=v), "
    "%T timestamp (ms since the epoch), %% a percent sign; \\n \\t \\r \\0 \\xHH escapes"
)


def _text(data: bytes | None) -> bytes:
    """UTF-8 text as is; other bytes as ``\\xNN`` escapes; None as nothing."""
    if data is None:
        return b""
    return data.decode("utf-8", "backslashreplace").encode()


def _headers(rec) -> bytes:
    return b",".join(k.encode() + b"=" + (v if v is not None else b"") for k, v in rec.headers)


_FIELDS: dict[str, Callable[[object], bytes]] = {
    "t": lambda r: r.topic.encode(),
    "p": lambda r: b"%d" % r.partition,
    "o": lambda r: b"%d" % r.offset,
    "k": lambda r: r.key or b"",
    "v": lambda r: r.value or b"",
    "s": lambda r: r.value or b"",
    "h": _headers,
    "T": lambda r: b"%d" % r.timestamp,
}
_DIRECTIVE = re.compile(r"%(.?)", re.DOTALL)


def template(fmt: bytes) -> Formatter:
    """A ``--format`` template (escapes already resolved) -> formatter; ``ValueError`` for
    an unknown ``%`` directive."""
    text = fmt.decode("latin-1")  # byte for byte: literal parts go back out unchanged
    parts: list[bytes | Callable] = []
    pos = 0
    for m in _DIRECTIVE.finditer(text):
        parts.append(text[pos : m.start()].encode("latin-1"))
        code = m.group(1)
        if code == "%":
            parts.append(b"%")
        elif code in _FIELDS:
            parts.append(_FIELDS[code])
        else:
            raise ValueError(f"unknown directive '%{code}' ({FORMAT_HELP})")
        pos = m.end()
    parts.append(text[pos:].encode("latin-1"))
    parts = [p for p in parts if p != b""]

    def render(rec) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p(rec) for p in parts)

    return render


def _text_or_b64(data: bytes | None, field: str) -> dict:
    if data is None:
        return {field: None}
    try:
        return {field: data.decode()}
    except UnicodeDecodeError:
        return {field: base64.b64encode(data).decode(), f"{field}_encoding": "base64"}


def record_json(rec) -> str:
    """One consumed record as a JSON object (text fields when UTF-8, else base64)."""
    obj = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp}
    obj.update(_text_or_b64(rec.key, "key"))
    obj.update(_text_or_b64(rec.value, "value"))
    obj["headers"] = {
        k: (None if v is None else v.decode("utf-8", "backslashreplace")) for k, v in rec.headers
    }
    return json.dumps(obj, ensure_ascii=False)


def formatter(
    *, as_json: bool, raw: bool, fmt: bytes | None, print_keys: bool, delimiter: bytes, key_separator: bytes
) -> Formatter:
    """The ``Record -> bytes`` function of the options given (checked by the caller:
    ``--json``, ``--raw`` and ``--format`` exclude each other)."""
    if as_json:
        return lambda rec: record_json(rec).encode() + b"\n"
    if fmt is not None:
        return template(fmt)
    field = (lambda d: d or b"") if raw else _text
    if print_keys:
        return lambda rec: field(rec.key) + key_separator + field(rec.value) + delimiter
    return lambda rec: field(rec.value) + delimiter
