"""Positions of the fetch consumer (client/consumer.py): per assigned partition, where the
application is and where the next fetch starts, and finding them out from the brokers.

Per assigned partition the *position* is the next offset the application gets and the
*fetch offset* the next offset asked of the broker; an *epoch* is bumped by every seek, so a
fetch in flight meanwhile is dropped.  ``seek`` sets the position; ``resolve`` asks the
partitions' leaders for the offset at a time (``seek_to_*``); a partition without a
position gets, in ``init``, a pending ``seek_to_*`` target, else the group's committed
offset, else a reset per ``auto_offset_reset``.

Partition by partition: a position that cannot be found out now (no leader, its broker
down) is warned about once and asked again in the background with backoff
(``unresolved``) while the other partitions are read; ``position()`` is None until then.

What must not live here: the fetched records (the consumer's buffer: a seek here is
followed by the consumer dropping what it buffered for the partition) and the assignment
itself (the consumer decides which partitions are assigned and calls ``add`` / ``drop``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from sluice import errors
from sluice.client.cluster import Cluster
from sluice.client.commits import GroupCommits
from sluice.client.config import ConsumerConfig
from sluice.client.retry_policy import Retries, backoff
from sluice.protocol import messages

log = logging.getLogger("sluice.client.consumer")

TP = tuple[str, int]


class Positions:
    """The positions of one consumer's assigned partitions.

    The consumer's fetch path reads and writes ``at``, ``fetch_offsets``, ``epochs`` and
    ``skips`` directly (one dict operation per fetched chunk, no call).  Their keys are the
    assigned partitions (``add`` / ``drop``).  Concurrency: event loop only."""

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        retries: Retries,
        commits: GroupCommits | None,
        stale: Callable[[], None],
    ) -> None:
        """``cluster``: metadata (who leads each partition) and connections to the leaders;
        ``config``: ``auto_offset_reset`` and ``request_timeout_ms``; ``retries``: which
        errors leave a partition for later rather than raise; ``commits``: the group's
        committed offsets (None without a group); ``stale()``: called when the metadata
        proved out of date (a leader could not answer), so that the consumer refreshes it."""
        self._cluster = cluster
        self.auto_offset_reset = config.auto_offset_reset
        self.request_timeout = config.request_timeout_ms / 1000
        self._retries = retries
        self._commits = commits
        self._stale = stale
        self.at: dict[TP, int | None] = {}  # the positions; None: to initialise / reset
        self.out_of_range: set[TP] = set()  # position None because the broker said so
        # seek_to_* targets (a timestamp or EARLIEST / LATEST) not resolved yet: no leader
        self.seek_targets: dict[TP, int] = {}
        # positions that could not be found out: (failing since, attempts, next attempt at)
        self.unresolved: dict[TP, tuple[float, int, float]] = {}
        self.fetch_offsets: dict[TP, int] = {}
        # (at, to): once the position is ``at`` it is ``to``: the batches in between show
        # nothing (half messages, control markers, records compacted away)
        self.skips: dict[TP, tuple[int, int]] = {}
        self.epochs: dict[TP, int] = {}  # bumped by seek: drops in-flight results

    # ------------------------------------------------------------------ the assignment

    def add(self, tps: Sequence[TP]) -> None:
        """``tps`` are assigned: those new get no position yet (found out by ``init``)."""
        for tp in tps:
            self.at.setdefault(tp, None)
            self.epochs.setdefault(tp, 0)

    def drop(self, tp: TP) -> None:
        """``tp`` is no longer assigned: forget it; a fetch in flight for it is dropped."""
        self.at.pop(tp, None)
        self.out_of_range.discard(tp)
        self.seek_targets.pop(tp, None)
        self.unresolved.pop(tp, None)
        self.fetch_offsets.pop(tp, None)
        self.epochs[tp] = self.epochs.get(tp, 0) + 1
        self.skips.pop(tp, None)

    def check_assigned(self, tp: TP) -> None:
        """``ConfigError`` unless ``tp`` is assigned."""
        if tp not in self.at:
            raise errors.ConfigError(f"{tp} is not assigned")

    # ------------------------------------------------------------------ reading positions

    def position(self, tp: TP) -> int | None:
        """Next offset the application will get for ``tp`` (None until initialised).

        Past batches that show nothing (half messages, rollback markers, records compacted
        away) once every record before them was handed out: at the end of a partition
        whose last batches are hidden, the position is its end, not the offset after its
        last visible record."""
        self.check_assigned(tp)
        return self.skipped(tp, self.at[tp])

    def skipped(self, tp: TP, position: int | None) -> int | None:
        """``position`` of ``tp``, past the batches that show nothing if it is at them."""
        skip = self.skips.get(tp)
        return skip[1] if skip is not None and position == skip[0] else position

    def to_commit(self) -> dict[TP, int]:
        """The positions a commit stores by default: each known one, past hidden batches."""
        return {tp: self.skipped(tp, off) for tp, off in self.at.items() if off is not None}

    def current(self) -> dict[TP, int]:
        """The known positions as they are (what auto commit compares and stores)."""
        return {tp: o for tp, o in self.at.items() if o is not None}

    # ------------------------------------------------------------------ setting positions

    def seek(self, tp: TP, offset: int) -> None:
        """Make ``offset`` the next offset read from ``tp``; fetches in flight are dropped.
        The caller drops what it buffered for ``tp``."""
        self.check_assigned(tp)
        if offset < 0:
            raise errors.ConfigError(f"offset must be >= 0, got {offset}")
        self.at[tp] = offset
        self.out_of_range.discard(tp)
        self.seek_targets.pop(tp, None)
        self.unresolved.pop(tp, None)
        self.fetch_offsets[tp] = offset
        self.epochs[tp] += 1
        self.skips.pop(tp, None)

    def sought_later(self, tp: TP, timestamp: int) -> None:
        """A ``seek_to_*`` of ``tp`` (just ``seek``-ed, to drop what was fetched) could not
        be answered now: no position until ``init`` finds the one for ``timestamp``."""
        self.at[tp] = None
        self.fetch_offsets.pop(tp, None)
        self.seek_targets[tp] = timestamp

    def reset_later(self, tp: TP) -> None:
        """The broker said ``tp``'s position is out of range: ``init`` resets it per
        ``auto_offset_reset``, never to the committed offset.  The caller drops what it
        buffered for ``tp``."""
        self.at[tp] = None
        self.out_of_range.add(tp)
        self.fetch_offsets.pop(tp, None)
        self.skips.pop(tp, None)

    def _set(self, tp: TP, offset: int) -> None:
        self.at[tp] = self.fetch_offsets[tp] = max(offset, 0)
        self.out_of_range.discard(tp)
        self.seek_targets.pop(tp, None)
        self.epochs[tp] += 1

    # ------------------------------------------------------------------ finding positions

    async def resolve(self, tps: Sequence[TP], timestamp: int) -> tuple[dict[TP, int], dict[TP, errors.SluiceError]]:
        """``list_offsets``, with the end for a time that no record is at or after."""
        offsets, failed = await self.list_offsets(tps, timestamp)
        after = [tp for tp, off in offsets.items() if off < 0]
        if after:
            latest, not_now = await self.list_offsets(after, messages.LATEST)
            offsets.update(latest)
            for tp in not_now:
                offsets.pop(tp, None)
            failed.update(not_now)
        return offsets, failed

    async def list_offsets(
        self, tps: Sequence[TP], timestamp: int
    ) -> tuple[dict[TP, int], dict[TP, errors.SluiceError]]:
        """Ask each partition's leader (all leaders at once), partition by partition.

        Returns the offsets found and, apart, the partitions that could not be answered
        for a retriable reason (no leader known, the leader moved, its broker unreachable)
        with that reason; those mark the metadata stale, so that the next try refreshes it
        (a partition that does not exist is then found out by
        ``Assignment.ensure``).  Any other error raises."""
        by_leader: dict[int, list[TP]] = {}
        failed: dict[TP, errors.SluiceError] = {}
        for tp in tps:
            node = self._cluster.leader(*tp)
            if node < 0:
                failed[tp] = errors.NotLeader(f"{tp[0]}-{tp[1]} has no leader now")
            else:
                by_leader.setdefault(node, []).append(tp)

        async def ask(node: int, group: list[TP]):
            req = messages.ListOffsetsRequest(
                partitions=[
                    messages.ListOffsetsPartition(topic=t, partition=p, timestamp=timestamp)
                    for t, p in group
                ]
            )
            try:
                resp, _ = await (await self._cluster.connection(node)).request(req, timeout=self.request_timeout)
            except errors.SluiceError as exc:
                if not self._retries.can_retry(exc):
                    raise
                return group, exc
            return group, resp

        out: dict[TP, int] = {}
        for group, answer in await asyncio.gather(*(ask(n, g) for n, g in by_leader.items())):
            if isinstance(answer, errors.SluiceError):
                failed.update(dict.fromkeys(group, answer))
                continue
            for r in answer.partitions:
                tp = (r.topic, r.partition)
                if not r.error:
                    out[tp] = r.offset
                    continue
                exc = errors.error_for_code(r.error, r.message)
                if not self._retries.can_retry(exc):
                    raise exc
                failed[tp] = exc
        if failed:
            self._stale()
        return out, failed

    async def init(self, assigned: Sequence[TP], missing: set[TP]) -> None:
        """Give every partition of ``assigned`` without a position one, except those
        ``missing`` (the metadata says they do not exist): a pending ``seek_to_*`` target,
        else the committed offset, else a reset.  A partition whose position the broker
        called out of range goes straight to the reset (``OffsetOutOfRange`` with
        ``auto_offset_reset='error'``): its committed offset may be the very offset that is
        out of range.

        Partition by partition: one whose leader cannot answer now is warned about once and
        asked again after a backoff (``unresolved``) while the others are read.  Raises
        (for the read loop to retry) only when no assigned partition has a position."""
        now = time.monotonic()
        todo = [
            tp for tp in assigned
            if self.at.get(tp) is None and tp not in missing
            and (tp not in self.unresolved or self.unresolved[tp][2] <= now)
        ]
        if not todo:
            return
        failed: dict[TP, errors.SluiceError] = {}
        by_target: dict[int, list[TP]] = {}
        for tp in todo:
            if tp in self.seek_targets:
                by_target.setdefault(self.seek_targets[tp], []).append(tp)
        for timestamp, tps in by_target.items():
            offsets, not_now = await self.resolve(tps, timestamp)
            for tp, off in offsets.items():
                if self.at.get(tp, 0) is None and self.seek_targets.get(tp) == timestamp:
                    self._set(tp, off)
            failed.update(not_now)
        rest = [tp for tp in todo if self.at.get(tp) is None and tp not in self.seek_targets]
        fresh = [tp for tp in rest if tp not in self.out_of_range]
        if self._commits is not None and fresh:
            committed = await self._commits.fetch_committed(fresh)
            for tp, off in committed.items():
                if off is not None and off >= 0 and self.at.get(tp, 0) is None:
                    self._set(tp, off)
            rest = [tp for tp in rest if self.at.get(tp) is None]
        if rest:
            failed.update(await self._reset(rest))
        self.unresolved_failures(failed, time.monotonic())
        for tp in todo:
            if tp not in failed and self.unresolved.pop(tp, None) is not None:
                log.info("%s-%d: position found, reading it", tp[0], tp[1])
        if failed and not any(self.at.get(tp) is not None for tp in assigned):
            raise next(iter(failed.values()))  # nothing readable at all: the broker is failing

    def unresolved_failures(self, failed: dict[TP, errors.SluiceError], now: float) -> None:
        """Finding the positions of ``failed`` failed retriably: back off each, and warn
        (one line for all) about those that failed for the first time."""
        new = []
        for tp in failed:
            since, attempts, _ = self.unresolved.get(tp, (now, 0, now))
            if not attempts:
                new.append(tp)
            self.unresolved[tp] = (since, attempts + 1, now + backoff(attempts))
        if new:
            log.warning(
                "%s: no position yet, reading the other partitions and retrying %s in the background: %s",
                ", ".join(f"{t}-{p}" for t, p in new), "it" if len(new) == 1 else "them", failed[new[0]],
            )

    async def _reset(self, tps: list[TP]) -> dict[TP, errors.SluiceError]:
        """Reset ``tps`` per ``auto_offset_reset``; returns those whose leader could not
        answer now (they stay without a position)."""
        if self.auto_offset_reset == "error":
            raise errors.OffsetOutOfRange(
                f"no valid position for {tps} and auto_offset_reset='error'"
            )
        ts = messages.EARLIEST if self.auto_offset_reset == "earliest" else messages.LATEST
        offsets, failed = await self.list_offsets(tps, ts)
        for tp, off in offsets.items():
            if tp in self.at and self.at[tp] is None:  # not sought meanwhile
                self._set(tp, off)
        return failed
