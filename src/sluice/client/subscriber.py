"""Subscriber: consume a topic through a durable subscription, one ack per message.

Each partition's leader pushes messages (DELIVER) while the consumer has credit (``prefetch``
unsettled messages per broker connection); every message is settled on its own —
``ack()``, ``nack(delay_ms)`` (redelivered later), or left alone past the ack deadline
(redelivered then) — and ``touch()`` restarts its deadline.  Settling is cheap: it records
the offset, and the subscriber sends what was settled every ``ack_interval_ms`` as offset
ranges, one request per broker (client/ack_sender.py).  ``Message``: client/message.py.  Any number of subscribers may share a subscription: the
brokers split the messages between them.

Use it as an async iterator, or hand it a handler with ``run(handler, concurrency=N)``
(acked when the handler returns, nacked when it raises, touched while it runs).
``close()`` hands prefetched messages nobody took back to the broker (redelivered at
once, the attempt not counted), sends the pending acks and disconnects.

Delivery is at least once: a message whose ack was lost (a crash, a leader change) comes
again, with a higher ``attempt``.  In ``ordered`` mode a partition's next message is given
out only once the previous one is settled, and after a nack the ones behind it wait for
its redelivery.

The broker sends stored batches and the offsets wanted of each; this module picks the
records out (offsets a compacted batch no longer holds are acked at once).  Re-driving dead
letters: client/redrive.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from sluice import errors
from sluice.client.ack_sender import AckSender
from sluice.client.cluster import Cluster
from sluice.client.config import SubscriberConfig, position
from sluice.client.message import Message
from sluice.client.transport import Connection
from sluice.protocol import messages as m
from sluice.protocol.ranges import RangeSet
from sluice.protocol.records import decode_records
from sluice.protocol.subscriptions import (
    SubscriptionConfig,
    check_name,
    config_differences,
)

log = logging.getLogger("sluice.client.subscriber")

RESUBSCRIBE_S = 0.5  # between attempts to subscribe partitions not served yet
METADATA_S = 10.0  # how often partitions are looked for (new partitions, moved leaders)
LOST_WARN_EVERY_S = 10.0  # "partitions lost their broker" warnings, at most one per this


class Subscriber:
    """Consume ``topic`` through subscription ``subscription`` (see the module docstring).

    ``create``: create the subscription on partitions that lack it, with ``config`` (each
    of the settings ``mode``, ``max_attempts``, ``ack_timeout_ms``, ``backoff_initial_ms``,
    ``backoff_max_ms``, ``tags`` given here overrides its field) from ``start``
    (``earliest``, ``latest``, an offset, ``time:<ms>``); with ``create=False`` a missing
    subscription fails the subscriber with ``UnknownSubscription``.  Either way, partitions
    added to the topic while it runs that lack the subscription get it, from their start,
    with its settings (``Admin.add_partitions`` does that itself).  Settings are fixed at
    creation: a subscription that exists keeps its own, and those given here that it does
    not have are named in a warning (logged once).
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        topic: str,
        subscription: str,
        settings: SubscriberConfig | None = None,
        **options,
    ) -> None:
        """``settings``: client/config.py's ``SubscriberConfig``; keyword arguments
        ``options`` are settings too (``prefetch``, ``config``, ``mode`` …), over
        ``settings`` or the defaults.  ``ConfigError`` for a bad one, ``TypeError`` for a
        keyword that is no setting."""
        check_name(subscription)
        settings = self.settings = SubscriberConfig.of(settings, **options)
        cfg = settings.subscription
        self.topic = topic
        self.subscription = subscription
        self.prefetch = prefetch = settings.prefetch
        self._create = cfg if settings.create else None
        # the settings asked for (all of ``config``'s, if given): a subscription that exists
        # with others keeps them, and the first partition that says so is warned about
        self._asked = (cfg, settings.asked)
        self._start = position(settings.start)
        self.unknown_topic_wait = settings.unknown_topic_wait_ms / 1000
        self._missing_since: float | None = None  # since when metadata says the topic does not exist
        self._cluster = Cluster(
            bootstrap, request_timeout=settings.request_timeout_ms / 1000,
            connect_timeout=settings.connect_timeout_ms / 1000,
        )
        self._served: dict[int, Connection] = {}  # partition -> connection delivering it
        self._sessions: dict[int, object] = {}  # partition -> token of its current session
        self._configs: dict[int, SubscriptionConfig] = {}
        self._ordered_parts: set[int] = set()  # partitions whose subscription is ordered
        self._ready: dict[int, deque[Message]] = {}  # partition -> messages not given out
        self._given: dict[int, int] = {}  # partition -> messages given out, not settled
        # settlements noted and not sent yet; sends them
        self._acks = AckSender(
            topic, subscription, self._served, self._lost,
            prefetch=prefetch, ack_interval=settings.ack_interval_ms / 1000,
        )
        self._rr = 0
        self._arrived = asyncio.Event()
        self._changed = asyncio.Event()  # a partition to subscribe again
        self._failure: BaseException | None = None
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self._closed = False
        self._lost_warned_at = -LOST_WARN_EVERY_S
        self.created: set[int] = set()  # partitions where subscribing created the subscription
        self._first_count: int | None = None  # the topic's partitions when first subscribed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Subscribe the topic's partitions (creating the subscription where missing);
        raises what makes that impossible (an unknown topic, a bad setting)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        await self._subscribe_all()
        while self._failure is None and self._missing_since is not None:  # it may be being created
            await asyncio.sleep(0.1)
            await self._subscribe_all()
        if self._failure is not None:
            await self._cluster.close()
            raise self._failure
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep_subscribed()), loop.create_task(self._acks.loop())]

    async def __aenter__(self) -> Subscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Hand back what was prefetched and not given out, send every settlement, disconnect."""
        if self._closed:
            return
        self._closed = True
        for partition, ready in self._ready.items():
            for msg in ready:
                msg.settled = True
                self._acks.pending_for(partition).releases.add(msg.offset, msg.offset + 1)
            ready.clear()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._acks.flush(wait=True)
        await self._cluster.close()
        self._arrived.set()

    # ------------------------------------------------------------------ consuming

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        msg = await self.get()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message; None after ``timeout`` seconds without one, or once closed.
        Raises what stopped the subscriber (say, the subscription was deleted)."""
        if not self._started:
            await self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                return None
            msg = self._next_ready()
            if msg is not None:
                return msg
            self._arrived.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                return None

    async def getmany(self, max_records: int = 1000, timeout: float = 0) -> list[Message]:
        """Up to ``max_records`` messages at hand; waits up to ``timeout`` s for the first."""
        first = await self.get(timeout)
        if first is None:
            return []
        out = [first]
        given = self._given
        while len(out) < max_records:
            before = len(out)
            for p, ready in self._ready.items():
                if not ready or (self._ordered(p) and given.get(p, 0)):
                    continue
                n = 1 if self._ordered(p) else min(len(ready), max_records - len(out))
                out.extend([ready.popleft() for _ in range(n)])
                given[p] = given.get(p, 0) + n
                if len(out) >= max_records:
                    break
            if len(out) == before:
                break
        return out

    async def run(
        self, handler: Callable[[Message], Awaitable[None] | None], *, concurrency: int = 10, keep_alive: bool = True
    ) -> None:
        """Call ``handler(message)`` for every message, up to ``concurrency`` at once
        (one per partition at a time in ordered mode): ack when it returns, nack when it
        raises (unless it settled the message itself, e.g. a nack with its own delay),
        touch while it runs (``keep_alive``).  ``handler`` may be a coroutine
        function or a plain function (what it returns is awaited only if awaitable); a
        plain one runs on the event loop, so it should be quick: nothing else, touches
        included, runs until it returns.  Returns when the subscriber is closed; raises
        what stopped it."""
        slots = asyncio.Semaphore(concurrency)
        running: set[asyncio.Task] = set()

        async def call(msg: Message) -> None:
            result = handler(msg)
            if inspect.isawaitable(result):
                await result

        async def handle(msg: Message) -> None:
            try:
                if keep_alive:
                    async with msg.keep_alive():
                        await call(msg)
                else:
                    await call(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the handler's failure is the message's
                log.debug("handler failed on %r: %r", msg, exc)
                with contextlib.suppress(errors.AlreadySettled):  # the handler settled it itself
                    msg.nack(reason=f"{type(exc).__name__}: {exc}"[:500])
            else:
                with contextlib.suppress(errors.AlreadySettled):
                    msg.ack()
            finally:
                slots.release()

        try:
            while True:
                await slots.acquire()
                msg = await self.get()
                if msg is None:
                    slots.release()
                    break
                task = asyncio.ensure_future(handle(msg))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    def _next_ready(self) -> Message | None:
        parts = [p for p, q in self._ready.items() if q]
        if not parts:
            return None
        for i in range(len(parts)):
            p = parts[(self._rr + i) % len(parts)]
            if self._ordered(p) and self._given.get(p, 0):
                continue
            self._rr = (self._rr + i + 1) % max(len(parts), 1)
            msg = self._ready[p].popleft()
            self._given[p] = self._given.get(p, 0) + 1
            return msg
        return None

    def _ordered(self, partition: int) -> bool:
        return partition in self._ordered_parts

    def _ack_timeout_s(self, partition: int) -> float:
        cfg = self._configs.get(partition) or SubscriptionConfig()
        return cfg.ack_timeout_ms / 1000

    # ------------------------------------------------------------------ settling

    def _on_loop(self, fn, *args) -> None:
        """``fn(*args)`` now when on the subscriber's loop thread, else queued to it."""
        if self._loop is None or threading.get_ident() == self._thread:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def _ack(self, msg: Message) -> None:
        """The hot path of ``Message.ack``: the offset is noted, sent as ranges later."""
        partition = msg.partition
        acks = self._acks
        pending = acks.pending.get(partition)
        if pending is None:
            pending = acks.pending_for(partition)
        pending.acks.append(msg.offset)
        acks.count += 1
        if acks.count >= acks.flush_at:
            acks.flush_now.set()
        if partition in self._ordered_parts and msg._session in (None, self._sessions.get(partition)):
            self._settled(partition)  # (a message of an ended session holds no place)

    def _settled(self, partition: int) -> None:
        """A message of an ordered partition was settled: its next one may go out."""
        given = self._given.get(partition, 0)
        if given:
            self._given[partition] = given - 1
        self._arrived.set()

    def _nack(self, msg: Message, delay_ms: int, reason: str) -> None:
        """A nack goes to the session of the partition that delivered the message.  One
        whose session ended since (a lost connection, a restarted or new leader) is dropped:
        the message comes again anyway, and sent to the next session the nack would fail
        that session's own delivery of it, which the application may be working on."""
        if msg._session is None or self._sessions.get(msg.partition) is not msg._session:
            return
        acks = self._acks
        acks.pending_for(msg.partition).nack(msg.offset, delay_ms, reason)
        if self._ordered(msg.partition):  # the ones behind it wait for its redelivery
            self._ready.get(msg.partition, deque()).clear()
        acks.count += 1
        acks.flush_now.set()
        self._settled(msg.partition)

    def _touch(self, msg: Message) -> None:
        self._acks.pending_for(msg.partition).touches.add(msg.offset, msg.offset + 1)
        msg.deadline = time.monotonic() + self._ack_timeout_s(msg.partition)
        self._acks.flush_now.set()

    async def flush(self) -> None:
        """Send every settlement made so far and wait for the brokers' answers."""
        await self._acks.flush(wait=True)

    # ------------------------------------------------------------------ subscribing

    async def _keep_subscribed(self) -> None:
        last_metadata = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(RESUBSCRIBE_S):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            if self._failure is not None:
                # before subscribing again: subscribing creates the subscription, and a
                # deleted one must stay deleted
                self._arrived.set()
                return
            info = self._cluster.topic(self.topic)
            missing = info is None or any(p not in self._served for p in range(info.partitions))
            if missing or time.monotonic() - last_metadata > METADATA_S:
                last_metadata = time.monotonic()
                try:
                    await self._subscribe_all()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - retried: brokers come back
                    log.debug("subscribing %s/%s failed: %s", self.topic, self.subscription, exc)
            if self._failure is not None:
                self._arrived.set()
                return

    async def _subscribe_all(self) -> None:
        """Subscribe every partition not served yet at its leader."""
        cluster = self._cluster
        await cluster.refresh([self.topic])
        info = cluster.topic(self.topic)
        if info is None:
            # A topic that does not exist (not yet, or deleted under the subscriber) is asked
            # about again for unknown_topic_wait_ms, then fails the subscriber; a
            # non-retriable error at once.
            err = cluster.unknown.get(self.topic) or errors.UnknownTopic(f"unknown topic {self.topic!r}")
            now = time.monotonic()
            if self._missing_since is None:
                self._missing_since = now
            if not err.retriable:
                self._failure = err
            elif isinstance(err, errors.UnknownTopic) and now - self._missing_since >= self.unknown_topic_wait:
                self._failure = errors.unknown_topic_after(self.topic, self.unknown_topic_wait)
            return
        self._missing_since = None
        if self._first_count is None:
            self._first_count = info.partitions
        # A partition added since is subscribed as an extension of the subscription: where
        # it lacks the subscription (its topic grown by other means than Admin.add_partitions,
        # which extends it), it is created there from the start with the settings it has.
        known = next(iter(self._configs.values()), None)
        by_leader: dict[tuple[int, bool], list[int]] = {}
        for p in range(info.partitions):
            conn = self._served.get(p)
            if conn is not None and not conn.closed:
                continue
            leader = cluster.leader(self.topic, p)
            if leader >= 0:
                by_leader.setdefault((leader, known is not None and p >= self._first_count), []).append(p)
        await asyncio.gather(*(
            self._subscribe(node, parts, (known, m.Position(kind="earliest")) if added else (self._create, self._start))
            for (node, added), parts in by_leader.items()
        ))

    async def _subscribe(
        self, node: int, partitions: list[int], creating: tuple[SubscriptionConfig | None, m.Position]
    ) -> None:
        try:
            conn = await self._cluster.connection(node)
        except errors.SluiceError as exc:
            log.debug("cannot reach broker %d: %s", node, exc)
            return
        if conn.on_push is None:
            conn.on_push = functools.partial(self._on_push, conn)
            asyncio.ensure_future(self._watch(conn))
        create, start = creating
        req = m.SubscribeRequest(
            topic=self.topic, subscription=self.subscription, partitions=partitions, prefetch=self.prefetch,
            create=create, start=start,
        )
        try:
            resp, _ = await conn.request(req)
        except errors.SluiceError as exc:
            if not exc.retriable and isinstance(exc, errors.BrokerError):
                self._failure = exc
            self._cluster.mark_stale(self.topic)
            return
        for r in resp.partitions:
            if r.error:
                exc = errors.error_for_code(r.error, r.message)
                if not exc.retriable:
                    self._failure = exc
                self._cluster.mark_stale(self.topic)
                continue
            self._serve(r.partition, conn)
            if r.created:
                self.created.add(r.partition)
            if r.config is not None:
                self._configs[r.partition] = r.config
                self._check_settings(r.config)
                if r.config.mode == "ordered":
                    self._ordered_parts.add(r.partition)
                else:
                    self._ordered_parts.discard(r.partition)

    def _check_settings(self, config: SubscriptionConfig) -> None:
        """Warn (once) when the subscription has other settings than those asked for."""
        asked, names = self._asked
        if not names:
            return
        changed = config_differences(asked, [config], names)
        if changed:
            self._asked = (asked, ())
            log.warning(
                "subscription %s of %s exists with other settings, which were not changed: %s",
                self.subscription, self.topic, changed,
            )

    async def _watch(self, conn: Connection) -> None:
        """When a connection goes, its partitions are subscribed again (elsewhere, maybe)."""
        with contextlib.suppress(Exception):
            await conn.wait_closed()
        lost = [p for p, c in self._served.items() if c is conn]
        for p in lost:
            self._lost(p, conn)
        now = time.monotonic()
        if lost and not self._closed and now - self._lost_warned_at >= LOST_WARN_EVERY_S:
            self._lost_warned_at = now
            log.warning(
                "subscription %s of %s: connection to %s:%s lost; subscribing partition(s) %s again "
                "(their unacked messages come again)", self.subscription, self.topic, conn.host, conn.port,
                ",".join(map(str, sorted(lost))),
            )

    def _lost(self, partition: int, conn: Connection | None) -> None:
        """``partition`` is no longer delivered on ``conn``: what it prefetched will be
        redelivered by the leader, so it is dropped here, with the nacks not sent yet;
        subscribe again."""
        if conn is not None and self._served.get(partition) is not conn:
            return
        self._served.pop(partition, None)
        self._sessions.pop(partition, None)
        pending = self._acks.pending.get(partition)
        if pending is not None:  # nacks not sent yet: of deliveries that end here (see _nack)
            pending.drop_nacks()
        ready = self._ready.get(partition)
        if ready:
            for msg in ready:
                msg.settled = True
            ready.clear()
        self._given.pop(partition, None)
        self._changed.set()

    def _serve(self, partition: int, conn: Connection) -> None:
        """``conn`` delivers ``partition``: a new session of it unless it already did."""
        if self._served.get(partition) is not conn:
            self._served[partition] = conn
            self._sessions[partition] = object()

    def _on_push(self, conn: Connection, key: int, _version: int, push, attachments) -> None:
        if key == m.Push.DELIVER and push.topic == self.topic and push.subscription == self.subscription:
            if push.partition not in self._served and not conn.closed:
                # a leader delivers as soon as a partition is attached, maybe before its
                # SUBSCRIBE answer (other partitions still loading): the acks go back here
                self._serve(push.partition, conn)
            self._deliver(conn, push, attachments)
        elif key == m.Push.SUBSCRIPTION_ENDED and push.topic == self.topic and push.subscription == self.subscription:
            exc = errors.error_for_code(push.error, push.message)
            if isinstance(exc, errors.UnknownSubscription) or not exc.retriable:
                self._failure = exc
                self._arrived.set()
            self._lost(push.partition, None)

    def _deliver(self, conn: Connection, push: m.Deliver, attachments) -> None:
        if self._closed:
            return
        partition = push.partition
        ready = self._ready.setdefault(partition, deque())
        deadline = time.monotonic() + max(0.0, push.ack_deadline_ms / 1000 - time.time())
        session = self._sessions.get(partition) if self._served.get(partition) is conn else None
        pos = 0
        for d in push.deliveries:
            data = attachments[pos:pos + d.size]
            pos += d.size
            lo, hi = (d.want[0][0], d.want[-1][1]) if d.want else (0, 0)
            try:
                msgs = decode_records(
                    data, self.topic, partition, lo, max_offset=hi, factory=Message, extra=(d.attempt, deadline, self, session),
                )
            except errors.SluiceError as exc:  # a corrupt batch: nack it, it comes again
                log.warning("undecodable delivery of %s-%d at %d: %s", self.topic, partition, d.base_offset, exc)
                pending = self._acks.pending_for(partition)
                for a, b in d.want:
                    pending.nack_delays.setdefault(-1, RangeSet()).add(a, b)
                continue
            if len(d.want) > 1:
                want = RangeSet(d.want)
                msgs = [msg for msg in msgs if msg.offset in want]
            ready.extend(msgs)
            if len(msgs) != sum(b - a for a, b in d.want):  # compacted away: nothing to hand out
                got = {msg.offset for msg in msgs}
                self._acks.pending_for(partition).acks.extend(
                    o for a, b in d.want for o in range(a, b) if o not in got
                )
        self._arrived.set()
