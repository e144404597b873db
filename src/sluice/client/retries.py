"""Retries of the producer's sender: a batch that failed, or only follows one that did, goes
back to the front of its partition's queue in drain order (DESIGN §4).

A *counted* retry (a failed attempt) waits a backoff that grows with the partition's
consecutive failures up to ``retry_backoff_max_ms``, counts toward ``retries`` and steers
keyless records elsewhere a while; an uncounted one (a batch behind an earlier retry, one
given up to a new leader, one never written) does not.  A batch past its delivery deadline
fails here instead of going back.

Concurrency: the producer's loop only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from sluice.client.accumulator import Batch
from sluice.client.flights import TP, InFlight
from sluice.client.identity import backoff_delay
from sluice.client.leaders import Leaders
from sluice.client.state import ProducerState


class Retries:
    """Requeues the sender's batches (module docstring).

    Collaborators: the producer's shared ``state`` (settings, accumulator), the sender's
    ``in_flight`` bookkeeping (backoffs and failure counts live there), ``leaders`` (a
    failure may call for fresh metadata, and says so in a warning), ``release(batch)`` and
    the partitioner's ``partition_refused(topic, partition, error)``.
    """

    def __init__(
        self,
        state: ProducerState,
        in_flight: InFlight,
        leaders: Leaders,
        *,
        release: Callable[[Batch], None],
        partition_refused: Callable[[str, int, BaseException], None],
    ) -> None:
        config = state.config
        self.retries = config.retries
        self.backoff = config.retry_backoff_ms / 1000
        self.backoff_max = config.retry_backoff_max_ms / 1000
        self.delivery_timeout = config.delivery_timeout_ms / 1000
        self._acc = state.accumulator
        self._in_flight = in_flight
        self._leaders = leaders
        self._release = release
        self._partition_refused = partition_refused

    def retry(self, tp: TP, bs: list[Batch], exc: Exception, counted: bool = True) -> None:
        """Requeue the unfinished batches of ``bs`` at the front of their partition, merged
        in drain order with retries queued already (ahead of every batch not drained yet).

        A ``counted`` retry (a failed attempt) waits a backoff that grows with the
        partition's consecutive failures up to ``retry_backoff_max_ms``, whatever the
        deadlines, and counts toward ``retries``; ``expire`` fails what reaches its deadline
        meanwhile.  An uncounted one (a batch that only follows an earlier retry) does not."""
        now = time.monotonic()
        self._leaders.on_failure(tp, exc)
        if counted:
            self._leaders.warn_retrying(tp, exc, now)
            self._partition_refused(tp[0], tp[1], exc)  # keyless records go elsewhere a while
        acc = self._acc
        incomplete = acc.incomplete
        keep = []
        for b in bs:
            if b not in incomplete:
                continue  # failed at its deadline while in flight
            if counted:
                b.last_error = exc
                b.attempts += 1
            if b.deadline <= now:
                acc.finish(b, b.timeout_error(self.delivery_timeout), self._release)
            elif counted and self.retries is not None and b.attempts > self.retries:
                acc.finish(b, exc, self._release)
            else:
                keep.append(b)
        if not keep:
            return
        q = acc.queues.setdefault(tp, deque())
        while q and q[0].drain_no >= 0:
            keep.append(q.popleft())
        keep.sort(key=lambda b: b.drain_no)  # stable: without idempotence all are -1
        q.extendleft(reversed(keep))
        if counted:
            in_flight = self._in_flight
            failures = in_flight.failures[tp] = in_flight.failures.get(tp, 0) + 1
            in_flight.retry_at[tp] = now + backoff_delay(self.backoff, self.backoff_max, failures - 1)

    def requeue(self, tp: TP, bs: list[Batch], exc: Exception) -> None:
        """An uncounted ``retry``: the batches only follow another's fate."""
        self.retry(tp, bs, exc, counted=False)
