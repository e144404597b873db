"""Compacting a partition: the log cleaner's passes over a ``cleanup.policy=compact`` log.

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
import threading
from concurrent.futures import Executor

from sluice.broker.writer import Writer
from sluice.config import TopicConfig
from sluice.storage.cleaner import (
    CleanedSegment,
    clean_segments,
    commit_cleaning,
    discard_cleaned,
    plan_cleaning,
)
from sluice.storage.log import PartitionLog

log = logging.getLogger("sluice.broker")


class Compaction:
    """The log cleaner's passes over one partition's log.

    ``log``: the partition's log; ``config``: the topic's config (``cleanup.policy``,
    ``min.cleanable.dirty.percent``, ``delete.retention.ms``; replaced on a
    reconfiguration); ``writer``: the partition's writer, whose truncations a pass gives
    way to and which waits for the renames of cleaned segments (``Writer.swapping``);
    ``name``: ``topic-index``, for logs.
    """

    def __init__(self, log: PartitionLog, config: TopicConfig, writer: Writer, name: str) -> None:
        self.log = log
        self.config = config
        self._writer = writer
        self._name = name
        self.cleaning: asyncio.Task | None = None  # the pass running
        self._stop_cleaning = threading.Event()

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
        writer = self._writer
        if cfg.cleanup_policy != "compact" or self.cleaning is not None or writer.truncating or writer.closing:
            return 0
        plan = plan_cleaning(self.log, cfg.min_cleanable_dirty_percent, cfg.delete_retention_ms, now_ms)
        if plan is None:
            return 0
        self.cleaning = asyncio.get_running_loop().create_task(
            self._clean(executor, plan), name=f"cleaner {self._name}"
        )
        return await asyncio.shield(self.cleaning)

    async def _clean(self, executor: Executor, plan) -> int:
        loop, writer = asyncio.get_running_loop(), self._writer
        try:
            cleaned = await loop.run_in_executor(executor, clean_segments, plan, self._stop_cleaning)
            if cleaned is None:
                return 0
            if self.log.generation != plan.generation or writer.truncating or writer.closing:
                await loop.run_in_executor(executor, discard_cleaned, cleaned)
                return 0
            writer.swapping = loop.run_in_executor(executor, commit_cleaning, plan, cleaned, self.log.directory)
            try:
                swapped = await writer.swapping
            except OSError as exc:
                self._take_cleaned(getattr(exc, "swapped", []), None)
                raise
            finally:
                writer.swapping = None
            self._take_cleaned(swapped, plan.end)
            return sum(c.removed_bytes for c in swapped)
        finally:
            self.cleaning = None

    def _take_cleaned(self, swapped: list[CleanedSegment], cleaned_up_to: int | None) -> None:
        """Put swapped-in segments into the log; close the old ones (after their readers)."""
        pairs = [(c.old, c.new) for c in swapped if c.new is not None]
        self.log.swap_segments(pairs, cleaned_up_to if cleaned_up_to is not None else self.log.cleaned_up_to)
        for old, _ in pairs:
            old.close()

    async def stop(self) -> None:
        """Stop a cleaning pass (it deletes its copies) and wait for it to end."""
        task = self.cleaning
        if task is None:
            return
        self._stop_cleaning.set()
        try:
            await task
        except Exception:  # noqa: BLE001 - reported by the pass's caller; closing regardless
            log.exception("cleaning of %s failed while closing", self._name)
