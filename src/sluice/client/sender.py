"""The producer's sender: one task that turns queued batches into produce requests and
writes them (DESIGN §4).  The producer (client/producer.py) owns the settings, the
accumulator and the metadata cache; this module decides what is sent when.  Its parts:
the requests on their way (client/flights.py), following partition leaders
(client/leaders.py), retries (client/retries.py) and what answers make of batches
(client/answers.py).

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

**Deadlines.**  A batch whose delivery deadline passes fails at once, in flight or not; its
partition stays in flight until the request ends, so no second copy is sent beside it.
PRODUCER_FENCED fails every queued batch and every later send (``_fence``).

Concurrency: everything here runs on the producer's loop; only the sender task and the
request tasks it starts call into it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from sluice import errors
from sluice.client.accumulator import Batch
from sluice.client.answers import Answers
from sluice.client.flights import TP, Flight, InFlight
from sluice.client.identity import ProducerIdentity
from sluice.client.leaders import Leaders, earliest
from sluice.client.retries import Retries
from sluice.client.state import ProducerState
from sluice.protocol import messages

log = logging.getLogger("sluice.client.producer")


class _Unsent(Exception):
    """A request was not written: a batch of it failed at its deadline before it went out,
    or a partition of it was given up to a new leader before it went out."""


def _deadline(batch: Batch) -> float:
    return batch.deadline


class Sender:
    """The sender task of one ``Producer``: builds, writes and awaits its produce requests.

    ``state`` is the producer's shared state (client/state.py): its settings (read once
    here), cluster, accumulator and buffer memory.  The producer's hooks: ``forced()`` (flush
    or close in progress: lingering batches close at once), ``refuse_sends()`` (told once
    the producer is fenced), ``leave_leaderless()`` (after a metadata refresh: sticky
    topics leave partitions without a leader) and ``partition_refused(topic, partition,
    error)`` (the partitioner avoids that partition a while).  The identity is
    ``config.identity``, an explicit ``(producer id, epoch)``, or None to ask the broker for
    one (``INIT_PRODUCER_ID``) when idempotent.

    It builds its parts here: ``in_flight`` (client/flights.py), ``leaders``
    (client/leaders.py), ``retries`` (client/retries.py) and ``answers``
    (client/answers.py).
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
        self.backoff = config.retry_backoff_ms / 1000
        self.backoff_max = config.retry_backoff_max_ms / 1000
        self.delivery_timeout = config.delivery_timeout_ms / 1000
        self.request_timeout = config.request_timeout_ms / 1000
        self.max_request_size = int(config.max_request_size)
        self._cluster = state.cluster
        self._acc = acc = state.accumulator
        self._memory = state.memory
        self._forced = forced
        self._refuse_sends = refuse_sends
        # the producer id and epoch, and each partition's sequences (client/identity.py)
        self.identity = ProducerIdentity(
            state.cluster, config.identity, backoff=self.backoff, backoff_max=self.backoff_max, on_change=self.wake
        )
        self.fenced: errors.ProducerFenced | None = None
        self.in_flight = in_flight = InFlight()
        self.leaders = Leaders(
            state, in_flight, release=self.release, requeue=self._requeue, wake=self.wake,
            leave_leaderless=leave_leaderless,
        )
        self.retries = Retries(state, in_flight, self.leaders, release=self.release, partition_refused=partition_refused)
        self.answers = Answers(
            state, in_flight, self.identity.partitions, self.retries, release=self.release, fence=self._fence
        )
        self._task: asyncio.Task | None = None
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        acc.on_ready = self.wake
        acc.on_end = self.identity.batch_ended

    # ------------------------------------------------------------------ lifecycle

    @property
    def metadata_at(self) -> float:
        """Monotonic time of the last metadata refresh (``Leaders.metadata_at``)."""
        return self.leaders.metadata_at

    @metadata_at.setter
    def metadata_at(self, at: float) -> None:
        self.leaders.metadata_at = at

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.leaders.start(loop)
        if self.idempotent:
            self.identity.start(loop)
        self._task = loop.create_task(self._run(), name="sluice-producer-sender")

    def tasks(self) -> list[asyncio.Task]:
        """Every task still to cancel on close."""
        tasks = (self._task, self.leaders.task, self.identity.task, *self.in_flight.requests)
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
        leaders = self.leaders
        while True:
            now = time.monotonic()
            acc.expire(now, self.release)
            wake_at = acc.close_lingered(now, force=self._forced())
            wake_at = self._dispatch(now, wake_at)
            wake_at = leaders.refresh_when_old(now, wake_at)
            wake_at = leaders.watch_slow(now, wake_at)
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

    def _requeue(self, tp: TP, bs: list[Batch], exc: Exception) -> None:
        self.retries.retry(tp, bs, exc, counted=False)

    def _fence(self, exc: errors.ProducerFenced) -> None:
        """A newer epoch of this producer wrote: every queued batch and later send fails."""
        if self.fenced is None:
            self.fenced = exc
            self._refuse_sends()
            log.warning("producer fenced: %s", exc)
            for q in self._acc.queues.values():
                while q:
                    self._acc.finish(q.popleft(), exc, self.release)

    # ------------------------------------------------------------------ dispatch

    def _ready(self, tp: TP, q: deque[Batch]) -> bool:
        """May ``tp`` have one more request in flight now (its queue being non-empty)?"""
        busy = self.in_flight.batches.get(tp, 0)
        if not self.idempotent:
            return not busy
        st = self.identity.partitions.get(tp)
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
        if exc is None and identity.producer_id is None and tp not in self.identity.partitions:
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
            if self.in_flight.batches.get(tp, 0) or not identity.renumber(tp, st, q):
                return True
        return False

    def _dispatch(self, now: float, wake_at: float | None) -> float | None:
        """Turn ready batches into requests, within the per-partition and per-connection
        in-flight limits; return the next time something becomes due."""
        by_node: dict[int, list[TP]] = {}
        need_refresh = False
        cluster = self._cluster
        in_flight = self.in_flight
        for tp, q in self._acc.queues.items():
            if not q:
                continue
            if (self.idempotent and self._hold(tp, q)) or not q or not self._ready(tp, q):
                if q:  # waits; expire() fails the head at its deadline
                    wake_at = earliest(wake_at, q[0].deadline)
                continue
            retry_at = in_flight.retry_at.get(tp)
            if retry_at is not None:
                if retry_at > now:
                    wake_at = earliest(wake_at, min(retry_at, q[0].deadline))
                    continue
                del in_flight.retry_at[tp]
            node = cluster.leader(*tp)
            if node < 0:
                if self.leaders.wait_for_leader(tp, q, now):  # else they failed: no such partition
                    need_refresh = True
                    wake_at = earliest(wake_at, q[0].deadline)
                continue
            by_node.setdefault(node, []).append(tp)
        if need_refresh:
            self.leaders.request_refresh()
        for node, tps in by_node.items():
            while tps and in_flight.nodes.get(node, 0) < self.max_in_flight:
                req_batches = self._take_request(tps)
                if not req_batches:
                    break
                in_flight.nodes[node] = in_flight.nodes.get(node, 0) + 1
                flat = [b for bs in req_batches.values() for b in bs]
                request, attachments = self._produce_request(req_batches, flat)
                written = self._write_now(node, request, attachments, flat)
                flight = Flight(node, req_batches, flat, now)
                in_flight.flights.add(flight)
                for tp in req_batches:
                    in_flight.sent_to[tp] = node
                task = self._loop.create_task(
                    self._send_request(flight, request, attachments, written)
                )
                in_flight.requests.add(task)
                task.add_done_callback(in_flight.requests.discard)
        return wake_at

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
                self.in_flight.batches[tp] = self.in_flight.batches.get(tp, 0) + len(taken)
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
        st = self.identity.partitions[tp]
        limit = self.per_partition - self.in_flight.batches.get(tp, 0)
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
        if self.acks != messages.ACKS_NONE and not self.in_flight.unwritten.get(node):
            # (requests to a node go out in the order they were made)
            conn = self._cluster.connected(node)
            if conn is not None:
                try:
                    written = conn.write_request(request, attachments, self.request_timeout, check=False)
                except Exception:  # it broke meanwhile: the task finds out and says so
                    pass
        if written is None:
            self.in_flight.unwritten[node] = self.in_flight.unwritten.get(node, 0) + 1  # until _deliver writes it
        else:
            for b in flat:
                b.in_flight = True
        return written

    async def _send_request(self, flight: Flight, request, attachments, written: asyncio.Future | None) -> None:
        """One produce request (``written`` already, or not yet): every batch it holds ends
        acknowledged, failed or requeued, whatever is raised (a bug, a foreign error,
        cancellation by ``close``).  A partition given up meanwhile (``Leaders.follow``) is no
        longer in ``flight.batches``, so its answer is ignored here."""
        node, batches, flat = flight.node, flight.batches, flight.flat
        answers = self.answers
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
                    answers.complete(b, -1, -1)
            else:
                answers.on_response(batches, response)
        except asyncio.CancelledError:
            # only close() cancels requests, and it has failed these batches already
            answers.abandon(batches, errors.ClientClosed("producer closed before the broker answered"))
            raise
        except _Unsent as exc:
            for tp, bs in batches.items():
                self._requeue(tp, bs, exc)
        except errors.SluiceError as exc:
            if isinstance(exc, errors.ConnectionClosed | errors.RequestTimedOut):
                self._cluster.node_failed(node)  # metadata is asked elsewhere first
            answers.on_request_error(batches, exc)
        except OSError as exc:
            self._cluster.node_failed(node)
            answers.on_request_error(batches, errors.ConnectionClosed(str(exc)))
        except Exception as exc:
            log.exception("produce request to broker %s failed unexpectedly", node)
            answers.abandon(batches, exc)
        finally:
            self.in_flight.flights.discard(flight)
            self.in_flight.nodes[node] -= 1
            for tp, bs in batches.items():
                self.in_flight.batches[tp] -= len(bs)
            self.wake()

    async def _exchange(self, flight: Flight, request, attachments, written):
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

    async def _deliver(self, flight: Flight, request, attachments):
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
            self.in_flight.unwritten[node] -= 1
        return await written
