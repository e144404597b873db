"""The producer's sender: one task that turns queued batches into produce requests, reads
the answers, retries and completes (DESIGN §4).  The producer (client/producer.py) owns the
settings, the accumulator and the metadata cache; this module decides what is sent when.

**Requests.**  Batches of many partitions go in one ``ProduceRequestV2`` per broker, within
``max_request_size`` (the first batch always goes) and ``max_in_flight`` requests per
connection.  A request is written as it is made when its connection is open (else its
task connects first), and requests to a broker go out in the order they were made.  The
answer lists each batch's base offset (``batch_offsets``); records are completed from it,
never by adding counts.

**Per partition.**  Without idempotence a partition has one request in flight, holding any
number of its batches: that alone keeps its order across retries.  With idempotence (the
default) up to ``max_in_flight_per_partition`` (at most 5) of its *batches* are in flight at
once, in one or more requests: the broker remembers the last 5 batches per producer and
partition, so every retried batch is answered with its original offset.  Batches get their
sequence when first drained (client/sequences.py, under the producer id and epoch of
client/identity.py); a retried batch keeps it, goes back to its
queue in drain order, ahead of every later batch, and is resent only once nothing of its
partition is in flight (as Kafka's producer does since KAFKA-5494: after a failure the
partition runs one request at a time until it is back in sequence).  So does the first
request of an identity: a partition that does not know the producer accepts any sequence,
and a second request must not overtake a first one that fails.

**Outcomes.**  OUT_OF_ORDER_SEQUENCE is retried when an earlier batch is still outstanding,
renumbers the partition when the client made the gap itself (sequences.py), and fails the
part otherwise.  PRODUCER_FENCED fails every batch and every later send.  A batch whose
delivery deadline passes fails at once, in flight or not; its partition stays in flight
until the request ends, so no second copy is sent beside it.

**Leaders.**  A request unanswered for ``SLOW_REQUEST_S`` makes the sender ask for
metadata every ``SLOW_REFRESH_S`` (of other brokers first): a leader that stalled is
replaced once its session lapses, and its producers must not wait ``request_timeout_ms``
for it.  Whenever metadata name a new leader for a partition with batches in flight to the
old one, an idempotent producer gives those up (``_follow_leaders``: maybe stored; a late
answer is ignored) and resends them to the new leader under the same sequences, which
answers any it already has as duplicates; a backoff after failures at the old leader ends.

Concurrency: everything here runs on the producer's loop; only the sender task and the
request tasks it starts call into it.
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
from sluice.client.identity import ProducerIdentity, backoff_delay
from sluice.client.sequences import GAP, RETRY, PartitionSequences
from sluice.client.state import ProducerState
from sluice.protocol import messages

log = logging.getLogger("sluice.client.producer")

TP = tuple[str, int]
RETRY_WARN_EVERY_S = 10.0  # "retrying" warnings, at most one per this
# A request unanswered this long may be held by a leader that stalled and was replaced:
# metadata is asked (of other brokers first) every SLOW_REFRESH_S while it stays so.
SLOW_REQUEST_S = 1.0
SLOW_REFRESH_S = 0.25
METADATA_TIMEOUT_S = 5.0  # a metadata request of the sender (capped by request_timeout_ms)


class _Unsent(Exception):
    """A request was not written: a batch of it failed at its deadline before it went out,
    or a partition of it was given up to a new leader before it went out."""


class _Moved(Exception):
    """A partition's batches in flight to its old leader were given up: they go to the new
    one (``Sender._follow_leaders``)."""


class _Flight:
    """One produce request on its way: its node, its batches by partition (a partition
    given up to a new leader leaves ``batches`` and ``flat``), when it was made."""

    __slots__ = ("node", "batches", "flat", "sent_at", "slow", "moved")

    def __init__(self, node: int, batches: dict[TP, list[Batch]], flat: list[Batch], sent_at: float) -> None:
        self.node, self.batches, self.flat, self.sent_at = node, batches, flat, sent_at
        self.slow = False  # its node was told to the cluster as failing (SLOW_REQUEST_S)
        self.moved = False  # some partition of it was given up


def _deadline(batch: Batch) -> float:
    return batch.deadline


def _earliest(wake_at: float | None, t: float) -> float:
    return t if wake_at is None or t < wake_at else wake_at


class Sender:
    """The sender task of one ``Producer`` and the state of its requests.

    ``state`` is the producer's shared state (client/state.py): its settings (read once
    here), cluster, accumulator and buffer memory.  The producer's hooks: ``forced()`` (flush
    or close in progress: lingering batches close at once), ``refuse_sends()`` (told once
    the producer is fenced), ``leave_leaderless()`` (after a metadata refresh: sticky
    topics leave partitions without a leader) and ``partition_refused(topic, partition,
    error)`` (the partitioner avoids that partition a while).  The identity is ``config.identity``, an explicit ``(producer id, epoch)``, or
    None to ask the broker for one (``INIT_PRODUCER_ID``) when idempotent.
    """

    def __init__(
        self,
        state: ProducerState,
        *,
        forced: Callable[[], bool],
        refuse_sends: Callable[[], None],
        leave_leaderless: Callable[[], None],
        partition_refused: Callable[[str, int, BaseException], None],
    ) -> None:
        config = state.config
        self.acks = config.acks_code
        self.codec = config.codec
        self.max_in_flight = int(config.max_in_flight)
        self.per_partition = config.in_flight_per_partition
        self.idempotent = config.idempotent
        self.retries = config.retries
        self.backoff = config.retry_backoff_ms / 1000
        self.backoff_max = config.retry_backoff_max_ms / 1000
        self.delivery_timeout = config.delivery_timeout_ms / 1000
        self.request_timeout = config.request_timeout_ms / 1000
        self.max_request_size = int(config.max_request_size)
        self.metadata_max_age = config.metadata_max_age_ms / 1000
        self.unknown_topic_wait = config.unknown_topic_wait_ms / 1000
        self.metadata_at = 0.0  # monotonic time of the last metadata refresh
        # partitions with queued batches that metadata says do not exist, since when
        self._missing_since: dict[TP, float] = {}
        self._retry_warned_at = -math.inf
        self._cluster = state.cluster
        self._acc = acc = state.accumulator
        self._memory = state.memory
        self._forced = forced
        self._refuse_sends = refuse_sends
        self._leave_leaderless = leave_leaderless
        self._partition_refused = partition_refused
        # the producer id and epoch, and each partition's sequences (client/identity.py)
        self.identity = ProducerIdentity(
            state.cluster, config.identity, backoff=self.backoff, backoff_max=self.backoff_max, on_change=self.wake
        )
        self.fenced: errors.ProducerFenced | None = None
        self._seqs: dict[TP, PartitionSequences] = self.identity.partitions
        self._inflight: dict[TP, int] = {}  # batches in flight per partition
        self._inflight_nodes: dict[int, int] = {}
        # requests per node whose task writes them (a count that only close(), which
        # cancels tasks that may not have started, can leave behind)
        self._unwritten: dict[int, int] = {}
        self._retry_at: dict[TP, float] = {}
        self._failures: dict[TP, int] = {}  # consecutive failed attempts
        self._requests: set[asyncio.Task] = set()
        self._flights: set[_Flight] = set()  # requests made and not ended
        self._sent_to: dict[TP, int] = {}  # the node each partition's last request went to
        self._task: asyncio.Task | None = None
        self._refresh_task: asyncio.Task | None = None
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        acc.on_ready = self.wake
        acc.on_end = self.identity.batch_ended

    # ------------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.idempotent:
            self.identity.start(loop)
        self._task = loop.create_task(self._run(), name="sluice-producer-sender")

    def tasks(self) -> list[asyncio.Task]:
        """Every task still to cancel on close."""
        tasks = (self._task, self._refresh_task, self.identity.task, *self._requests)
        return [t for t in tasks if t is not None]

    def release(self, batch: Batch) -> None:
        self._memory.release(batch.reserved)

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _run(self) -> None:
        loop = self._loop
        acc = self._acc
        while True:
            now = time.monotonic()
            acc.expire(now, self.release)
            wake_at = acc.close_lingered(now, force=self._forced())
            wake_at = self._dispatch(now, wake_at)
            wake_at = self._refresh_when_old(now, wake_at)
            wake_at = self._watch_slow(now, wake_at)
            self._waiter = loop.create_future()
            handle = None
            if wake_at is not None:
                handle = loop.call_at(loop.time() + max(0.0, wake_at - time.monotonic()), self.wake)
            try:
                await self._waiter
            finally:
                self._waiter = None
                if handle is not None:
                    handle.cancel()

    # ------------------------------------------------------------------ metadata

    def _refresh_when_old(self, now: float, wake_at: float | None) -> float | None:
        """Refresh metadata ``metadata_max_age_ms`` after the last refresh (new partitions,
        changed limits) if any topic is known; return the next wake-up time."""
        if not self._cluster.topics:
            return wake_at
        due = self.metadata_at + self.metadata_max_age
        if now >= due:
            self.request_refresh()
            due = now + self.metadata_max_age
        return _earliest(wake_at, due)

    def request_refresh(self) -> None:
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = self._loop.create_task(self._refresh())

    def _watch_slow(self, now: float, wake_at: float | None) -> float | None:
        """While a request has been unanswered for ``SLOW_REQUEST_S``, ask metadata every
        ``SLOW_REFRESH_S`` (its node asked last): a leader that stalled (SIGSTOP, a hung
        host) is replaced once its session lapses, and ``_follow_leaders`` then moves its
        partitions' batches to the new leader instead of waiting ``request_timeout_ms``."""
        if not self.idempotent or not self._flights:
            return wake_at
        due = min(f.sent_at for f in self._flights) + SLOW_REQUEST_S
        if now < due:
            return _earliest(wake_at, due)
        for f in self._flights:
            if not f.slow and now - f.sent_at >= SLOW_REQUEST_S:
                f.slow = True
                self._cluster.node_failed(f.node)  # metadata asked of the others first
        self.request_refresh()
        return _earliest(wake_at, now + SLOW_REFRESH_S)

    def _follow_leaders(self) -> None:
        """Fresh metadata: a partition whose leader moved gives up its requests in flight to
        the old one and resends their batches to the new one under the same sequences (the
        broker answers a duplicate with its original offset, so a batch the old leader had
        replicated is not stored twice), and retries waiting out a backoff after failures
        at the old leader go at once.  Idempotent producers only: without sequences a
        batch given up could be stored twice."""
        if not self.idempotent:
            return
        cluster = self._cluster
        for flight in list(self._flights):
            for tp in list(flight.batches):
                leader = cluster.leader(*tp)
                if leader >= 0 and leader != flight.node:
                    self._give_up(flight, tp, leader)
        for tp, node in list(self._sent_to.items()):
            leader = cluster.leader(*tp)
            if leader >= 0 and leader != node and tp in self._retry_at:
                del self._retry_at[tp]
                self._failures.pop(tp, None)

    def _give_up(self, flight: _Flight, tp: TP, leader: int) -> None:
        """Take ``tp``'s batches out of ``flight`` (its answer, if any comes, is ignored
        for them) and queue them again, ahead of later batches, for ``leader``."""
        bs = flight.batches.pop(tp)
        gone = set(bs)
        flight.flat[:] = [b for b in flight.flat if b not in gone]
        flight.moved = True
        self._inflight[tp] -= len(bs)
        for b in bs:
            b.settle(known=False)  # the old leader may have stored them
        log.info("%s[%d]: leader moved from broker %d to %d; resending %d batch(es) in flight there",
                 tp[0], tp[1], flight.node, leader, len(bs))
        self._retry(tp, bs, _Moved(), counted=False)
        self.wake()

    async def _refresh(self) -> None:
        # At most one refresh per retry_backoff_ms: a partition with no leader (a deleted
        # topic, an election under way) must not turn the sender into a metadata loop.
        pause = self.metadata_at + self.backoff - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        topics = set(self._cluster.topics) | self._acc.topics()
        try:
            await self._cluster.refresh(sorted(topics), timeout=min(self.request_timeout, METADATA_TIMEOUT_S))
            self._follow_leaders()
            self._leave_leaderless()
        except errors.SluiceError:
            await asyncio.sleep(self.backoff)  # broker down: pace the next attempt
        finally:
            self.metadata_at = time.monotonic()  # a failed refresh is not repeated at once either
            self.wake()

    # ------------------------------------------------------------------ dispatch

    def _ready(self, tp: TP, q: deque[Batch]) -> bool:
        """May ``tp`` have one more request in flight now (its queue being non-empty)?"""
        busy = self._inflight.get(tp, 0)
        if not self.idempotent:
            return not busy
        st = self._seqs.get(tp)
        if st is None or st.renumber_pending:
            return False
        if q[0].drain_no >= 0 or not st.acked:  # a retry, or the identity's first request
            return not busy
        return busy < self.per_partition

    def _hold(self, tp: TP, q: deque[Batch]) -> bool:
        """Idempotence's preconditions for sending ``tp``: True when it must wait (or its
        batches were failed: fenced, or no producer id can be had)."""
        exc = self.fenced
        identity = self.identity
        if exc is None and identity.producer_id is None and tp not in self._seqs:
            identity.need()
            err = identity.error
            if err is not None and not err.retriable:
                exc = err
            else:
                for b in q:
                    b.last_error = err or b.last_error
                return True
        if exc is not None:
            while q:
                self._acc.finish(q.popleft(), exc, self.release)
            return True
        st = identity.sequences(tp)
        if st.renumber_pending:
            if self._inflight.get(tp, 0) or not identity.renumber(tp, st, q):
                return True
        return False

    def _dispatch(self, now: float, wake_at: float | None) -> float | None:
        """Turn ready batches into requests, within the per-partition and per-connection
        in-flight limits; return the next time something becomes due."""
        by_node: dict[int, list[TP]] = {}
        need_refresh = False
        cluster = self._cluster
        for tp, q in self._acc.queues.items():
            if not q:
                continue
            if (self.idempotent and self._hold(tp, q)) or not q or not self._ready(tp, q):
                if q:  # waits; expire() fails the head at its deadline
                    wake_at = _earliest(wake_at, q[0].deadline)
                continue
            retry_at = self._retry_at.get(tp)
            if retry_at is not None:
                if retry_at > now:
                    wake_at = _earliest(wake_at, min(retry_at, q[0].deadline))
                    continue
                del self._retry_at[tp]
            node = cluster.leader(*tp)
            if node < 0:
                gone = self._gone(tp, now)
                if gone is not None:
                    while q:
                        self._acc.finish(q.popleft(), gone, self.release)
                    continue
                need_refresh = True
                if tp[0] not in cluster.unknown:  # (a topic gone is not waited for long: _gone)
                    self._warn_retrying(tp, errors.NotLeader(f"no leader known for {tp[0]}-{tp[1]}"), now)
                for b in q:
                    b.last_error = b.last_error or errors.NotLeader(f"no leader known for {tp[0]}-{tp[1]}")
                wake_at = _earliest(wake_at, q[0].deadline)
                continue
            by_node.setdefault(node, []).append(tp)
        if need_refresh:
            self.request_refresh()
        for node, tps in by_node.items():
            while tps and self._inflight_nodes.get(node, 0) < self.max_in_flight:
                req_batches = self._take_request(tps)
                if not req_batches:
                    break
                self._inflight_nodes[node] = self._inflight_nodes.get(node, 0) + 1
                flat = [b for bs in req_batches.values() for b in bs]
                request, attachments = self._produce_request(req_batches, flat)
                written = self._write_now(node, request, attachments, flat)
                flight = _Flight(node, req_batches, flat, now)
                self._flights.add(flight)
                for tp in req_batches:
                    self._sent_to[tp] = node
                task = self._loop.create_task(
                    self._send_request(flight, request, attachments, written)
                )
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
        return wake_at

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

    def _take_request(self, tps: list[TP]) -> dict[TP, list[Batch]]:
        """Pop batches of as many partitions of ``tps`` as fit in ``max_request_size`` (the
        first batch always goes) and mark them in flight.  A partition stays first in
        ``tps`` when the request filled up and it may send another request."""
        out: dict[TP, list[Batch]] = {}
        room = self.max_request_size
        queues = self._acc.queues
        while tps:
            tp = tps[0]
            q = queues[tp]
            taken, room, full = self._take_batches(tp, q, room, first=not out)
            if taken:
                out[tp] = taken
                self._inflight[tp] = self._inflight.get(tp, 0) + len(taken)
            if full and q and self._ready(tp, q):
                break  # the request is full; this partition heads the next one
            tps.pop(0)
            if full:
                break
        return out

    def _take_batches(self, tp: TP, q: deque[Batch], room: int, first: bool) -> tuple[list[Batch], int, bool]:
        """Batches of ``tp`` for one request, stamped with their sequences when idempotent:
        at most the partition's in-flight budget, with consecutive drain numbers (a failed
        batch between two starts a new request part).  Returns (batches, room left, whether
        the request is full)."""
        codec = self.codec
        taken: list[Batch] = []
        if not self.idempotent:
            while q:
                size = q[0].wire_size(codec)
                if size > room and (taken or not first):
                    return taken, room, True
                b = q.popleft()
                b.build(codec)
                taken.append(b)
                room -= size
            return taken, room, False
        st = self._seqs[tp]
        limit = self.per_partition - self._inflight.get(tp, 0)
        while q and len(taken) < limit:
            b = q[0]
            if taken and not st.follows(taken[-1], b):
                break
            size = b.wire_size(codec)
            if size > room and (taken or not first):
                return taken, room, True
            q.popleft()
            if b.drain_no < 0:
                st.assign(b)
            b.build(codec)
            taken.append(b)
            room -= size
        return taken, room, False

    # ------------------------------------------------------------------ requests

    def _produce_request(self, batches: dict[TP, list[Batch]], flat: list[Batch]) -> tuple:
        """The produce request of ``batches`` (``flat``, in order) and its attachments."""
        partitions = []
        attachments = []
        for (topic, partition), bs in batches.items():
            size = 0
            for b in bs:
                attachments.append(b.data)
                size += len(b.data)
            partitions.append(messages.ProducePartition(topic=topic, partition=partition, size=size))
        # The broker holds acks=all writes no longer than the batches' delivery deadline
        # (seed 000: each waiting write carries its own deadline, nothing waits past it).
        wait = min(self.request_timeout, min(b.deadline for b in flat) - time.monotonic())
        request = messages.ProduceRequestV2(
            partitions=partitions, acks=self.acks, timeout_ms=max(1, int(wait * 1000))
        )
        return request, attachments

    def _write_now(self, node: int, request, attachments: list, flat: list[Batch]) -> asyncio.Future | None:
        """Write a request at once, on the open connection to ``node``, and return the
        future of its answer (``Connection.write_request``; ``flat`` is then in flight);
        None when its task must connect first, or wait for room (``acks="none"``).

        At once, not on its task's first turn: a loop of sends that lets the loop turn
        rarely (see _TURN_BYTES in producer.py) would otherwise hold every request
        back until its next turn, and the broker would wait on the client, not work beside it.
        """
        written = None
        if self.acks != messages.ACKS_NONE and not self._unwritten.get(node):
            # (requests to a node go out in the order they were made)
            conn = self._cluster.connected(node)
            if conn is not None:
                try:
                    written = conn.write_request(request, attachments, self.request_timeout, check=False)
                except Exception:  # it broke meanwhile: the task finds out and says so
                    pass
        if written is None:
            self._unwritten[node] = self._unwritten.get(node, 0) + 1  # until _deliver writes it
        else:
            for b in flat:
                b.in_flight = True
        return written

    async def _send_request(self, flight: _Flight, request, attachments, written: asyncio.Future | None) -> None:
        """One produce request (``written`` already, or not yet): every batch it holds ends
        acknowledged, failed or requeued, whatever is raised (a bug, a foreign error,
        cancellation by ``close``).  A partition given up meanwhile (``_give_up``) is no
        longer in ``flight.batches``, so its answer is ignored here."""
        node, batches, flat = flight.node, flight.batches, flight.flat
        try:
            try:
                response = await self._exchange(flight, request, attachments, written)
            except BaseException as exc:
                # The broker refusing the whole request (a frame past its cap, say) wrote
                # none of it; otherwise, written or not, no answer was read.
                refused = isinstance(exc, errors.BrokerError) and exc.appended_nothing
                for b in flat:
                    b.settle(known=refused)
                raise
            if response is None:  # acks=none: written is all we will know
                for b in flat:
                    b.settle(known=False)
                    self._complete(b, -1, -1)
            else:
                self._on_response(batches, response)
        except asyncio.CancelledError:
            # only close() cancels requests, and it has failed these batches already
            self._abandon(batches, errors.ClientClosed("producer closed before the broker answered"))
            raise
        except _Unsent as exc:
            for tp, bs in batches.items():
                self._retry(tp, bs, exc, counted=False)
        except errors.SluiceError as exc:
            if isinstance(exc, errors.ConnectionClosed | errors.RequestTimedOut):
                self._cluster.node_failed(node)  # metadata is asked elsewhere first
            self._on_request_error(batches, exc)
        except OSError as exc:
            self._cluster.node_failed(node)
            self._on_request_error(batches, errors.ConnectionClosed(str(exc)))
        except Exception as exc:
            log.exception("produce request to broker %s failed unexpectedly", node)
            self._abandon(batches, exc)
        finally:
            self._flights.discard(flight)
            self._inflight_nodes[node] -= 1
            for tp, bs in batches.items():
                self._inflight[tp] -= len(bs)
            self.wake()

    async def _exchange(self, flight: _Flight, request, attachments, written):
        """Send one request, unless ``written`` is the future of its answer already, and
        return its response (None with ``acks="none"``).

        The request itself is bounded by ``connect_timeout_ms`` and ``request_timeout_ms``
        alone (a timeout closes its connection, see ``Connection.request``), never shrunk by
        the batches' deadlines (the broker is told the earliest of them, as the request's
        ``timeout_ms``, so that it answers by then): a batch whose delivery deadline passes
        meanwhile fails on its own (its records may have been stored) while the request runs
        on, and its partition stays in flight until the request ends.
        """
        if written is None:
            written = self._loop.create_task(self._deliver(flight, request, attachments))
        by_deadline = sorted(flight.flat, key=_deadline)
        i = 0
        try:
            while True:
                now = time.monotonic()
                while i < len(by_deadline) and by_deadline[i].deadline <= now:
                    b = by_deadline[i]
                    self._acc.finish(b, b.timeout_error(self.delivery_timeout), self.release)
                    i += 1
                timeout = by_deadline[i].deadline - now if i < len(by_deadline) else None
                await asyncio.wait((written,), timeout=timeout)
                if written.done():
                    answer = written.result()
                    return None if answer is None else answer[0]
        finally:
            if not written.done():
                written.cancel()

    async def _deliver(self, flight: _Flight, request, attachments):
        """Connect and write (marking ``flight.flat`` in flight only once the bytes go out),
        then await the answer: ``(response, attachments)``, or None with ``acks="none"``."""
        node, flat = flight.node, flight.flat
        try:
            conn = await self._cluster.connection(node)
            if self.acks == messages.ACKS_NONE:
                await conn.drain()
            if conn.closed:
                raise errors.ConnectionClosed(f"connection to broker {node} closed before sending")
            incomplete = self._acc.incomplete
            if flight.moved or any(b not in incomplete for b in flat):
                # one failed at its deadline before a byte went out, told it was not stored:
                # it must never be written; the others go back to their queues (so do they
                # when a partition of the request was given up to a new leader meanwhile:
                # the request's bytes still hold that partition's batches)
                raise _Unsent()
            for b in flat:
                b.in_flight = True
            if self.acks == messages.ACKS_NONE:
                conn.send_noreply(request, attachments)
                return None
            written = conn.write_request(request, attachments, self.request_timeout, check=False)
        finally:
            self._unwritten[node] -= 1
        return await written

    # ------------------------------------------------------------------ answers

    def _on_response(self, batches: dict[TP, list[Batch]], response: messages.ProduceResponseV2) -> None:
        if response.error:  # the whole request was answered with one error
            exc = errors.error_for_code(response.error, response.message)
            for tp, bs in batches.items():
                self._on_partition_error(tp, bs, exc)
            return
        results = {(r.topic, r.partition): r for r in response.partitions}
        for tp, bs in batches.items():
            r = results.get(tp)
            if r is None:
                exc = errors.UnknownServerError(f"no result for {tp} in the produce response")
                self._on_partition_error(tp, bs, exc)
            elif r.error:
                self._on_partition_error(tp, bs, errors.error_for_code(r.error, r.message))
            elif len(r.batch_offsets) != len(bs):
                exc = errors.UnknownServerError(
                    f"{len(r.batch_offsets)} batch offsets answered for {len(bs)} batches of {tp}"
                )
                self._on_partition_error(tp, bs, exc)
            else:
                self._failures.pop(tp, None)
                st = self._seqs.get(tp)
                for b, offset in zip(bs, r.batch_offsets, strict=True):
                    b.settle(known=True)
                    if st is not None:
                        st.acknowledged(b)
                    self._complete(b, offset, r.log_append_time)

    def _on_partition_error(self, tp: TP, bs: list[Batch], exc: errors.BrokerError) -> None:
        for b in bs:
            b.settle(known=exc.appended_nothing)
        if isinstance(exc, errors.OutOfOrderSequence) and tp in self._seqs:
            self._on_out_of_order(tp, bs, exc)
        elif isinstance(exc, errors.ProducerFenced):
            self._fence(exc)
            self._fail_batches(bs, exc)
        elif exc.retriable:
            self._retry(tp, bs, exc)
        else:
            self._fail_batches(bs, exc)

    def _on_out_of_order(self, tp: TP, bs: list[Batch], exc: errors.OutOfOrderSequence) -> None:
        """The broker has none of ``bs`` (client/sequences.py): retry them behind an earlier
        outstanding batch, renumber the partition after a gap the client made, or fail."""
        st = self._seqs[tp]
        for b in bs:
            b.maybe_stored = False
        kind = st.classify(bs[0])
        if kind == RETRY:
            self._retry(tp, bs, exc, counted=False)
        elif st.explicit:
            note = "a batch before it failed, and an explicit producer identity is never renumbered"
            self._fail_batches(bs, errors.annotated(exc, f"({note})") if kind == GAP else exc)
        elif kind == GAP:
            st.renumber_pending = True
            self._retry(tp, bs, exc, counted=False)
        else:  # LOST: acknowledged batches are gone; these fail, later ones go on
            st.renumber_pending = True
            self._fail_batches(bs, exc)

    def _fence(self, exc: errors.ProducerFenced) -> None:
        """A newer epoch of this producer wrote: every queued batch and later send fails."""
        if self.fenced is None:
            self.fenced = exc
            self._refuse_sends()
            log.warning("producer fenced: %s", exc)
            for q in self._acc.queues.values():
                while q:
                    self._acc.finish(q.popleft(), exc, self.release)

    def _abandon(self, batches: dict[TP, list[Batch]], exc: BaseException) -> None:
        """Fail every batch of ``batches`` still unfinished and not requeued."""
        for tp, bs in batches.items():
            q = self._acc.queues.get(tp, ())
            for b in bs:
                if b in self._acc.incomplete and b not in q:
                    self._acc.finish(b, exc, self.release)

    def _on_request_error(self, batches: dict[TP, list[Batch]], exc: errors.SluiceError) -> None:
        retriable = exc.retriable or isinstance(exc, errors.ConnectionClosed)
        for tp, bs in batches.items():
            if retriable:
                self._retry(tp, bs, exc)
            else:
                self._fail_batches(bs, exc)

    def _retry(self, tp: TP, bs: list[Batch], exc: Exception, counted: bool = True) -> None:
        """Requeue the unfinished batches of ``bs`` at the front of their partition, merged
        in drain order with retries queued already (ahead of every batch not drained yet).

        A ``counted`` retry (a failed attempt) waits a backoff that grows with the
        partition's consecutive failures up to ``retry_backoff_max_ms``, whatever the
        deadlines, and counts toward ``retries``; ``expire`` fails what reaches its deadline
        meanwhile.  An uncounted one (a batch that only follows an earlier retry) does not."""
        now = time.monotonic()
        if isinstance(exc, errors.NotLeader | errors.RequestTimedOut):
            # A leader that does not answer in time may have been replaced while it
            # stalled: the retry waits for fresh metadata rather than going back to it.
            self._cluster.mark_stale(tp[0])
        if isinstance(exc, errors.NotLeader | errors.UnknownTopic | errors.ConnectionClosed | errors.RequestTimedOut):
            self.request_refresh()
        if counted:
            self._warn_retrying(tp, exc, now)
            self._partition_refused(tp[0], tp[1], exc)  # keyless records go elsewhere a while
        incomplete = self._acc.incomplete
        keep = []
        for b in bs:
            if b not in incomplete:
                continue  # failed at its deadline while in flight
            if counted:
                b.last_error = exc
                b.attempts += 1
            if b.deadline <= now:
                self._acc.finish(b, b.timeout_error(self.delivery_timeout), self.release)
            elif counted and self.retries is not None and b.attempts > self.retries:
                self._acc.finish(b, exc, self.release)
            else:
                keep.append(b)
        if not keep:
            return
        q = self._acc.queues.setdefault(tp, deque())
        while q and q[0].drain_no >= 0:
            keep.append(q.popleft())
        keep.sort(key=lambda b: b.drain_no)  # stable: without idempotence all are -1
        q.extendleft(reversed(keep))
        if counted:
            failures = self._failures[tp] = self._failures.get(tp, 0) + 1
            self._retry_at[tp] = now + backoff_delay(self.backoff, self.backoff_max, failures - 1)

    def _warn_retrying(self, tp: TP, exc: Exception, now: float) -> None:
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

    def _fail_batches(self, bs: list[Batch], exc: Exception) -> None:
        for b in bs:
            self._acc.finish(b, exc, self.release)

    def _complete(self, batch: Batch, base_offset: int, append_time: int) -> None:
        batch.resolve(base_offset, append_time)
        self._acc.finish(batch, None, self.release)
