"""Output shared by the ``sluice`` command modules: tables on a terminal, plain lines or
JSON when piped, protocol structs as plain data, times as ISO-8601."""

from __future__ import annotations

import json
import sys
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


def iso_ms(ms: int) -> str:
    """ms since the epoch as UTC ISO-8601 (milliseconds); ``-`` for an unknown (negative) time."""
    if ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
