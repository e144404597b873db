"""Parameter parsing shared by the ``sluice`` commands."""

from __future__ import annotations

from datetime import UTC, datetime

import click


def key_values(items: tuple[str, ...], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items of a repeatable option as a dict; ``BadParameter`` otherwise."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=option)
        out[key.strip()] = value.strip()
    return out


def iso_time(value: str, option: str) -> datetime:
    """An ISO-8601 time (``2026-11-22T10:00:00``, ``…+01:00``, ``…Z``); without a zone it is
    UTC.  ``BadParameter`` naming ``option`` otherwise."""
    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected an ISO-8601 time such as 2026-11-22T10:00:00 (UTC unless a zone is given), got {value!r}",
            param_hint=option,
        ) from None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
