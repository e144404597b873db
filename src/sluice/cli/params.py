"""Parameter parsing shared by the ``sluice`` commands."""

from __future__ import annotations

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
