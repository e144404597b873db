"""Positions of the fetch consumer: a part of ``Consumer`` (client/consumer.py).

Per assigned partition the *position* is the next offset the application gets.  ``seek``
sets it; ``seek_to_beginning`` / ``seek_to_end`` / ``seek_to_time`` ask the partition's
leader; a partition without one gets the group's committed offset, else a reset per
``auto_offset_reset`` (``_init_positions``, run by each poll).

Partition by partition: a position that cannot be found out now (no leader, its broker
down) is warned about once and asked again in the background with backoff
(``_unresolved``) while the other partitions are read; ``position()`` is None until then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from sluice import errors
from sluice.protocol import messages

log = logging.getLogger("sluice.client.consumer")

TP = tuple[str, int]
_BACKOFF, _BACKOFF_MAX = 0.1, 1.0  # seconds between retries of a failing broker


def backoff(attempt: int) -> float:
    """The wait before retry ``attempt`` (0, 1, ...): 100 ms doubling to 1 s."""
    return min(_BACKOFF * 2 ** min(attempt, 10), _BACKOFF_MAX)


class Positions:
    def position(self, tp: TP) -> int | None:
        """Next offset the application will get for ``tp`` (None until initialised).

        Past batches that show nothing (half messages, rollback markers, records compacted
        away) once every record before them was handed out: at the end of a partition
        whose last batches are hidden, the position is its end, not the offset after its
        last visible record."""
        if tp not in self._positions:
            raise errors.ConfigError(f"{tp} is not assigned")
        return self._skipped(tp, self._positions[tp])

    def _skipped(self, tp: TP, position: int | None) -> int | None:
        skip = self._skips.get(tp)
        return skip[1] if skip is not None and position == skip[0] else position

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Make ``offset`` the next offset read from (topic, partition)."""
        tp = (topic, partition)
        if tp not in self._positions:
            raise errors.ConfigError(f"{tp} is not assigned")
        if offset < 0:
            raise errors.ConfigError(f"offset must be >= 0, got {offset}")
        self._positions[tp] = offset
        self._out_of_range.discard(tp)
        self._seek_targets.pop(tp, None)
        self._unresolved.pop(tp, None)
        self._fetch_offsets[tp] = offset
        self._epochs[tp] += 1
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
        background (``_init_positions``), and ``position()`` is None for them until then."""
        await self.start()

        async def resolve() -> tuple[dict[TP, int], dict[TP, errors.SluiceError]]:
            await self._ensure_assignment()
            targets = list(tps) or list(self._assigned)
            for tp in targets:
                if tp not in self._positions:
                    raise errors.ConfigError(f"{tp} is not assigned")
            offsets, failed = await self._resolve(targets, timestamp)
            if failed and not offsets:
                raise next(iter(failed.values()))  # nothing answered: retried within the call
            return offsets, failed

        offsets, failed = await self._retrying(resolve)
        for tp, off in offsets.items():
            self.seek(tp[0], tp[1], off)
        for tp in failed:
            self.seek(tp[0], tp[1], 0)  # drops what was fetched or buffered for tp
            self._positions[tp] = None
            self._fetch_offsets.pop(tp, None)
            self._seek_targets[tp] = timestamp
        self._unresolved_failures(failed, time.monotonic())

    async def _resolve(self, tps: Sequence[TP], timestamp: int) -> tuple[dict[TP, int], dict[TP, errors.SluiceError]]:
        """``_list_offsets``, with the end for a time that no record is at or after."""
        offsets, failed = await self._list_offsets(tps, timestamp)
        after = [tp for tp, off in offsets.items() if off < 0]
        if after:
            latest, not_now = await self._list_offsets(after, messages.LATEST)
            offsets.update(latest)
            for tp in not_now:
                offsets.pop(tp, None)
            failed.update(not_now)
        return offsets, failed

    # ------------------------------------------------------------------ finding positions

    async def _list_offsets(
        self, tps: Sequence[TP], timestamp: int
    ) -> tuple[dict[TP, int], dict[TP, errors.SluiceError]]:
        """Ask each partition's leader (all leaders at once), partition by partition.

        Returns the offsets found and, apart, the partitions that could not be answered
        for a retriable reason (no leader known, the leader moved, its broker unreachable)
        with that reason; those mark the metadata stale, so that the next try refreshes it
        (a partition that does not exist is then found out by ``_check_assigned``).  Any
        other error raises."""
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
                if not self._can_retry(exc):
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
                if not self._can_retry(exc):
                    raise exc
                failed[tp] = exc
        if failed:
            self._needs_refresh = True
        return out, failed

    async def _init_positions(self) -> None:
        """Give every assigned partition without a position one: a pending ``seek_to_*``
        target, else the committed offset, else a reset.  A partition whose position the
        broker called out of range goes straight to the reset (``OffsetOutOfRange`` with
        ``auto_offset_reset='error'``): its committed offset may be the very offset that is
        out of range.

        Partition by partition: one whose leader cannot answer now is warned about once and
        asked again after a backoff (``_unresolved``) while the others are read.  Raises
        (for the read loop to retry, see the module docstring) only when no assigned
        partition has a position."""
        now = time.monotonic()
        todo = [
            tp for tp in self._assigned
            if self._positions.get(tp) is None and tp not in self._missing
            and (tp not in self._unresolved or self._unresolved[tp][2] <= now)
        ]
        if not todo:
            return
        failed: dict[TP, errors.SluiceError] = {}
        by_target: dict[int, list[TP]] = {}
        for tp in todo:
            if tp in self._seek_targets:
                by_target.setdefault(self._seek_targets[tp], []).append(tp)
        for timestamp, tps in by_target.items():
            offsets, not_now = await self._resolve(tps, timestamp)
            for tp, off in offsets.items():
                if self._positions.get(tp, 0) is None and self._seek_targets.get(tp) == timestamp:
                    self._set_position(tp, off)
            failed.update(not_now)
        rest = [tp for tp in todo if self._positions.get(tp) is None and tp not in self._seek_targets]
        fresh = [tp for tp in rest if tp not in self._out_of_range]
        if self.group is not None and fresh:
            committed = await self._fetch_committed(fresh)
            for tp, off in committed.items():
                if off is not None and off >= 0 and self._positions.get(tp, 0) is None:
                    self._set_position(tp, off)
            rest = [tp for tp in rest if self._positions.get(tp) is None]
        if rest:
            failed.update(await self._reset(rest))
        self._unresolved_failures(failed, time.monotonic())
        for tp in todo:
            if tp not in failed and self._unresolved.pop(tp, None) is not None:
                log.info("%s-%d: position found, reading it", tp[0], tp[1])
        if failed and not any(self._positions.get(tp) is not None for tp in self._assigned):
            raise next(iter(failed.values()))  # nothing readable at all: the broker is failing

    def _unresolved_failures(self, failed: dict[TP, errors.SluiceError], now: float) -> None:
        """Finding the positions of ``failed`` failed retriably: back off each, and warn
        (one line for all) about those that failed for the first time."""
        new = []
        for tp in failed:
            since, attempts, _ = self._unresolved.get(tp, (now, 0, now))
            if not attempts:
                new.append(tp)
            self._unresolved[tp] = (since, attempts + 1, now + backoff(attempts))
        if new:
            log.warning(
                "%s: no position yet, reading the other partitions and retrying %s in the background: %s",
                ", ".join(f"{t}-{p}" for t, p in new), "it" if len(new) == 1 else "them", failed[new[0]],
            )

    def _set_position(self, tp: TP, offset: int) -> None:
        self._positions[tp] = self._fetch_offsets[tp] = max(offset, 0)
        self._out_of_range.discard(tp)
        self._seek_targets.pop(tp, None)
        self._epochs[tp] += 1

    async def _reset(self, tps: list[TP]) -> dict[TP, errors.SluiceError]:
        """Reset ``tps`` per ``auto_offset_reset``; returns those whose leader could not
        answer now (they stay without a position)."""
        if self.auto_offset_reset == "error":
            raise errors.OffsetOutOfRange(
                f"no valid position for {tps} and auto_offset_reset='error'"
            )
        ts = messages.EARLIEST if self.auto_offset_reset == "earliest" else messages.LATEST
        offsets, failed = await self._list_offsets(tps, ts)
        for tp, off in offsets.items():
            if tp in self._positions and self._positions[tp] is None:  # not sought meanwhile
                self._set_position(tp, off)
        return failed
