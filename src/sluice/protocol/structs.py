"""The base of every protocol struct (messages.py and the modules of its API families)."""

from __future__ import annotations

import msgspec


class Struct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every protocol struct."""


class Response(Struct):
    error: int = 0
    message: str = ""
