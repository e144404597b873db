"""Riding out faults for the fetch consumer (client/consumer.py): which errors are retried,
for how long, and with what backoff.

Two shapes of retry share one policy (``retry_timeout_ms``, 100 ms doubling to 1 s):

- ``retrying(op)``: one call (``commit``, ``committed``, a seek) retries within itself and
  raises once ``retry_timeout_ms`` has passed, its message saying for how long it tried.
- ``failed(exc)`` / ``succeeded()``: a read loop (``getmany``, iteration, the prefetch) counts
  consecutive failures across its turns; the error surfaces only once failures have lasted
  ``retry_timeout_ms``.  "broker unavailable" is a warning at most every ``WARN_EVERY_S``.

Nothing is retried once the consumer is closing (``closing``): the final commit gets one
attempt.  An unknown topic is never retried: a consumer fails fast on a name that does not
exist.  Concurrency: event loop only (the consumer's loop).
"""

from __future__ import annotations

import asyncio
import logging
import time

from sluice import errors

log = logging.getLogger("sluice.client.consumer")

WARN_EVERY_S = 10.0  # "broker unavailable" warnings of a consumer, at most one per this
_BACKOFF, _BACKOFF_MAX = 0.1, 1.0  # seconds between retries of a failing broker


def backoff(attempt: int) -> float:
    """The wait before retry ``attempt`` (0, 1, ...): 100 ms doubling to 1 s."""
    return min(_BACKOFF * 2 ** min(attempt, 10), _BACKOFF_MAX)


class Retries:
    """The retry policy and the read loop's failure episode of one consumer."""

    def __init__(self, retry_timeout: float) -> None:
        """``retry_timeout``: seconds of failing attempts before an error surfaces."""
        self.retry_timeout = retry_timeout
        self.closing = False  # set by Consumer.close(): no retries from then on
        self._failing_since: float | None = None  # first retriable failure of a read loop
        self._failures = 0  # consecutive retriable failures (backoff)
        self._warned_at = -WARN_EVERY_S  # when "broker unavailable" was last a warning

    def can_retry(self, exc: errors.SluiceError) -> bool:
        """Worth retrying: the broker may answer differently later.  An unknown topic is
        not (a consumer fails fast on a name that does not exist)."""
        return exc.retriable and not isinstance(exc, errors.UnknownTopic) and not self.closing

    def _gave_up(self, exc: errors.SluiceError, since: float) -> errors.SluiceError:
        waited = time.monotonic() - since
        return errors.annotated(
            exc, f"(still failing after {waited:.1f} s of retries; retry_timeout_ms="
            f"{self.retry_timeout * 1000:g})"
        )

    async def retrying(self, op):
        """``await op()``, retrying retriable errors with backoff for ``retry_timeout_ms``."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return await op()
            except errors.SluiceError as exc:
                if not self.can_retry(exc):
                    raise
                delay = backoff(attempt)
                attempt += 1
                if time.monotonic() + delay - started > self.retry_timeout:
                    raise self._gave_up(exc, started) from exc
                log.info("retrying in %.1f s: %s", delay, exc)
                await asyncio.sleep(delay)

    def failed(self, exc: errors.SluiceError) -> float:
        """A read loop's request failed retriably: return the backoff before the next try,
        or raise the error once failures have lasted ``retry_timeout_ms``."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            # once per episode, and at most every WARN_EVERY_S: with one leader down, the
            # fetches of the others succeed between failures and would start a new one each
            quiet = now - self._warned_at < WARN_EVERY_S
            self._warned_at = self._warned_at if quiet else now
            (log.info if quiet else log.warning)(
                "broker unavailable, retrying for up to %g s: %s", self.retry_timeout, exc
            )
        elif now - self._failing_since > self.retry_timeout:
            since, self._failing_since, self._failures = self._failing_since, None, 0
            raise self._gave_up(exc, since) from exc
        self._failures += 1
        return backoff(self._failures - 1)

    def succeeded(self) -> None:
        """A read loop's request succeeded: the failure episode (if any) is over."""
        if self._failing_since is not None:
            log.debug("broker available again")
        self._failing_since = None
        self._failures = 0
