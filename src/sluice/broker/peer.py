"""The peer of a request: who sent it, and the way back to it.

Every handler is called as ``handler(request, attachments, peer)``.  The server connection
(server/connection.py ``Connection``) is the peer of the Sluice protocol's requests; a
second front door passes its own, and in-process callers (the broker writing to itself,
tests) pass ``LOCAL``.

Handlers use the peer to record who did what (``address``: a group commit's client) and to
tie state to the connection (a registered producer, a subscription's session): they push
to it unasked (``push``, while ``writable``; ``on_writable`` says when to resume) and drop
that state when it goes (``on_close``, ``closed``).  Event loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Peer(Protocol):
    """What a handler may use of the peer of its request."""

    @property
    def address(self) -> str:
        """``host:port`` of the client, ``""`` for an in-process caller."""
        ...

    @property
    def closed(self) -> bool:
        """True once the peer is gone (pushes are dropped, ``on_close`` callbacks ran)."""
        ...

    @property
    def writable(self) -> bool:
        """False while pushes should wait (a full write buffer) or the peer is going."""
        ...

    def push(self, key: int, version: int, message, attachments=()) -> bool:
        """Send a server push (a ``messages.PUSHES`` struct and its attachments); False when
        nothing was sent (the peer is going)."""
        ...

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the peer goes (at once if it is gone)."""
        ...

    def on_writable(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, the next time a full write buffer drains."""
        ...


class LocalPeer:
    """The peer of an in-process call: no address, never closes, takes no pushes."""

    address = ""
    closed = False
    writable = True

    def push(self, key: int, version: int, message, attachments=()) -> bool:
        return False

    def on_close(self, callback: Callable[[], None]) -> None:
        pass  # it never closes

    def on_writable(self, callback: Callable[[], None]) -> None:
        pass  # it is always writable


LOCAL: Peer = LocalPeer()
