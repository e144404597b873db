"""Broker addresses as users write them: ``host:port`` lists, IPv6 in brackets, the default
port.  Pure parsing: no sockets, no asyncio.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from sluice import errors

DEFAULT_PORT = 7400  # what `sluice serve` listens on


def parse_bootstrap(bootstrap: str | Iterable[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` or a list of ``"host:port"`` -> addresses; ``ConfigError``.

    The port defaults to ``DEFAULT_PORT`` and must be 1-65535; an IPv6 address takes
    brackets when it has a port (``[::1]:7400``).
    """
    items = bootstrap.split(",") if isinstance(bootstrap, str) else None
    if items is None and isinstance(bootstrap, Iterable) and not isinstance(bootstrap, bytes | bytearray):
        items = list(bootstrap)
    if items is None or not all(isinstance(item, str) for item in items):
        raise errors.ConfigError(f"bootstrap must be 'host:port[,host:port...]' or a list of them, got {bootstrap!r}")
    out = [_parse_address(item.strip()) for item in items if item.strip()]
    if not out:
        raise errors.ConfigError("bootstrap must name at least one host:port")
    return out


def _parse_address(item: str) -> tuple[str, int]:
    """One ``host[:port]``, ``[v6]:port`` or bare IPv6 address -> ``(host, port)``."""
    if "/" in item or "@" in item:
        raise errors.ConfigError(f"bad bootstrap address {item!r}: expected host:port, not a URL")
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise errors.ConfigError(f"bad bootstrap address {item!r}: expected [IPv6]:port")
        port = rest[1:] if rest else str(DEFAULT_PORT)
    elif item.count(":") > 1:  # a bare IPv6 address: no port
        host, port = item, str(DEFAULT_PORT)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise errors.ConfigError(
                f"bad bootstrap address {item!r}: neither host:port nor an IPv6 address"
            ) from None
    else:
        host, sep, port = item.partition(":")
        if not sep:
            port = str(DEFAULT_PORT)
    if not port.isascii() or not port.isdigit():
        raise errors.ConfigError(f"bad bootstrap address {item!r}: port {port!r} is not a number")
    if not 1 <= int(port) <= 65535:
        raise errors.ConfigError(f"bad bootstrap address {item!r}: port {port} is not in 1-65535")
    return host or "localhost", int(port)
