"""The client address of the request being handled, for handlers that record who did what.

The server connection sets it in each request's own task (a ``ContextVar`` is per task, so
concurrent requests never see each other's); handlers read it.  ``""`` outside a request,
e.g. when a test calls a handler directly.
"""

from __future__ import annotations

from contextvars import ContextVar

client_address: ContextVar[str] = ContextVar("sluice_client_address", default="")
