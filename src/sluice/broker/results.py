"""Per-item results of the handlers: the fields a failed item carries."""

from __future__ import annotations

from sluice.errors import BrokerError


def error_fields(exc: BrokerError) -> dict:
    """The ``error`` and ``message`` fields of a result that failed with ``exc``."""
    return {"error": exc.code, "message": exc.message}
