"""Following partition leaders for the producer's sender: metadata refreshes, waiting for a
leader, and moving batches in flight to a new one (DESIGN §4).

**Refreshes.**  Metadata is asked ``metadata_max_age_ms`` after the last refresh (new
partitions, changed limits), when a send fails with NOT_LEADER, UNKNOWN_TOPIC, a closed
connection or a timeout, and when a partition has no leader; at most one refresh per
``retry_backoff_ms``, so that a partition with no leader (a deleted topic, an election
under way) does not turn the sender into a metadata loop.

**Slow requests.**  A request unanswered for ``SLOW_REQUEST_S`` makes the sender ask for
metadata every ``SLOW_REFRESH_S`` (of other brokers first): a leader that stalled is
replaced once its session lapses, and its producers must not wait ``request_timeout_ms``
for it.

**New leaders.**  Whenever metadata name a new leader for a partition with batches in
flight to the old one, an idempotent producer gives those up (``follow``: maybe stored; a
late answer is ignored) and resends them to the new leader under the same sequences, which
answers any it already has as duplicates; a backoff after failures at the old leader ends.

**No leader.**  Batches of a partition with no known leader wait (with a "retrying"
warning at most every ``RETRY_WARN_EVERY_S``) until their delivery deadline, unless
metadata has said for ``unknown_topic_wait_ms`` that the partition does not exist.

Concurrency: the producer's loop only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable

from sluice import errors
from sluice.client.accumulator import Batch
from sluice.client.flights import TP, Flight, InFlight
from sluice.client.state import ProducerState

log = logging.getLogger("sluice.client.producer")

RETRY_WARN_EVERY_S = 10.0  # "retrying" warnings, at most one per this
# A request unanswered this long may be held by a leader that stalled and was replaced:
# metadata is asked (of other brokers first) every SLOW_REFRESH_S while it stays so.
SLOW_REQUEST_S = 1.0
SLOW_REFRESH_S = 0.25
METADATA_TIMEOUT_S = 5.0  # a metadata request of the sender (capped by request_timeout_ms)


class Moved(Exception):
    """A partition's batches in flight to its old leader were given up: they go to the new
    one (``Leaders.follow``)."""


def earliest(wake_at: float | None, t: float) -> float:
    return t if wake_at is None or t < wake_at else wake_at


class Leaders:
    """Where the sender's partitions are led, and what it does when that changes.

    Collaborators: the producer's shared ``state`` (settings, cluster, accumulator), the
    sender's ``in_flight`` bookkeeping, ``release(batch)`` (its buffer memory goes back),
    ``requeue(tp, batches, exc)`` (an uncounted retry, client/retries.py), ``wake()`` (the
    sender task looks again) and ``leave_leaderless()`` (after a refresh: sticky topics
    leave partitions without a leader).  ``start(loop)`` before the first refresh.
    """

    def __init__(
        self,
        state: ProducerState,
        in_flight: InFlight,
        *,
        release: Callable[[Batch], None],
        requeue: Callable[[TP, list[Batch], Exception], None],
        wake: Callable[[], None],
        leave_leaderless: Callable[[], None],
    ) -> None:
        config = state.config
        self.idempotent = config.idempotent
        self.backoff = config.retry_backoff_ms / 1000
        self.delivery_timeout = config.delivery_timeout_ms / 1000
        self.request_timeout = config.request_timeout_ms / 1000
        self.metadata_max_age = config.metadata_max_age_ms / 1000
        self.unknown_topic_wait = config.unknown_topic_wait_ms / 1000
        self.metadata_at = 0.0  # monotonic time of the last metadata refresh
        # partitions with queued batches that metadata says do not exist, since when
        self._missing_since: dict[TP, float] = {}
        self._retry_warned_at = -math.inf
        self._cluster = state.cluster
        self._acc = state.accumulator
        self._in_flight = in_flight
        self._release = release
        self._requeue = requeue
        self._wake = wake
        self._leave_leaderless = leave_leaderless
        self._loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None  # the refresh under way

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # ------------------------------------------------------------------ refreshes

    def refresh_when_old(self, now: float, wake_at: float | None) -> float | None:
        """Refresh metadata ``metadata_max_age_ms`` after the last refresh (new partitions,
        changed limits) if any topic is known; return the next wake-up time."""
        if not self._cluster.topics:
            return wake_at
        due = self.metadata_at + self.metadata_max_age
        if now >= due:
            self.request_refresh()
            due = now + self.metadata_max_age
        return earliest(wake_at, due)

    def request_refresh(self) -> None:
        if self.task is None or self.task.done():
            self.task = self._loop.create_task(self._refresh())

    def on_failure(self, tp: TP, exc: Exception) -> None:
        """A send to ``tp`` failed with ``exc``: metadata is asked again when the failure
        may mean its leader changed or its topic appeared."""
        if isinstance(exc, errors.NotLeader | errors.RequestTimedOut):
            # A leader that does not answer in time may have been replaced while it
            # stalled: the retry waits for fresh metadata rather than going back to it.
            self._cluster.mark_stale(tp[0])
        if isinstance(exc, errors.NotLeader | errors.UnknownTopic | errors.ConnectionClosed | errors.RequestTimedOut):
            self.request_refresh()

    async def _refresh(self) -> None:
        # At most one refresh per retry_backoff_ms: a partition with no leader (a deleted
        # topic, an election under way) must not turn the sender into a metadata loop.
        pause = self.metadata_at + self.backoff - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        topics = set(self._cluster.topics) | self._acc.topics()
        try:
            await self._cluster.refresh(sorted(topics), timeout=min(self.request_timeout, METADATA_TIMEOUT_S))
            self.follow()
            self._leave_leaderless()
        except errors.SluiceError:
            await asyncio.sleep(self.backoff)  # broker down: pace the next attempt
        finally:
            self.metadata_at = time.monotonic()  # a failed refresh is not repeated at once either
            self._wake()

    # ------------------------------------------------------------------ slow requests, new leaders

    def watch_slow(self, now: float, wake_at: float | None) -> float | None:
        """While a request has been unanswered for ``SLOW_REQUEST_S``, ask metadata every
        ``SLOW_REFRESH_S`` (its node asked last): a leader that stalled (SIGSTOP, a hung
        host) is replaced once its session lapses, and ``follow`` then moves its
        partitions' batches to the new leader instead of waiting ``request_timeout_ms``."""
        flights = self._in_flight.flights
        if not self.idempotent or not flights:
            return wake_at
        due = min(f.sent_at for f in flights) + SLOW_REQUEST_S
        if now < due:
            return earliest(wake_at, due)
        for f in flights:
            if not f.slow and now - f.sent_at >= SLOW_REQUEST_S:
                f.slow = True
                self._cluster.node_failed(f.node)  # metadata asked of the others first
        self.request_refresh()
        return earliest(wake_at, now + SLOW_REFRESH_S)

    def follow(self) -> None:
        """Fresh metadata: a partition whose leader moved gives up its requests in flight to
        the old one and resends their batches to the new one under the same sequences (the
        broker answers a duplicate with its original offset, so a batch the old leader had
        replicated is not stored twice), and retries waiting out a backoff after failures
        at the old leader go at once.  Idempotent producers only: without sequences a
        batch given up could be stored twice."""
        if not self.idempotent:
            return
        cluster = self._cluster
        in_flight = self._in_flight
        for flight in list(in_flight.flights):
            for tp in list(flight.batches):
                leader = cluster.leader(*tp)
                if leader >= 0 and leader != flight.node:
                    self._give_up(flight, tp, leader)
        retry_at = in_flight.retry_at
        for tp, node in list(in_flight.sent_to.items()):
            leader = cluster.leader(*tp)
            if leader >= 0 and leader != node and tp in retry_at:
                del retry_at[tp]
                in_flight.failures.pop(tp, None)

    def _give_up(self, flight: Flight, tp: TP, leader: int) -> None:
        """Take ``tp``'s batches out of ``flight`` (its answer, if any comes, is ignored
        for them) and queue them again, ahead of later batches, for ``leader``."""
        bs = flight.batches.pop(tp)
        gone = set(bs)
        flight.flat[:] = [b for b in flight.flat if b not in gone]
        flight.moved = True
        self._in_flight.batches[tp] -= len(bs)
        for b in bs:
            b.settle(known=False)  # the old leader may have stored them
        log.info("%s[%d]: leader moved from broker %d to %d; resending %d batch(es) in flight there",
                 tp[0], tp[1], flight.node, leader, len(bs))
        self._requeue(tp, bs, Moved())
        self._wake()

    # ------------------------------------------------------------------ no leader

    def wait_for_leader(self, tp: TP, q: deque[Batch], now: float) -> bool:
        """``tp`` has no known leader: True when its queued batches ``q`` wait for one (a
        refresh is then due), False when they failed because it does not exist."""
        gone = self._gone(tp, now)
        if gone is not None:
            while q:
                self._acc.finish(q.popleft(), gone, self._release)
            return False
        if tp[0] not in self._cluster.unknown:  # (a topic gone is not waited for long: _gone)
            self.warn_retrying(tp, errors.NotLeader(f"no leader known for {tp[0]}-{tp[1]}"), now)
        for b in q:
            b.last_error = b.last_error or errors.NotLeader(f"no leader known for {tp[0]}-{tp[1]}")
        return True

    def _gone(self, tp: TP, now: float) -> errors.BrokerError | None:
        """The error ``tp``'s queued batches fail with once metadata has said for
        ``unknown_topic_wait_ms`` that the partition does not exist (its topic was deleted,
        or recreated with fewer partitions), judged on a refresh made after it was first
        seen missing; None while it may still appear (a topic being created)."""
        topic, partition = tp
        info = self._cluster.topics.get(topic)
        unknown = self._cluster.unknown.get(topic)
        if not (isinstance(unknown, errors.UnknownTopic) or (info is not None and partition >= info.partitions)):
            self._missing_since.pop(tp, None)
            return None
        since = self._missing_since.setdefault(tp, now)
        if now - since < self.unknown_topic_wait or self.metadata_at <= since:
            return None
        if info is None:
            return errors.unknown_topic_after(topic, self.unknown_topic_wait)
        return errors.unknown_partition(topic, partition, info.partitions)

    def warn_retrying(self, tp: TP, exc: Exception, now: float) -> None:
        """A send that waits out a broken connection, a partition with no leader or a
        refusal (too few in-sync replicas, say) for up to 2 minutes says so: one warning
        per RETRY_WARN_EVERY_S, not one per retry.  A topic that does not exist is not
        waited for that long (``_gone``): no warning."""
        if isinstance(exc, errors.UnknownTopic) or now - self._retry_warned_at < RETRY_WARN_EVERY_S:
            return
        self._retry_warned_at = now
        if isinstance(exc, errors.ConnectionClosed):
            what = "broker unavailable"
        elif isinstance(exc, errors.NotLeader):
            what = f"no leader for {tp[0]}-{tp[1]}"
        else:
            what = f"send to {tp[0]}-{tp[1]} refused"
        log.warning(
            "%s (%s); retrying each send for up to delivery_timeout_ms=%g",
            what, errors.describe(exc) if isinstance(exc, errors.SluiceError) else exc, self.delivery_timeout * 1000,
        )
