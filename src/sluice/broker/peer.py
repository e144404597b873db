"""The client address (and connection) of the request being handled, for handlers that
record who did what, or that tie state to the connection (REGISTER_PRODUCER).

The server connection sets it in each request's own task (a ``ContextVar`` is per task, so
concurrent requests never see each other's); handlers read it.  ``""`` outside a request,
e.g. when a test calls a handler directly.
"""

from __future__ import annotations

from contextvars import ContextVar

client_address: ContextVar[str] = ContextVar("sluice_client_address", default="")
# The server connection the request came on (server/connection.py ``Connection``: ``push``,
# ``on_close``, ``closed``); None outside a request.
current_connection: ContextVar[object | None] = ContextVar("sluice_connection", default=None)
