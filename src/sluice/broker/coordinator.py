"""GroupCoordinator: the committed offsets of the groups this broker coordinates.

Committed offsets live in the internal topic ``__groups`` (protocol/group_records.py has
the record layout, protocol/coordinator.py the group -> partition hash).  A broker
coordinates the groups of the ``__groups`` partitions it leads, and keeps for each of them
a cache built by reading that partition's log: ``load(p)`` when it becomes the leader of
``__groups``-p, ``unload(p)`` when it stops.  Everything else is answered from the caches.

Writes: a commit, a group deletion or a topic deletion appends records (tombstones for
deletions) to the group's partition through its normal path (``Partition.append`` with
``acks_all``: answered once the high watermark passes them), and the cache takes them only
once that append succeeded.  Caches are updated by callbacks run in the order the appends
complete, which is their log order, so a cache always equals what reading the log up to
the high watermark gives.  A commit is answered after the append: acknowledged means in
the log (fsynced with ``flush.messages=1``, in every in-sync replica with replication).

A group exists from its first commit until it is deleted; deleting it writes a tombstone
for every offset it has, including those of commits still being written (they are before
the tombstones in the log); a commit after a deletion starts the group again from nothing.

Errors: a group whose partition this broker does not lead, or leads but is still loading,
is answered with ``NotCoordinator`` (retriable: the client refreshes metadata and asks
the leader).  A failed append fails the request with its error and changes nothing.

Concurrency: event loop only; the log is read for ``load`` in the given executor.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor

from sluice.broker.partition import Partition
from sluice.errors import (
    CorruptRecord,
    InvalidGroup,
    MessageTooLarge,
    NotCoordinator,
    NotLeader,
    RequestTimedOut,
    UnknownGroup,
)
from sluice.protocol.coordinator import GROUPS_TOPIC, group_partition
from sluice.protocol.group_records import (
    Committed,
    OffsetKey,
    build_offsets_batches,
    decode_offset_record,
)
from sluice.protocol.records import BatchTooLarge, decode_records, iter_batches, validate_batches

log = logging.getLogger("sluice.broker")

# How long a commit or deletion waits for its append (the high watermark) before it is
# answered REQUEST_TIMED_OUT; the records may still land, and the cache then takes them.
WRITE_TIMEOUT_S = 10.0  # below the clients' default request timeout (30 s)
LOAD_READ_BYTES = 4 * 1024 * 1024  # per read while loading a partition

_GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")

Offsets = dict[tuple[str, int], Committed]


def check_group_name(name: str) -> None:
    if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
        raise InvalidGroup(f"invalid group name {name!r}: use 1-200 characters from A-Z a-z 0-9 . _ -")


class _Cache:
    """The groups of one loaded ``__groups`` partition: committed offsets as of the last
    completed append, and the keys of appends still in flight (for deletions)."""

    def __init__(self, groups: dict[str, Offsets]) -> None:
        self.groups = groups
        self.writing: dict[str, Counter] = {}  # group -> (topic, partition) -> appends in flight

    def apply(self, key: OffsetKey, value: Committed | None) -> None:
        """Take one record, as reading the log does: the latest record of a key wins."""
        tp = (key.topic, key.partition)
        if value is not None:
            self.groups.setdefault(key.group, {})[tp] = value
            return
        offsets = self.groups.get(key.group)
        if offsets is not None:
            offsets.pop(tp, None)
            if not offsets:
                del self.groups[key.group]


def read_partition_blocking(part: Partition, end: int) -> tuple[dict[str, Offsets], int]:
    """Worker thread: the groups of a ``__groups`` partition, by reading its log from the
    log start to ``end``; also how many unreadable records were skipped (logged)."""
    cache = _Cache({})
    plog = part.log
    offset, bad = plog.log_start_offset, 0
    while offset < end:
        data = plog.read(offset, LOAD_READ_BYTES, end).data
        if not data:
            break
        view = memoryview(data)
        for h, pos in iter_batches(data, check_crc=False):
            try:
                records = decode_records(view[pos : pos + h.size], part.topic, part.index, offset, False)
            except CorruptRecord as exc:  # a whole batch unreadable: the rest still loads
                bad += h.records_count
                log.error(
                    "skipped batch %d-%d of %s-%d: %s", h.base_offset, h.next_offset - 1, part.topic, part.index, exc,
                )
                continue
            for rec in records:
                try:
                    entry = decode_offset_record(rec)
                except CorruptRecord as exc:
                    bad += 1
                    log.error("skipped record %d of %s-%d: %s", rec.offset, part.topic, part.index, exc)
                    continue
                if entry is not None:
                    cache.apply(entry.key, entry.value)
        offset = _next_offset(data)
    return cache.groups, bad


def _next_offset(data: bytes) -> int:
    """The offset after the last whole batch of ``data`` (offsets may have gaps where
    compaction removed records)."""
    last = None
    for h, _ in iter_batches(data, check_crc=False):
        last = h
    return last.next_offset


class GroupCoordinator:
    """Committed offsets of the groups of the ``__groups`` partitions this broker leads.

    ``partition(p)`` gives this broker's replica of ``__groups``-p, or None when it holds
    none; ``partitions`` is the partition count of ``__groups``.
    """

    def __init__(
        self, partition: Callable[[int], Partition | None], partitions: int, executor: Executor, node_id: int = 0
    ) -> None:
        self._partition = partition
        self.partitions = partitions
        self._executor = executor
        self._node_id = node_id
        self._caches: dict[int, _Cache] = {}  # loaded partitions
        self._loads: dict[int, object] = {}  # partition -> token of the load under way

    # ------------------------------------------------------------------ leadership

    async def load(self, p: int) -> None:
        """This broker became the leader of ``__groups``-p: rebuild the partition's cache by
        reading its log from the log start to the log end, off the event loop.  Its groups
        answer ``NotCoordinator`` ("loading") until done.  An ``unload`` (or a newer
        ``load``) meanwhile wins: this one then leaves no cache behind.

        Call it when leadership begins, with none of this broker's group writes in flight
        to the partition (a leader that steps down fails them: ``Partition.make_follower``);
        a write still in flight could land after the read and be missing from the cache."""
        part = self._partition(p)
        if part is None:
            raise NotCoordinator(f"this broker holds no replica of {GROUPS_TOPIC}-{p}")
        token = object()
        self._caches.pop(p, None)
        self._loads[p] = token
        started = time.monotonic()
        try:
            groups, bad = await asyncio.get_running_loop().run_in_executor(
                self._executor, read_partition_blocking, part, part.log_end_offset
            )
        except BaseException:
            if self._loads.get(p) is token:
                del self._loads[p]
            raise
        if self._loads.get(p) is not token:
            return  # unloaded, or loaded anew, meanwhile
        del self._loads[p]
        if not _led(part):
            return
        self._caches[p] = _Cache(groups)
        log.info(
            "loaded %d group(s) from %s-%d in %.0f ms%s", len(groups), GROUPS_TOPIC, p,
            (time.monotonic() - started) * 1000, f" ({bad} unreadable record(s) skipped)" if bad else "",
        )

    def unload(self, p: int) -> None:
        """This broker no longer leads ``__groups``-p: drop its cache; its groups answer
        ``NotCoordinator`` from now on.  Appends still in flight complete or fail on
        their own and no longer touch any cache."""
        self._caches.pop(p, None)
        self._loads.pop(p, None)

    def led(self) -> list[int]:
        """The ``__groups`` partitions this broker leads and has loaded."""
        return sorted(p for p in self._caches if _led(self._partition(p)))

    # ------------------------------------------------------------------ reads

    def _cache(self, group: str) -> tuple[int, _Cache]:
        """The partition and cache of ``group``: ``InvalidGroup`` for a bad name,
        ``NotCoordinator`` unless this broker leads the partition and has loaded it."""
        check_group_name(group)
        p = group_partition(group, self.partitions)
        cache = self._caches.get(p)
        if cache is not None and _led(self._partition(p)):
            return p, cache
        if p in self._loads:
            raise NotCoordinator(f"group {group!r}: broker {self._node_id} is loading {GROUPS_TOPIC}-{p}; retry")
        raise NotCoordinator(
            f"broker {self._node_id} does not coordinate group {group!r}: it does not lead {GROUPS_TOPIC}-{p}"
        )

    def check(self, group: str) -> None:
        """Raise ``InvalidGroup`` or ``NotCoordinator`` unless this broker coordinates ``group``."""
        self._cache(group)

    def get(self, group: str) -> Offsets:
        """The committed offsets of ``group`` (empty if it has none)."""
        return dict(self._cache(group)[1].groups.get(group, {}))

    def existing(self, group: str) -> Offsets:
        """The committed offsets of ``group``; ``UnknownGroup`` if it has none: it never
        committed, or it was deleted."""
        offsets = self.get(group)
        if not offsets:
            raise UnknownGroup(f"group {group!r} has no committed offsets")
        return offsets

    def names(self) -> list[str]:
        """Every group with committed offsets in the partitions this broker leads, sorted."""
        return sorted(g for p in self.led() for g in self._caches[p].groups)

    # ------------------------------------------------------------------ writes

    async def commit(self, group: str, offsets: Offsets) -> None:
        """Store ``offsets`` for ``group``; returns once they are in the log (see the
        module docstring) and visible to reads."""
        p, cache = self._cache(group)
        await self._write(p, cache, [(OffsetKey(group, t, i), c) for (t, i), c in offsets.items()])

    async def delete(self, group: str) -> None:
        """Delete ``group``'s offsets (tombstones); ``UnknownGroup`` if it has none.
        Commits still being written are deleted with it."""
        p, cache = self._cache(group)
        keys = set(self.existing(group)) | set(cache.writing.get(group, ()))
        await self._write(p, cache, [(OffsetKey(group, t, i), None) for t, i in sorted(keys)])

    async def forget_topic(self, topic: str) -> None:
        """Delete every group's offsets of a deleted topic (a new topic of the same name
        must not inherit them), in the partitions this broker leads.  Failures are logged."""
        writes = []
        for p in self.led():
            cache = self._caches[p]
            keys = {
                OffsetKey(g, t, i)
                for g in {*cache.groups, *cache.writing}
                for t, i in {*cache.groups.get(g, ()), *cache.writing.get(g, ())}
                if t == topic
            }
            if keys:
                writes.append(self._write(p, cache, [(k, None) for k in sorted(keys)]))
        for exc in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(exc, BaseException):
                log.error("could not delete the group offsets of deleted topic %s: %s", topic, exc)

    async def _write(self, p: int, cache: _Cache, entries: list[tuple[OffsetKey, Committed | None]]) -> None:
        """Append ``entries`` to ``__groups``-p; the cache takes them once appended."""
        part = self._partition(p)
        now_ms = int(time.time() * 1000)
        max_bytes = part.config.max_message_bytes
        data = bytearray(build_offsets_batches(entries, now_ms, max_bytes))
        try:
            spans = validate_batches(data, max_bytes)
        except BatchTooLarge as exc:
            raise MessageTooLarge(
                f"a committed offset takes {exc.size} bytes: above max.message.bytes={max_bytes} of {GROUPS_TOPIC}"
            ) from None
        fut = part.append(data, spans, acks_all=True)
        writing = Counter((k.group, (k.topic, k.partition)) for k, _ in entries)
        for (group, tp), n in writing.items():
            cache.writing.setdefault(group, Counter())[tp] += n
        fut.add_done_callback(lambda f: self._appended(p, cache, entries, writing, f))
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await asyncio.shield(fut)  # a client that goes away does not cancel the write
        except TimeoutError:
            raise RequestTimedOut(
                f"{GROUPS_TOPIC}-{p} did not take the write within {WRITE_TIMEOUT_S:g} s; it may still be stored"
            ) from None
        except NotLeader as exc:
            raise NotCoordinator(f"{GROUPS_TOPIC}-{p} has a new leader: {exc.message}") from exc

    def _appended(self, p: int, cache: _Cache, entries, writing: Counter, fut: asyncio.Future) -> None:
        """Done-callback of an append (run in log order): the cache takes the records."""
        for (group, tp), n in writing.items():
            counts = cache.writing[group]
            counts[tp] -= n
            if counts[tp] <= 0:
                del counts[tp]
            if not counts:
                del cache.writing[group]
        if fut.cancelled() or fut.exception() is not None:
            return
        if self._caches.get(p) is not cache:
            return  # unloaded meanwhile: whoever loads the partition reads the records
        for key, value in entries:
            cache.apply(key, value)


def _led(part: Partition | None) -> bool:
    return part is not None and part.is_leader

