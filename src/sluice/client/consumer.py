"""The asyncio fetch consumer: assignment, positions, prefetch, commits (DESIGN §3 "Fetch").

A ``Consumer`` reads partitions by offset.  It keeps, per assigned partition, the
*position* (next offset the application gets) and the *fetch offset* (next offset to ask the
broker for); one fetch request per leader is kept in flight ahead of the application, so the
broker's wait overlaps the application's work.  Records are decoded per fetch response with
``records.decode_records`` (a fetch may start inside a batch and end with a partial one).
Half messages of transactions (client/transaction.py) and broker control batches are never
returned, so there is no isolation level to choose: a transactional message becomes
visible only as the copy its commit writes.

With a ``group``, starting positions come from the group's committed offsets and
``commit()`` stores positions (the next offset to read).  A committed offset the broker
answers ``OffsetOutOfRange`` for is not used again: the partition is reset per
``auto_offset_reset``.  Commits coalesce (client/commits.py's ``GroupCommits``).
Group requests go to the group's coordinator, the
leader of its ``__groups`` partition (``Cluster.coordinator_request``); ``NOT_COORDINATOR``
is retriable like a moved leader: metadata is asked again and the request retried.

Riding out faults: after ``start()``, retriable errors (connection lost, broker restarting,
a request timing out, leader moving) never end a read loop at once.  ``getmany`` and
iteration keep retrying with backoff (100 ms doubling to 1 s) and return what they have
when their own timeout passes; ``commit``, ``committed`` and the seeks retry within the call
(a seek while no partition answers; partitions that do not while others do are sought later,
see below).
Only when the broker has failed every attempt for ``retry_timeout_ms`` (default 60 s) does
the error surface, its message saying for how long it was retried.  ``start()`` itself does
not retry: a wrong address fails at once.  An assigned partition that the metadata says does
not exist (its topic unknown, or deleted meanwhile; a partition past the topic's count) is
asked about again for ``unknown_topic_wait_ms`` (default 1 s: a topic may be being created
right then), then ``getmany`` and iteration raise ``UnknownTopic`` / ``UnknownPartition``.
A subscription only reads the topics that exist.

Partition by partition (client/positions.py's ``Positions``): one
partition that cannot be read now (no leader, its leader's broker down) never holds up the
others.  A starting position that cannot be found out now (a
reset or a ``seek_to_*`` asks the partition's leader, and there is none, or it is down) is
warned about once, naming the partition, and asked again in the background with backoff
while the other partitions are read; ``position()`` is None until then.  Only when no
assigned partition has a position does the failure count as the broker failing (surfacing
after ``retry_timeout_ms``, as above).  A partition with a position but no leader is warned
about once and skipped until metadata names a leader again.

The parts a consumer builds and asks, each given its collaborators when built:
``Retries`` (client/retry_policy.py: the retry policy, shared by all), ``Assignment``
(client/assignment.py: the partitions read, kept in step with the metadata),
``GroupCommits`` (with a group), ``Positions`` (asks ``GroupCommits`` for committed offsets,
marks the ``Assignment``'s metadata stale).  The consumer itself keeps the prefetch and the
buffer of records, and hands each call to the part it concerns.

Concurrency: a ``Consumer`` belongs to one event loop; use ``client.sync.SyncConsumer`` from
threads.  ``getmany`` / iteration must not run concurrently with each other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence

from sluice import errors
from sluice.client.assignment import Assignment
from sluice.client.cluster import Cluster
from sluice.client.commits import GroupCommits
from sluice.client.config import ConsumerConfig
from sluice.client.positions import Positions
from sluice.client.retry_policy import Retries
from sluice.client.transport import ConnectionFactory
from sluice.protocol import messages, records

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

TP = tuple[str, int]


class Consumer:
    """Reads records from assigned or subscribed partitions; see the module docstring."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        config: ConsumerConfig | None = None,
        *,
        connection_factory: ConnectionFactory | None = None,
        **options,
    ) -> None:
        """``config``: the settings (client/config.py's ``ConsumerConfig``); keyword
        arguments ``options`` are settings too, over ``config`` or the defaults
        (``Consumer(bootstrap, group="g")``).  ``ConfigError`` for a bad one,
        ``TypeError`` for a keyword that is no setting."""
        config = self.config = ConsumerConfig.of(config, **options)
        self.group = config.group
        self.auto_offset_reset = config.auto_offset_reset
        self.auto_commit = bool(config.enable_auto_commit and config.group)
        self.auto_commit_interval = config.auto_commit_interval_ms / 1000
        self.fetch_max_wait_ms = int(config.fetch_max_wait_ms)
        self.fetch_min_bytes = int(config.fetch_min_bytes)
        self.fetch_max_bytes = int(config.fetch_max_bytes)
        self.max_partition_fetch_bytes = int(config.max_partition_fetch_bytes)
        self.check_crcs = config.check_crcs
        self.request_timeout = config.request_timeout_ms / 1000
        self.retry_timeout = config.retry_timeout_ms / 1000
        self.metadata_max_age = config.metadata_max_age_ms / 1000
        self.unknown_topic_wait = config.unknown_topic_wait_ms / 1000
        self._cluster = Cluster(
            bootstrap,
            connection_factory=connection_factory,
            connect_timeout=config.connect_timeout_ms / 1000,
            request_timeout=self.request_timeout,
        )
        self._retries = Retries(self.retry_timeout)
        self._commits = (
            GroupCommits(self._cluster, config.group, self._retries) if config.group is not None else None
        )
        self._assignment = Assignment(self._cluster, config, self._reassigned)
        self._positions = Positions(self._cluster, config, self._retries, self._commits, self._assignment.stale)
        self._leaderless: set[TP] = set()  # positioned, no leader: warned about once
        self._buffer: deque[list[records.Record]] = deque()
        self._head = 0  # records of _buffer[0] already taken
        self._fetches: dict[int, asyncio.Task] = {}
        self._fetch_done: asyncio.Future | None = None
        self._error: Exception | None = None  # raised by the next getmany
        self._iter: deque[records.Record] = deque()
        self._auto_task: asyncio.Task | None = None
        self._started = False
        self._closing = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect to the bootstrap brokers (called by the first ``getmany`` if need be)."""
        if self._started:
            return
        if self._closed:
            raise errors.ClientClosed("consumer is closed")
        await self._cluster.refresh(self._assignment.topics())
        self._assignment.refreshed(time.monotonic())
        self._started = True
        if self.auto_commit:
            self._auto_task = asyncio.get_running_loop().create_task(
                self._commits.auto_commit_loop(self.auto_commit_interval, self._positions.current)
            )

    async def close(self) -> None:
        """Commit positions (with auto commit), stop fetching, close connections.

        A ``getmany`` waiting meanwhile raises ``ClientClosed``; async iteration ends."""
        if self._closed:
            return
        self._closing = self._retries.closing = True  # the final commit gets one attempt, no retries
        try:
            if self._started and self.auto_commit and self._positions.at:
                try:
                    await self.commit()
                except errors.SluiceError:
                    pass  # best effort on the way out; positions are at-least-once anyway
        finally:
            self._closed = True
            if self._fetch_done is not None and not self._fetch_done.done():
                self._fetch_done.set_result(None)  # a waiting getmany sees the close
            if self._auto_task is not None:
                self._auto_task.cancel()
            for t in self._fetches.values():
                t.cancel()
            await asyncio.gather(*self._fetches.values(), return_exceptions=True)
            await self._cluster.close()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TP]) -> None:
        """Read exactly these (topic, partition) pairs; replaces any assignment.

        ``TypeError`` for anything but an iterable of (str, int) pairs: a bare pair such as
        ``("t", 0)`` is not taken for a list of one."""
        self._assignment.assign(partitions)

    def subscribe(self, topics: Iterable[str]) -> None:
        """Read every partition of ``topics``; partitions added later are picked up.

        ``TypeError`` for anything but an iterable of topic names: a bare name such as
        ``"payments"`` is not taken for its letters."""
        self._assignment.subscribe(topics)

    def assignment(self) -> list[TP]:
        return list(self._assignment.partitions)

    def _reassigned(self, tps: list[TP]) -> None:
        """The assigned partitions become ``tps``: forget the others, add the new ones."""
        keep = set(tps)
        for tp in list(self._positions.at):
            if tp not in keep:
                self._drop(tp)
        self._positions.add(tps)

    def _drop(self, tp: TP) -> None:
        self._positions.drop(tp)
        self._leaderless.discard(tp)
        self._purge(tp)

    def _purge(self, tp: TP) -> None:
        """Drop buffered records of ``tp`` (after a seek, a reset or unassignment)."""
        if self._buffer:
            t, p = tp
            first = self._buffer[0]
            kept = deque()
            for chunk in self._buffer:
                if chunk[0].topic == t and chunk[0].partition == p:
                    continue
                kept.append(chunk)
            self._buffer = kept
            if not kept or kept[0] is not first:
                self._head = 0
        if self._iter:
            # in place: iteration holds on to this deque across awaits
            kept_recs = [r for r in self._iter if (r.topic, r.partition) != tp]
            self._iter.clear()
            self._iter.extend(kept_recs)

    # ------------------------------------------------------------------ positions

    def position(self, tp: TP) -> int | None:
        """Next offset the application will get for ``tp`` (None until initialised).

        Past batches that show nothing (half messages, rollback markers, records compacted
        away) once every record before them was handed out: at the end of a partition
        whose last batches are hidden, the position is its end, not the offset after its
        last visible record."""
        return self._positions.position(tp)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Make ``offset`` the next offset read from (topic, partition)."""
        tp = (topic, partition)
        self._positions.seek(tp, offset)
        self._purge(tp)

    async def seek_to_beginning(self, *tps: TP) -> None:
        await self._seek_to(messages.EARLIEST, tps)

    async def seek_to_end(self, *tps: TP) -> None:
        await self._seek_to(messages.LATEST, tps)

    async def seek_to_time(self, timestamp_ms: int, *tps: TP) -> None:
        """Seek to the first offset with a timestamp >= ``timestamp_ms`` (the end if none)."""
        await self._seek_to(int(timestamp_ms), tps)

    async def _seek_to(self, timestamp: int, tps: Sequence[TP]) -> None:
        """Seek ``tps`` (default: the assignment) to the offsets their leaders give for
        ``timestamp``.  Retried within the call while no partition answers; once some did,
        the partitions that could not (no leader now) get their position later, in the
        background (``Positions.init``), and ``position()`` is None for them until then."""
        await self.start()

        async def resolve() -> tuple[dict[TP, int], dict[TP, errors.SluiceError]]:
            await self._assignment.ensure()
            targets = list(tps) or list(self._assignment.partitions)
            for tp in targets:
                self._positions.check_assigned(tp)
            offsets, failed = await self._positions.resolve(targets, timestamp)
            if failed and not offsets:
                raise next(iter(failed.values()))  # nothing answered: retried within the call
            return offsets, failed

        offsets, failed = await self._retries.retrying(resolve)
        for tp, off in offsets.items():
            self.seek(tp[0], tp[1], off)
        for tp in failed:
            self.seek(tp[0], tp[1], 0)  # drops what was fetched or buffered for tp
            self._positions.sought_later(tp, timestamp)
        self._positions.unresolved_failures(failed, time.monotonic())

    # ------------------------------------------------------------------ group commits

    async def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """Store ``offsets`` (default: current positions) for the group; durable on return.

        Calls coalesce: one commit request runs at a time, in its own task; later calls wait
        for it, then one request carries the latest offsets of all of them.  Cancelling a
        caller cancels only its wait, never the request others wait on.
        """
        if self._commits is None:
            raise errors.ConfigError("commit() needs a consumer group (group=...)")
        if not self._started:
            await self.start()
        if offsets is None:
            offsets = self._positions.to_commit()
        await self._commits.commit(offsets)

    async def committed(self, tp: TP) -> int | None:
        """The group's committed offset for ``tp`` (next offset to read), or None."""
        if self._commits is None:
            raise errors.ConfigError("committed() needs a consumer group (group=...)")
        if not self._started:
            await self.start()
        return await self._commits.committed(tp)

    # ------------------------------------------------------------------ fetching

    async def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        """The records ready, waiting up to ``timeout_ms`` for some: ``getmany``."""
        return await self.getmany(timeout_ms, max_records)

    async def getmany(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        """Records ready now or within ``timeout_ms``, at most ``max_records`` of them.

        Returns ``[]`` on timeout.  Advances positions past the returned records.  Raises a
        fetch error (``OffsetOutOfRange`` with ``auto_offset_reset='error'``, a corrupt
        batch, a non-retriable broker error) once, and ``ClientClosed`` when the consumer is
        closed, also while waiting.  Records an abandoned async iteration had fetched but
        not handed out come first.
        """
        return await self._poll(timeout_ms, max_records, advance=True)

    async def _poll(self, timeout_ms: float, max_records: int | None, advance: bool) -> list:
        if self._closed:
            raise errors.ClientClosed("consumer is closed")
        if not self._started:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            if self._closed:
                raise errors.ClientClosed("consumer closed while waiting for records")
            if self._error is not None:
                exc, self._error = self._error, None
                raise exc
            out = self._take(max_records, advance)
            if out:
                self._maybe_fetch()
                return out
            try:
                await self._assignment.ensure()
                await self._positions.init(self._assignment.partitions, self._assignment.missing)
            except errors.SluiceError as exc:
                if not self._retries.can_retry(exc):
                    raise
                delay = self._retries.failed(exc)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                await asyncio.sleep(min(delay, remaining))
                continue
            if not self._assignment.partitions:
                self._retries.succeeded()  # no fetch will say so
            self._maybe_fetch()
            remaining = deadline - loop.time()
            if remaining <= 0 or not self._fetches:
                if not self._fetches and remaining > 0:
                    await asyncio.sleep(min(remaining, 0.1))  # nothing to fetch: pace
                    continue
                return []
            if self._fetch_done is None or self._fetch_done.done():
                self._fetch_done = loop.create_future()
            waiter = self._fetch_done
            handle = loop.call_later(remaining, _set_none, waiter)
            try:
                await waiter
            finally:
                handle.cancel()

    def _take(self, max_records: int | None, advance: bool) -> list:
        """Pop up to ``max_records`` records (and advance positions past them): first those
        an abandoned iteration left in ``_iter``, then buffered chunks.

        O(records taken): a partly taken chunk stays whole and ``_head`` says how far.
        """
        out: list = []
        it = self._iter
        while it and (max_records is None or len(out) < max_records):
            out.append(it.popleft())
        if out and advance:
            for rec in out:
                self._positions.at[(rec.topic, rec.partition)] = rec.offset + 1
        buf = self._buffer
        positions = self._positions.at
        while buf and (max_records is None or len(out) < max_records):
            chunk, head = buf[0], self._head
            room = len(chunk) - head if max_records is None else max_records - len(out)
            if room < len(chunk) - head:
                part = chunk[head : head + room]
                self._head = head + room
            else:
                part = chunk[head:] if head else chunk
                buf.popleft()
                self._head = 0
            if advance:
                last = part[-1]
                positions[(last.topic, last.partition)] = last.offset + 1
            if out:
                out.extend(part)
            else:
                out = part
        return out

    def _maybe_fetch(self) -> None:
        """Keep one fetch in flight per leader while at most one response is buffered."""
        if len(self._buffer) > 1 or self._closed:
            return
        by_node: dict[int, list[TP]] = {}
        busy = set(self._fetches)
        fetch_offsets = self._positions.fetch_offsets
        leaderless: list[TP] = []
        for tp in self._assignment.partitions:
            if tp not in fetch_offsets:
                continue
            node = self._cluster.leader(*tp)
            if node < 0:
                self._assignment.stale()
                if tp not in self._leaderless:
                    self._leaderless.add(tp)
                    leaderless.append(tp)
                continue
            if tp in self._leaderless:
                self._leaderless.discard(tp)
                log.info("%s-%d has a leader again, reading it", *tp)
            if node not in busy:
                by_node.setdefault(node, []).append(tp)
        if leaderless:
            log.warning(
                "%s: no leader now, reading the other partitions and retrying %s",
                ", ".join(f"{t}-{p}" for t, p in leaderless), "it" if len(leaderless) == 1 else "them",
            )
        loop = asyncio.get_running_loop()
        for node, tps in by_node.items():
            task = loop.create_task(self._fetch(node, tps))
            self._fetches[node] = task

    async def _fetch(self, node: int, tps: list[TP]) -> None:
        try:
            await self._fetch_from(node, tps)
        finally:
            self._fetches.pop(node, None)
            if self._fetch_done is not None and not self._fetch_done.done():
                self._fetch_done.set_result(None)

    async def _fetch_from(self, node: int, tps: list[TP]) -> None:
        # an assign() or seek between _maybe_fetch and this task's start took some away
        positions = self._positions
        tps = [tp for tp in tps if tp in positions.fetch_offsets]
        if not tps:
            return
        epochs = {tp: positions.epochs[tp] for tp in tps}
        offsets = {tp: positions.fetch_offsets[tp] for tp in tps}
        req = messages.FetchRequest(
            partitions=[
                messages.FetchPartition(
                    topic=t,
                    partition=p,
                    offset=offsets[(t, p)],
                    max_bytes=self.max_partition_fetch_bytes,
                )
                for t, p in tps
            ],
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes,
        )
        try:
            conn = await self._cluster.connection(node)
            resp, data = await conn.request(req, (), self.request_timeout)
            self._retries.succeeded()
            self._on_fetch(resp, data, epochs, offsets)
        except asyncio.CancelledError:
            raise
        except errors.SluiceError as exc:
            if self._retries.can_retry(exc):
                self._assignment.stale()
                try:
                    delay = self._retries.failed(exc)
                except errors.SluiceError as final:
                    self._error = final
                else:
                    await asyncio.sleep(delay)  # broker unreachable or busy: do not spin
            else:
                self._error = exc

    def _on_fetch(self, resp, data: memoryview, epochs, offsets) -> None:
        positions = self._positions
        fetch_offsets, skips = positions.fetch_offsets, positions.skips
        pos = 0
        resets: list[TP] = []
        not_yet = None
        for r in resp.partitions:
            tp = (r.topic, r.partition)
            chunk = data[pos : pos + r.size]
            pos += r.size
            if tp not in epochs or positions.epochs.get(tp) != epochs[tp]:
                continue  # sought or unassigned while this fetch was in flight
            if r.error:
                exc = errors.error_for_code(r.error, r.message)
                if isinstance(exc, errors.OffsetOutOfRange) and self.auto_offset_reset != "error":
                    resets.append(tp)  # reset per auto_offset_reset, never to the commit
                elif isinstance(exc, errors.OffsetNotAvailable):
                    not_yet = exc  # a new leader's high watermark is behind: same offset, later
                elif exc.retriable:
                    self._assignment.stale()
                else:
                    self._error = exc
                continue
            if not r.size:
                continue
            start = offsets[tp]
            recs = records.decode_records(chunk, tp[0], tp[1], start, self.check_crcs)
            # Go on after the last whole batch, not after its last record: in a compacted
            # partition a batch may have lost its last records (or all of them), and the
            # offsets up to its end are gone.  The broker always sends the first batch
            # whole, whatever max_bytes says, so no whole batch is a broken answer.
            end = records.end_of_batches(chunk)
            if recs:
                self._buffer.append(recs)
                fetch_offsets[tp] = max(recs[-1].offset + 1, end or 0)
                if end is not None and end > recs[-1].offset + 1:
                    skips[tp] = (recs[-1].offset + 1, end)
            elif end is not None:
                fetch_offsets[tp] = max(start, end)
                if end > start:  # nothing to show: the position moves on without a record
                    skip = skips.get(tp)
                    skips[tp] = (skip[0] if skip is not None and skip[1] == start else start, end)
            else:
                self._error = errors.ProtocolError(
                    f"fetch of {tp} at offset {start} returned {r.size} bytes without a whole batch"
                )
        for tp in resets:
            positions.reset_later(tp)
            self._purge(tp)
        if not_yet is not None:
            raise not_yet  # _fetch backs off, then fetches the same offsets again

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> records.Record:
        """Next record; its position is advanced as it is handed out.  Ends on close."""
        it = self._iter
        while not it:
            if self._closed:
                raise StopAsyncIteration
            try:
                it.extend(await self._poll(self.fetch_max_wait_ms, None, advance=False))
            except errors.ClientClosed:
                raise StopAsyncIteration from None
        rec = it.popleft()
        self._positions.at[(rec.topic, rec.partition)] = rec.offset + 1
        return rec

    async def _next_chunk(self, timeout_ms: float) -> list[records.Record]:
        """For the sync facade's iterator: the records iteration will hand out next (fetched
        into ``_iter`` if it is empty), without advancing positions; ``_handed_out``
        advances past each one as the facade yields it."""
        if not self._iter:
            self._iter.extend(await self._poll(timeout_ms, None, advance=False))
        return list(self._iter)

    def _handed_out(self, rec: records.Record) -> None:
        """``rec`` (from ``_next_chunk``) reached the application: advance past it.  Ignored
        when a seek, reassignment or ``getmany`` took it out of ``_iter`` meanwhile."""
        it = self._iter
        if it and it[0] is rec:
            it.popleft()
            self._positions.at[(rec.topic, rec.partition)] = rec.offset + 1


def _set_none(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
