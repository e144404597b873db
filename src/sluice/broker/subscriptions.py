"""Subscriptions on the broker: the partitions' subscription state, its records, the APIs.

Where the state lives (DESIGN §0): in each data partition's own log, as control batches
(protocol/subscriptions.py).  The leader of a partition serves its subscriptions: it
loads them when first asked (``PartitionSubscriptions.load``: a scan of the log from the
newest snapshot on, off the event loop), delivers from its own log, and appends the
subscriptions whose state changed every ``FLUSH_S`` in one control batch (acks are
group-committed: a crash loses at most the acks of the last ``FLUSH_S`` and the write,
which means those messages are delivered again — never lost).  What a load cannot read
from the records (the read position, key-ordered messages waiting behind a retry) it
rebuilds by reading the log before answering anyone (``SubscriptionPartition.catch_up``),
so describe tells the same before and after a restart.  Creations, deletions and
seeks are written before they are answered.  When leadership moves, the old leader ends
its consumers' subscriptions (SUBSCRIPTION_ENDED: NOT_LEADER) and the new leader reads
the state from its own copy of the log.

Dead letters: a message delivered ``max_attempts`` times without an ack is copied to the
topic ``<topic>.<subscription>.dlq`` (created with one partition when missing) with the
``sluice.dlq.*`` headers, through a producer of the broker's own with ``acks=all``; only
once the copy is acknowledged is the message acked in the source.  A subscription that can
dead-letter (``max_attempts`` > 0) is created only if that name is a legal topic name and
no other subscription's dead-letter topic (``check_new``).

Concurrency: event loop only; scans and reads run in the broker's read executor.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sluice.broker.peer import Peer
from sluice.broker.session import Session
from sluice.broker.subscription import SubscriptionPartition
from sluice.errors import (
    BrokerError,
    InvalidSubscription,
    NotLeader,
    SubscriptionAlreadyExists,
    TopicAlreadyExists,
    UnknownSubscription,
    UnknownTopic,
)
from sluice.protocol import messages as m
from sluice.protocol import subscriptions as sub
from sluice.protocol.ranges import Pairs, RangeSet, count
from sluice.protocol.records import (
    CONTROL_BIT,
    decode_batch,
    decode_records,
    iter_batches,
    validate_batches,
)
from sluice.storage.log import OutOfRange

log = logging.getLogger("sluice.broker.subscriptions")

FLUSH_S = 0.01  # how often changed cursors are appended (group commit of acks)
SNAPSHOT_CHECK_S = 1.0  # how often a partition with subscriptions checks for a new segment
# A log this large that holds no snapshot gets one of no subscription when loaded, so that
# the next load does not read all of it again; a smaller one is read again (cheaper than a
# record every reader and every group's lag would see).
EMPTY_SNAPSHOT_BYTES = 64 * 1024 * 1024
SCAN_BYTES = 4 * 1024 * 1024
CLOSE_FLUSH_S = 5.0
DLQ_PARTITIONS = 1


def _now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------- log scans


def _cursor_batches(plog, start: int, stop: int, where: list[tuple[int, int]]) -> list[tuple[bool, list[sub.CursorState]]]:
    """Worker thread: the subscription batches of ``plog`` in ``[start, stop)``, in order;
    their (base offset, record count) are added to ``where``."""
    out = []
    offset = start
    while offset < stop:
        data = plog.read(offset, SCAN_BYTES, stop).data
        nxt = None
        for h, pos in iter_batches(data, check_crc=False):
            nxt = h.next_offset
            if nxt <= offset or not h.attributes & CONTROL_BIT:
                continue
            found = sub.read_cursor_records(decode_batch(data, h, pos))
            if found is not None:
                out.append(found)
                where.append((h.base_offset, h.records_count))
        if nxt is None:
            break
        offset = nxt
    return out


def scan_states(plog, end: int) -> tuple[dict[str, sub.CursorState], bool, list[tuple[int, int]], int]:
    """Worker thread: every subscription of the partition as of log offset ``end``: the
    newest snapshot and the records after it (segments are scanned newest first until
    one holds a snapshot; the whole log when none does).  Also whether a snapshot was
    found, where the subscription batches read are (base offset, record count), and the
    offset from which those are all of them (the start of the oldest segment read)."""
    later: list = []
    where: list[tuple[int, int]] = []
    bases = plog.view.bases
    for i in range(len(bases) - 1, -1, -1):
        start = max(bases[i], plog.log_start_offset)
        stop = min(bases[i + 1] if i + 1 < len(bases) else end, end)
        found = _cursor_batches(plog, start, stop, where) if start < stop else []
        combined = found + later
        snaps = [k for k, (snap, _) in enumerate(found) if snap]
        if snaps:
            return sub.fold(combined[snaps[-1]:]), True, sorted(where), start
        later = combined
    return sub.fold(later), False, sorted(where), plog.log_start_offset


# --------------------------------------------------------------------------- one partition


class PartitionSubscriptions:
    """The subscriptions of one partition this broker leads, in one leader epoch."""

    def __init__(self, manager: SubscriptionManager, part, ordinary: bool = True) -> None:
        self.manager = manager
        self.part = part
        self.ordinary = ordinary  # not: a compacted topic's, loaded to describe or delete what is stranded
        self.epoch = part.leader_epoch
        self.subs: dict[str, SubscriptionPartition] = {}
        self.loaded: asyncio.Future = asyncio.get_running_loop().create_future()
        self.lock = asyncio.Lock()  # creations, deletions, seeks
        self.closed = False
        self._dirty: set[SubscriptionPartition] = set()
        self._snapshot_base: int | None = None  # the segment holding the newest snapshot
        self._need_snapshot = False  # a large log holds none: write one, even of no subscription
        # (offset, count) of every subscription batch from records_low up (``records_unsettled``)
        self.records: list[tuple[int, int]] = []
        self.records_low = 0  # set by the load
        self._writing = 0  # subscription records being appended now
        self._cover_lock = asyncio.Lock()
        self._pinned: int | None = None  # a scan completing records down to here is running
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._flusher: asyncio.Task | None = None

    @property
    def current(self) -> bool:
        p = self.part
        return not self.closed and p.is_leader and p.leader_epoch == self.epoch

    async def load(self) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            states, found, where, covered = await loop.run_in_executor(
                self.manager.executor, scan_states, self.part.log, self.part.log_end_offset
            )
            low = min((st.confirmed for st in states.values()), default=self.part.high_watermark)
            self.records = [w for w in where if w[0] + w[1] > low]  # not messages: no backlog
            self.records_low = max(covered, low)
            for state in states.values():
                self.subs[state.name] = SubscriptionPartition(self, state)
            for sp in list(self.subs.values()):
                await sp.catch_up()
        except BaseException as exc:
            if not self.loaded.done():
                self.loaded.set_exception(exc if isinstance(exc, Exception) else NotLeader("load cancelled"))
            raise
        if self.closed:
            return  # closed meanwhile (leadership moved): ``close`` answered the waiters
        if states:
            log.info(
                "loaded %d subscription(s) of %s-%d in %.0f ms", len(states), self.part.topic,
                self.part.index, (time.monotonic() - started) * 1000,
            )
        # so that the next load of a large log reads only its newest segments (but nothing
        # is written into a compacted topic for a subscription it does not have)
        self._need_snapshot = not found and self.ordinary and self.part.log.size_bytes >= EMPTY_SNAPSHOT_BYTES
        for sp in self.subs.values():
            sp.start()
        self._flusher = loop.create_task(self._flush_loop(), name=f"cursors {self.part.topic}-{self.part.index}")
        self.loaded.set_result(None)

    def mark_dirty(self, sp: SubscriptionPartition) -> None:
        self._dirty.add(sp)
        self._changed.set()

    def track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ writing

    async def write(self, states: list[sub.CursorState], snapshot: bool = False, acks_all: bool = True) -> None:
        """Append subscription records to the partition (``acks_all``: answered once in
        every in-sync replica)."""
        part = self.part
        data = bytearray(sub.cursor_batch(states, _now_ms(), snapshot))
        spans = validate_batches(data, max(len(data), part.config.max_message_bytes), broker=True)
        base = part.log.active.base_offset
        n = len(states) + snapshot
        self._writing += n  # counted from now: the high watermark may pass them before we resume
        try:
            result = await part.append(data, spans, acks_all=acks_all)
        finally:
            self._writing -= n
        if snapshot:
            self._snapshot_base = base
        self.records.append((result.base_offset, n))
        if len(self.records) > 64:  # those every subscription has read past count no more
            low = min((sp.next_read for sp in self.subs.values()), default=part.high_watermark)
            if self._pinned is not None:
                low = min(low, self._pinned)
            self.records = [r for r in self.records if r[0] + r[1] > low]
            self.records_low = max(self.records_low, low)

    def records_unsettled(self, cursor) -> int:
        """How many subscription records ``cursor`` has not settled (passed), counting those
        being appended now: a backlog counts messages, not them.  Exact for a cursor whose
        subscription reads from ``records_low`` up (``cover``): below its read position
        every record is settled."""
        return sum(count(cursor.unsettled(at, at + n)) for at, n in self.records) + self._writing

    async def cover(self, sps: list[SubscriptionPartition]) -> None:
        """Complete ``records`` down to where ``sps`` read from (the log start at least).
        A subscription can read from below ``records_low`` — a seek back, a creation at an
        earlier position, a load whose newest snapshot lies above a cursor — and the list is
        trimmed to what the subscriptions have not read past, so the log below it is
        scanned then, off the event loop (describe calls this: only it pays for the scan).
        On return ``records`` is complete for every one of ``sps``."""
        async with self._cover_lock:
            while sps:
                low = max(min(sp.next_read for sp in sps), self.part.log_start_offset)
                high = self.records_low
                if low >= high:
                    return
                where: list[tuple[int, int]] = []
                self._pinned = low  # kept by any trimming meanwhile
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        self.manager.executor, _cursor_batches, self.part.log, low, high, where
                    )
                except OutOfRange:
                    continue  # retention moved the log start: from there
                finally:
                    self._pinned = None
                known = {at for at, _ in self.records}  # one written as the scan ran may be in both
                self.records[:0] = [w for w in sorted(where) if w[0] not in known]
                self.records_low = low

    async def _flush_loop(self) -> None:
        """Write changed cursors ``FLUSH_S`` after the first change (group commit), and
        look every ``SNAPSHOT_CHECK_S`` whether the log rolled a segment (a snapshot due)."""
        while True:
            try:
                async with asyncio.timeout(SNAPSHOT_CHECK_S):
                    await self._changed.wait()
                await asyncio.sleep(FLUSH_S)
            except TimeoutError:
                pass
            self._changed.clear()
            await self.flush()

    async def flush(self) -> None:
        """Append the changed cursors; a snapshot of all when the log rolled a segment
        since the last one.  A failed append keeps them changed (retried next time)."""
        wanted = bool(self.subs) or self._need_snapshot
        snapshot = wanted and self._snapshot_base != self.part.log.active.base_offset
        if not self._dirty and not snapshot:
            return
        dirty, self._dirty = self._dirty, set()
        chosen = list(self.subs.values()) if snapshot else [sp for sp in dirty if not sp.closed]
        try:
            if chosen or snapshot:
                await self.write([sp.state(full=snapshot) for sp in chosen], snapshot=snapshot, acks_all=False)
                self._need_snapshot = self._need_snapshot and not snapshot
        except BaseException as exc:
            self._dirty |= dirty
            for sp in chosen:
                sp.unwritten()  # the retries journaled in it: the next record holds them all
            if not isinstance(exc, BrokerError):
                raise
            log.warning("cannot write the cursors of %s-%d: %s; retrying", self.part.topic, self.part.index, exc)
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ admin

    async def position(self, pos: m.Position) -> int:
        part = self.part
        start, hw = part.log_start_offset, part.high_watermark
        if pos.kind == "earliest":
            return start
        if pos.kind == "latest":
            return hw
        if pos.kind == "offset":
            return min(max(pos.value, start), hw)
        if pos.kind == "time":
            found = await part.offset_for_time(pos.value)
            return hw if found is None else max(found, start)
        raise InvalidSubscription(f"position must be earliest, latest, offset or time, not {pos.kind!r}")

    async def create(self, name: str, config: sub.SubscriptionConfig, start: m.Position) -> SubscriptionPartition:
        async with self.lock:
            if name in self.subs:
                raise SubscriptionAlreadyExists(
                    f"subscription {name!r} already exists on {self.part.topic}-{self.part.index}"
                )
            offset = await self.position(start)
            state = sub.CursorState(name=name, config=config, confirmed=offset, created_ms=_now_ms())
            await self.write([state])
            self._check_current()
            sp = self.subs[name] = SubscriptionPartition(self, state)
            sp.start()
            return sp

    async def delete(self, name: str) -> None:
        async with self.lock:
            sp = self.get(name)
            await self.write([sub.CursorState(name=name, deleted=True)])
            sp.close(UnknownSubscription(f"subscription {name!r} was deleted"))
            self.subs.pop(name, None)
            self._dirty.discard(sp)

    async def seek(self, name: str, pos: m.Position) -> int:
        """Move ``name``'s cursor to ``pos`` (an offset outside the log: its nearest end);
        returns the offset it went to."""
        async with self.lock:
            sp = self.get(name)
            offset = await self.position(pos)
            sp.seek(offset)
            self._dirty.discard(sp)
            await self.write([sp.state(full=True)])
            return offset

    def get(self, name: str) -> SubscriptionPartition:
        sp = self.subs.get(name)
        if sp is None:
            raise UnknownSubscription(f"{self.part.topic}-{self.part.index} has no subscription {name!r}")
        return sp

    def _check_current(self) -> None:
        if not self.current:
            raise NotLeader(f"{self.part.topic}-{self.part.index} changed leader")

    # ------------------------------------------------------------------ dead letters

    async def dead_letter(self, sp: SubscriptionPartition, ranges: Pairs, attempts: int, reason: str) -> None:
        """Copy the messages at ``ranges`` to the dead-letter topic; returns once the copies
        are acknowledged by every in-sync replica."""
        part = self.part
        wanted = RangeSet(ranges)
        records = []
        offset = wanted.starts[0]
        end = wanted.ends[-1]
        while offset < end:
            data = (await part.read(offset, SCAN_BYTES, part.high_watermark)).data
            recs = decode_records(data, part.topic, part.index, offset)
            records.extend(r for r in recs if r.offset in wanted)
            nxt = max((h.next_offset for h, _ in iter_batches(data, check_crc=False)), default=None)
            if nxt is None or nxt <= offset:
                break
            offset = nxt
        topic = sub.dlq_topic(part.topic, sp.name)
        await self.manager.ensure_topic(topic)
        producer = await self.manager.producer()
        headers = [
            (sub.DLQ_TOPIC, part.topic.encode()), (sub.DLQ_PARTITION, str(part.index).encode()),
            (sub.DLQ_SUBSCRIPTION, sp.name.encode()), (sub.DLQ_ATTEMPTS, str(attempts).encode()),
            (sub.DLQ_REASON, reason.encode()),
        ]
        futures = [
            await producer.send(
                topic, r.value, key=r.key,
                headers=[*r.headers, *headers, (sub.DLQ_OFFSET, str(r.offset).encode())],
            )
            for r in records
        ]
        await asyncio.gather(*futures)
        log.warning(
            "dead-lettered %d message(s) of %s-%d for subscription %s to %s after %d attempt(s): %s",
            len(records), part.topic, part.index, sp.name, topic, attempts, reason,
        )

    # ------------------------------------------------------------------ lifecycle

    async def close(self, exc: BrokerError | None, flush: bool = False) -> None:
        """Stop: end the consumers' subscriptions with ``exc``; with ``flush`` write the
        changed cursors first (a broker stopping, still the leader)."""
        if self.closed:
            return
        if flush and self.current and self.loaded.done():
            try:
                async with asyncio.timeout(CLOSE_FLUSH_S):
                    await self.flush()
            except Exception as e:  # noqa: BLE001 - the next leader redelivers: never a loss
                log.warning("cursors of %s-%d not written at close: %s", self.part.topic, self.part.index, e)
        self.closed = True
        if self._flusher is not None:
            self._flusher.cancel()
        for task in list(self._tasks):
            task.cancel()
        for sp in self.subs.values():
            sp.close(exc)
        if not self.loaded.done():
            self.loaded.set_exception(exc or NotLeader("closed"))
            self.loaded.exception()  # retrieved: nobody may be waiting


# --------------------------------------------------------------------------- the broker's


class SubscriptionManager:
    """The subscriptions of the partitions this broker leads, and their APIs."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.executor = broker.read_executor
        self._parts: dict[tuple[str, int], PartitionSubscriptions] = {}
        self._sessions: dict[tuple[int, str, str], Session] = {}
        self._producer = None
        self._producer_lock = asyncio.Lock()
        self._admin = None

    def handlers(self) -> dict:
        return {
            m.Api.SUBSCRIBE: self.subscribe,
            m.Api.ACK: self.ack,
            m.Api.CREATE_SUBSCRIPTION: self.create,
            m.Api.DELETE_SUBSCRIPTION: self.delete,
            m.Api.SEEK_SUBSCRIPTION: self.seek,
            m.Api.DESCRIBE_SUBSCRIPTIONS: self.describe,
        }

    def refusal(self, topic: str) -> InvalidSubscription | None:
        """Why ``topic`` cannot have subscriptions (internal or compacted), or None."""
        topic_obj = self.broker.topic(topic)
        if topic_obj.internal or topic_obj.config.cleanup_policy == "compact":
            return InvalidSubscription(
                f"topic {topic!r} is {'internal' if topic_obj.internal else 'compacted'}: subscriptions need "
                "an ordinary topic (read compacted topics with a fetch consumer)"
            )
        return None

    async def partition(self, topic: str, index: int, stranded: bool = False) -> PartitionSubscriptions:
        """The loaded subscriptions of ``topic``-``index``; ``NotLeader`` unless led here,
        ``InvalidSubscription`` if the topic cannot have subscriptions — checked on every
        call, since a topic's config changes under its loaded state (an ordinary topic
        whose subscriptions were looked at may be compacted since).  ``stranded``: a
        compacted topic's too (subscriptions stranded on a topic that became compacted
        at a restart, ``--topic-default``, can still be described and deleted)."""
        part = self.broker.led_partition(topic, index)
        refused = self.refusal(topic)
        if refused is not None and not (stranded and not self.broker.topic(topic).internal):
            raise refused
        key = (topic, index)
        ps = self._parts.get(key)
        if ps is not None and (ps.part is not part or not ps.current):
            await self._drop(key, NotLeader(f"{topic}-{index} changed leader"))
            ps = None
        if ps is None:
            ps = self._parts[key] = PartitionSubscriptions(self, part, ordinary=refused is None)
            task = asyncio.ensure_future(ps.load())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.shield(ps.loaded)
        except Exception:
            if self._parts.get(key) is ps:  # a failed load (a read error): the next call tries again
                del self._parts[key]
            raise
        if not ps.current:
            raise NotLeader(f"{topic}-{index} changed leader")
        return ps

    async def _drop(self, key: tuple[str, int], exc: BrokerError, flush: bool = False) -> None:
        ps = self._parts.pop(key, None)
        if ps is not None:
            await ps.close(exc, flush)

    def leadership_changed(self, part) -> None:
        """A partition held here began or stopped leading: a stale state is dropped."""
        key = (part.topic, part.index)
        ps = self._parts.get(key)
        if ps is not None and not ps.current:
            asyncio.ensure_future(self._drop(key, NotLeader(f"{part.topic}-{part.index} changed leader")))

    async def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._parts if k[0] == topic]:
            await self._drop(key, UnknownSubscription(f"topic {topic!r} was deleted"))

    async def close(self) -> None:
        """Broker stopping: write what changed, end every subscription."""
        await asyncio.gather(*(
            self._drop(key, NotLeader("the broker is shutting down"), flush=True) for key in list(self._parts)
        ))
        if self._producer is not None:
            await self._producer.close()
        if self._admin is not None:
            await self._admin.close()

    # ------------------------------------------------------------------ dead-letter writes

    async def ensure_topic(self, name: str) -> None:
        b = self.broker
        if name in b.topics:
            return
        try:
            async with b._admin_lock:
                if name not in b.topics:
                    await b._create_topic(m.NewTopic(name=name, partitions=DLQ_PARTITIONS), validate_only=False)
        except TopicAlreadyExists:
            pass

    async def producer(self):
        from sluice.client.producer import Producer  # the broker's own client, made on first use

        async with self._producer_lock:
            if self._producer is None:
                producer = Producer(f"{self.broker.host}:{self.broker.port}", acks="all", linger_ms=1)
                await producer.start()
                self._producer = producer
            return self._producer

    # ------------------------------------------------------------------ cluster-wide checks

    async def names(self, topic: str) -> set[str]:
        """The subscriptions of ``topic`` (none if it is gone, compacted or internal),
        asked of each partition's leader through an admin client of the broker's own:
        other brokers may lead them.  Never call it holding a partition's ``lock``."""
        if self._admin is None:
            from sluice.client.admin import Admin  # the broker's own client, made on first use

            self._admin = Admin(f"{self.broker.host}:{self.broker.port}")
        try:
            infos = await self._admin.describe_subscription(topic)
        except (UnknownTopic, InvalidSubscription):
            return set()
        return {i.subscription for i in infos}

    async def check_new(self, topic: str, name: str, config: sub.SubscriptionConfig) -> None:
        """Refuse (``InvalidSubscription``) to create a subscription that can dead-letter
        whose dead-letter topic name is too long, or is the dead-letter topic of another
        existing subscription (whose dead letters a re-drive would mix up).  Checked
        before creating, so two such creations at the same moment may both pass."""
        if not config.max_attempts:
            return  # never dead-letters: no dead-letter topic
        dlq = sub.check_dlq_topic(topic, name)
        for other, other_name in sub.dlq_sharers(topic, name):
            if other in self.broker.topics and other_name in await self.names(other):
                raise InvalidSubscription(
                    f"subscription {name!r} of topic {topic!r} would dead-letter into {dlq!r}, the "
                    f"dead-letter topic of subscription {other_name!r} of topic {other!r}; choose another name"
                )

    # ------------------------------------------------------------------ handlers

    async def _each(
        self, topic: str, partitions: list[int], fn, stranded: bool = False,
    ) -> list[m.SubscriptionPartitionResult]:
        """``fn(ps)`` for each partition: its result (None: a bare success); per-partition
        errors in the results.  ``stranded``: see ``partition``."""
        self.broker.topic(topic)

        async def one(p: int) -> m.SubscriptionPartitionResult:
            try:
                got = await fn(await self.partition(topic, p, stranded))
            except BrokerError as exc:
                return m.SubscriptionPartitionResult(partition=p, error=exc.code, message=exc.message)
            return got if got is not None else m.SubscriptionPartitionResult(partition=p)

        return list(await asyncio.gather(*(one(p) for p in partitions)))

    async def subscribe(self, req: m.SubscribeRequest, _att, peer: Peer):
        sub.check_name(req.subscription)
        create = sub.check_config(req.create) if req.create is not None else None
        conn = peer
        key = (id(conn), req.topic, req.subscription)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session(conn, req.topic, req.subscription, req.prefetch)
            conn.on_close(lambda: self._session_closed(key))
        session.prefetch = max(1, req.prefetch)
        check = _Once(lambda: self.check_new(req.topic, req.subscription, create))

        async def attach(ps: PartitionSubscriptions):
            sp = ps.subs.get(req.subscription)
            created = False
            if sp is None:
                if create is None:
                    ps.get(req.subscription)  # raises UnknownSubscription
                await check()
                try:
                    sp = await ps.create(req.subscription, create, req.start)
                    created = True
                except SubscriptionAlreadyExists:
                    sp = ps.get(req.subscription)
            if session.closed:
                raise NotLeader("the connection closed")
            sp.attach(session)
            return m.SubscriptionPartitionResult(partition=ps.part.index, config=sp.config, created=created)

        results = await self._each(req.topic, req.partitions, attach)
        return m.SubscribeResponse(partitions=results), ()

    def _session_closed(self, key) -> None:
        session = self._sessions.pop(key, None)
        if session is None:
            return
        session.closed = True
        for sp in list(session.parts.values()):
            sp.detach(session)
        session.parts.clear()

    async def ack(self, req: m.AckRequest, _att, _peer: Peer):
        results = []
        for ap in req.partitions:
            ps = self._parts.get((req.topic, ap.partition))
            try:
                if ps is None or not ps.current or not ps.loaded.done():
                    raise NotLeader(f"{req.topic}-{ap.partition} is not served here (a new leader?)")
                ps.get(req.subscription).settle(ap)
            except BrokerError as exc:
                results.append(m.SubscriptionPartitionResult(partition=ap.partition, error=exc.code, message=exc.message))
                continue
            results.append(m.SubscriptionPartitionResult(partition=ap.partition))
        return m.AckResponse(partitions=results), ()

    async def create(self, req: m.CreateSubscriptionRequest, _att, _peer: Peer):
        sub.check_name(req.subscription)
        config = sub.check_config(req.config)
        check = _Once(lambda: self.check_new(req.topic, req.subscription, config))

        async def create(ps: PartitionSubscriptions):
            if req.subscription not in ps.subs:
                await check()
            try:
                sp = await ps.create(req.subscription, config, req.start)
            except SubscriptionAlreadyExists:
                if not req.if_not_exists:
                    raise
                sp = ps.get(req.subscription)
            return m.SubscriptionPartitionResult(partition=ps.part.index, config=sp.config)

        return m.CreateSubscriptionResponse(partitions=await self._each(req.topic, req.partitions, create)), ()

    async def delete(self, req: m.DeleteSubscriptionRequest, _att, _peer: Peer):
        sub.check_name(req.subscription)

        async def delete(ps: PartitionSubscriptions):
            await ps.delete(req.subscription)

        results = await self._each(req.topic, req.partitions, delete, stranded=True)
        return m.DeleteSubscriptionResponse(partitions=results), ()

    async def seek(self, req: m.SeekSubscriptionRequest, _att, _peer: Peer):
        sub.check_name(req.subscription)

        async def seek(ps: PartitionSubscriptions):
            offset = await ps.seek(req.subscription, req.position)
            return m.SubscriptionPartitionResult(partition=ps.part.index, offset=offset)

        return m.SeekSubscriptionResponse(partitions=await self._each(req.topic, req.partitions, seek)), ()

    async def describe(self, req: m.DescribeSubscriptionsRequest, _att, _peer: Peer):
        if req.subscription is not None:
            sub.check_name(req.subscription)
        if req.subscription is None and self.refusal(req.topic) is not None:
            # a topic that cannot have subscriptions has none to list (its log is not
            # scanned for any stranded there: name one to describe or delete it)
            return m.DescribeSubscriptionsResponse(subscriptions=[]), ()
        out: list[m.SubscriptionPartitionInfo] = []
        for p in req.partitions:
            try:
                ps = await self.partition(req.topic, p, stranded=True)
                sps = [ps.get(req.subscription)] if req.subscription is not None else list(ps.subs.values())
                await ps.cover(sps)
                out.extend(sp.info() for sp in sps)  # at once: complete as cover left them
            except BrokerError as exc:
                out.append(m.SubscriptionPartitionInfo(
                    subscription=req.subscription or "", partition=p, error=exc.code, message=exc.message,
                ))
        return m.DescribeSubscriptionsResponse(subscriptions=out), ()


class _Once:
    """``await once()`` runs ``make()`` the first time only; every caller gets its outcome
    (a request's partitions share one check)."""

    def __init__(self, make) -> None:
        self._make = make
        self._task: asyncio.Future | None = None

    async def __call__(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._make())
        await asyncio.shield(self._task)
