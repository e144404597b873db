"""Output shared by the ``sluice`` command modules, and how ``sluice consume`` writes
records, one ``Record -> bytes`` function per output mode.

The output contract of every command that prints data (``data_options``): ``--output
table`` (the default on a terminal), ``--output json`` (``--json``; the default when
piped: one JSON value, or one object per line for streams) and ``--output plain``
(tab-separated rows, no title: for ``cut`` and ``awk``).  Protocol structs print as plain
data, times as ISO-8601 UTC.

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
import functools
import io
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime

import click
import msgspec

SHORT_CELL = 21  # a cell up to this long (an offset, an address) is never cut in a table
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:\d\d)?")  # nor is a time (iso_ms)

MODES = ("table", "json", "plain")
_MODE = "sluice.output"  # key of the chosen mode in the click context's meta


def is_tty() -> bool:
    return sys.stdout is not None and sys.stdout.isatty()


def stdout_bytes():
    """Standard output for bytes; a usage error when the command was started without one."""
    if sys.stdout is None:
        from sluice.errors import UsageError

        raise UsageError("standard output is closed: redirect it (to /dev/null to discard the messages)")
    return sys.stdout.buffer


def wants_json(flag: bool) -> bool:
    """JSON when asked for, or when stdout is not a terminal and no other mode was chosen."""
    return flag or (mode() is None and not is_tty())


def mode() -> str | None:
    """The output mode ``data_options`` chose for the running command (None outside one)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_MODE) if ctx is not None else None


def resolve_mode(as_json: bool, chosen: str | None) -> str:
    """``--output`` if given (``--json`` is ``--output json``: the two may not disagree),
    else a table on a terminal and JSON when piped."""
    if as_json and chosen not in (None, "json"):
        raise click.UsageError(f"--json and --output {chosen} cannot be used together")
    if chosen is not None:
        return chosen
    return "json" if as_json or not is_tty() else "table"


def data_options(fn):
    """``--json`` and ``-o/--output table|json|plain`` for a command that prints data.

    The command receives ``as_json`` (whether to print JSON) resolved by ``resolve_mode``;
    ``table`` prints a table or plain rows as that mode says.  Place it below the other
    options, above ``click.pass_context``."""

    @functools.wraps(fn)
    def command(*args, as_json: bool, output_mode: str | None, **kw):
        chosen = resolve_mode(as_json, output_mode)
        click.get_current_context().meta[_MODE] = chosen
        return fn(*args, as_json=chosen == "json", **kw)

    command = click.option(
        "-o", "--output", "output_mode", type=click.Choice(MODES), default=None,
        help="table (the default on a terminal), json (the default when piped) or plain "
             "(tab-separated rows, no title).",
    )(command)
    return click.option("--json", "as_json", is_flag=True, help="Print JSON: the same as --output json.")(command)


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
    """A table in ``table`` mode (outside ``data_options``: on a terminal); tab-separated
    lines without the title in ``plain`` mode (and when piped).

    On a terminal too narrow for it, headers wrap between words (or after a hyphen) and a
    short cell (a number, a name) stays whole: each column is at least as wide as both,
    and the space left goes to the columns with longer cells, which wrap.  When those
    widths do not fit boxed columns, the table drops its box, then its padding, then lets
    short cells wrap too; only when headers fit no way are they cut."""
    if mode() == "table" or (mode() is None and is_tty()):
        from rich import box
        from rich.console import Console
        from rich.table import Table

        cells = [[str(x) for x in r] for r in rows]
        console = Console()

        def build(style: dict, headers: list[str], widths: list[int] | None) -> Table:
            t = Table(title=title, **style)
            for i, c in enumerate(headers):
                t.add_column(c, width=widths and widths[i], overflow="fold")
            for r in cells:
                t.add_row(*r)
            return t

        natural = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
        boxed = dict(box=box.HEAVY_HEAD)
        if _table_chrome(boxed, len(columns)) + sum(natural) <= console.width:
            console.print(build(boxed, columns, None))
            return
        header_mins = [max(len(w) for w in _header_words(c)) for c in columns]
        mins = [max([h] + [len(r[i]) for r in cells if _short(r[i])]) for i, h in enumerate(header_mins)]
        narrow = dict(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        tight = {**narrow, "padding": 0}
        for style, least in ((boxed, mins), (narrow, mins), (tight, mins), (tight, header_mins)):
            room = console.width - _table_chrome(style, len(columns))
            if sum(least) <= room:
                widths = _share(least, natural, room)
                headers = [_wrap_header(c, w) for c, w in zip(columns, widths, strict=True)]
                console.print(build(style, headers, widths))
                return
        console.print(build(boxed, columns, None))
    else:
        for r in rows:
            click.echo("\t".join(str(x) for x in r))


def _short(cell: str) -> bool:
    """A cell a table keeps on one line: a short one, or a time."""
    return len(cell) <= SHORT_CELL or _TIMESTAMP.fullmatch(cell) is not None


def _share(least: list[int], wanted: list[int], room: int) -> list[int]:
    """Column widths of at least ``least`` and at most ``wanted`` (unless ``least`` is
    more), summing to at most ``room``: what is left over ``least`` goes to the columns
    that want more, in equal shares (a column wanting less than its share gives the rest
    back)."""
    widths = list(least)
    left = room - sum(widths)
    while left > 0:
        short = [i for i, w in enumerate(widths) if w < wanted[i]]
        if not short:
            break
        share = max(left // len(short), 1)
        for i in short:
            more = min(share, wanted[i] - widths[i], left)
            widths[i] += more
            left -= more
    return widths


def _header_words(header: str) -> list[str]:
    """The pieces a header may wrap between: its words, a hyphenated word after a hyphen."""
    return [w for w in re.split(r"\s+|(?<=-)", header) if w]


def _wrap_header(header: str, width: int) -> str:
    """``header`` on lines of at most ``width`` (no piece is longer), broken between pieces."""
    lines: list[str] = []
    for word in header.split():
        for piece in _header_words(word):
            joiner = "" if lines and lines[-1].endswith("-") else " "
            if lines and len(lines[-1]) + len(joiner) + len(piece) <= width:
                lines[-1] += joiner + piece
            else:
                lines.append(piece)
    return "\n".join(lines)


def _table_chrome(style: dict, n: int) -> int:
    """Columns of borders and padding a rich table of ``n`` columns in ``style`` adds."""
    from rich.console import Console
    from rich.table import Table

    t = Table(show_header=False, **style)
    for _ in range(n):
        t.add_column(width=1)
    t.add_row(*"x" * n)
    out = io.StringIO()
    Console(file=out, width=10 * n + 10, color_system=None).print(t)
    return max(len(line) for line in out.getvalue().splitlines()) - n


def or_dash(n: int | None) -> str | int:
    """A count or offset for a table: ``-`` when unknown (None or negative)."""
    return "-" if n is None or n < 0 else n


def node_list(nodes) -> str:
    """Broker node ids for a table: ``1,2,3``; ``-`` for none."""
    return ",".join(map(str, nodes)) or "-"


def iso_ms(ms: int) -> str:
    """ms since the epoch as UTC ISO-8601 (milliseconds, ``Z``); ``-`` for an unknown (negative) time."""
    if ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
    """One consumed record as a JSON object (text fields when UTF-8, else base64).  Headers
    are an object of key -> value; a key the record carries more than once maps to the list
    of its values, in order."""
    obj = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp}
    obj.update(_text_or_b64(rec.key, "key"))
    obj.update(_text_or_b64(rec.value, "value"))
    headers: dict = {}
    for k, v in rec.headers:
        text = None if v is None else v.decode("utf-8", "backslashreplace")
        if k not in headers:
            headers[k] = text
        elif isinstance(headers[k], list):  # a value is text or None: a list is of repeats
            headers[k].append(text)
        else:
            headers[k] = [headers[k], text]
    obj["headers"] = headers
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
