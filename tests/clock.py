"""Wall-clock helpers of the tests that select messages by their timestamps."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta


def millisecond_after_now() -> datetime:
    """A time on a millisecond boundary after every broker timestamp given so far, once the
    clock has passed it: messages written from now on are stamped at or after it."""
    cut_ms = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= cut_ms:
        pass
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=cut_ms)
