"""Compacting a partition: the log cleaner's passes over a ``cleanup.policy=compact`` log.

``Compacting`` is a part of ``Partition`` (a mixin, broker/partition.py holds the state).
The broker's retention pass calls ``clean``; the cleaner (storage/cleaner.py) rewrites
closed segments below the high watermark in the cleaner's thread.  The writer never waits
for it: a cleaning touches only sealed, closed segments, and it is discarded if a
truncation happened meanwhile.  Only a truncation that arrives while cleaned segments are
being renamed into place waits, for those renames.

Event loop only (the passes themselves run in the given executor).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from sluice.storage.cleaner import (
    CleanedSegment,
    clean_segments,
    commit_cleaning,
    discard_cleaned,
    plan_cleaning,
)

log = logging.getLogger("sluice.broker")


class Compacting:
    async def clean(self, executor: Executor, now_ms: int) -> int:
        """Run a log-cleaner pass if the partition is compacted and dirty enough
        (``min.cleanable.dirty.percent``); return the bytes it freed (0: no pass).

        The pass runs in ``executor`` (the broker's cleaner thread) and its own task:
        cancelling the caller does not interrupt it; ``close`` stops it.  A pass already
        running, a truncation running, or one that ran meanwhile (the pass is then
        discarded) all give 0.  Storage errors propagate (``OSError``), after the
        segments already swapped in were taken into the log.
        """
        cfg = self.config
        if cfg.cleanup_policy != "compact" or self._cleaning is not None or self._truncating or self._closing:
            return 0
        plan = plan_cleaning(self.log, cfg.min_cleanable_dirty_percent, cfg.delete_retention_ms, now_ms)
        if plan is None:
            return 0
        self._cleaning = asyncio.get_running_loop().create_task(
            self._clean(executor, plan), name=f"cleaner {self.topic}-{self.index}"
        )
        return await asyncio.shield(self._cleaning)

    async def _clean(self, executor: Executor, plan) -> int:
        loop = asyncio.get_running_loop()
        try:
            cleaned = await loop.run_in_executor(executor, clean_segments, plan, self._stop_cleaning)
            if cleaned is None:
                return 0
            if self.log.generation != plan.generation or self._truncating or self._closing:
                await loop.run_in_executor(executor, discard_cleaned, cleaned)
                return 0
            self._swapping = loop.run_in_executor(executor, commit_cleaning, plan, cleaned, self.log.directory)
            try:
                swapped = await self._swapping
            except OSError as exc:
                self._take_cleaned(getattr(exc, "swapped", []), None)
                raise
            finally:
                self._swapping = None
            self._take_cleaned(swapped, plan.end)
            return sum(c.removed_bytes for c in swapped)
        finally:
            self._cleaning = None

    def _take_cleaned(self, swapped: list[CleanedSegment], cleaned_up_to: int | None) -> None:
        """Put swapped-in segments into the log; close the old ones (after their readers)."""
        pairs = [(c.old, c.new) for c in swapped if c.new is not None]
        self.log.swap_segments(pairs, cleaned_up_to if cleaned_up_to is not None else self.log.cleaned_up_to)
        for old, _ in pairs:
            old.close()

    async def _stop_cleaner(self) -> None:
        """Stop a cleaning pass (it deletes its copies) and wait for it to end."""
        task = self._cleaning
        if task is None:
            return
        self._stop_cleaning.set()
        try:
            await task
        except Exception:  # noqa: BLE001 - reported by the pass's caller; closing regardless
            log.exception("cleaning of %s-%d failed while closing", self.topic, self.index)
