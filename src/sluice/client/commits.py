"""Group commits of the fetch consumer (client/consumer.py): storing and reading the
group's committed offsets.

``commit()`` stores positions (the next offset to read) for the consumer's group and
returns once they are durable.  Calls coalesce: one commit request runs at a time in its
own task; later calls wait for it (shielded, so a cancelled caller never fails the others)
and then send only the latest positions.  Requests go to the group's coordinator
(``Cluster.coordinator_request``) and are retried like the consumer's other requests
(``Retries.retrying``).  With ``enable_auto_commit`` a task (``auto_commit_loop``) commits
the positions that moved every ``auto_commit_interval_ms``.

What must not live here: deciding what to commit by default (the consumer's positions,
client/positions.py) and starting the consumer; ``Consumer.commit`` does both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sluice import errors
from sluice.client.cluster import Cluster
from sluice.client.retry_policy import Retries
from sluice.protocol import messages

log = logging.getLogger("sluice.client.consumer")

TP = tuple[str, int]


class GroupCommits:
    """The committed offsets of one group, for one consumer.

    Concurrency: event loop only (the consumer's loop)."""

    def __init__(self, cluster: Cluster, group: str, retries: Retries) -> None:
        """``cluster``: the consumer's metadata and connections (finds the coordinator);
        ``group``: the group committed for; ``retries``: the consumer's retry policy."""
        self._cluster = cluster
        self.group = group
        self._retries = retries
        self._commit_seq = 0
        self._committed_seq = 0
        self._to_commit: dict[TP, int] = {}
        self._commit_task: tuple[asyncio.Task, int] | None = None  # (task, seq it covers)
        self._committed_positions: dict[TP, int] = {}  # last committed by this consumer

    async def commit(self, offsets: dict[TP, int]) -> None:
        """Store ``offsets`` for the group; durable on return.

        Calls coalesce: one commit request runs at a time, in its own task; later calls wait
        for it, then one request carries the latest offsets of all of them.  Cancelling a
        caller cancels only its wait, never the request others wait on.
        """
        self._to_commit.update(offsets)
        self._commit_seq += 1
        mine = self._commit_seq
        while self._committed_seq < mine:
            running = self._commit_task
            # A finished task may still be recorded (its done-callback has not run yet):
            # awaiting it would not yield, so this loop would spin.  Start the next one.
            if running is None or running[0].done():
                task = asyncio.get_running_loop().create_task(self._send_commit())
                task.add_done_callback(self._commit_done)
                running = self._commit_task = (task, self._commit_seq)
            task, covers = running
            try:
                await asyncio.shield(task)
            except errors.SluiceError:
                if covers >= mine:
                    raise

    async def _send_commit(self) -> None:
        """The commit task: send everything in ``_to_commit`` (up to ``_commit_seq``)."""
        seq = self._commit_seq
        batch, self._to_commit = self._to_commit, {}
        try:
            if batch:
                req = messages.OffsetCommitRequest(
                    group=self.group,
                    offsets=[
                        messages.CommitOffset(topic=t, partition=p, offset=o)
                        for (t, p), o in batch.items()
                    ],
                )
                await self._retries.retrying(
                    lambda: self._cluster.coordinator_request(self.group, req, _check_commit)
                )
                self._committed_positions.update(batch)
        except BaseException:
            for tp, off in batch.items():
                self._to_commit.setdefault(tp, off)  # retried by the next commit
            raise
        else:
            self._committed_seq = max(self._committed_seq, seq)

    def _commit_done(self, task: asyncio.Task) -> None:
        if self._commit_task is not None and self._commit_task[0] is task:
            self._commit_task = None
        if not task.cancelled():
            task.exception()  # its waiters may all be gone; they re-raise it themselves

    async def committed(self, tp: TP) -> int | None:
        """The group's committed offset for ``tp`` (next offset to read), or None; retried
        like ``commit``."""
        committed = await self._retries.retrying(lambda: self.fetch_committed([tp]))
        return committed.get(tuple(tp))

    async def fetch_committed(self, tps: list[TP]) -> dict[TP, int | None]:
        """One request (no retry): the committed offset of each of ``tps``, None for none."""
        req = messages.OffsetFetchRequest(
            group=self.group,
            partitions=[messages.TopicPartition(topic=t, partition=p) for t, p in tps],
        )
        resp = await self._cluster.coordinator_request(self.group, req, _check_fetched)
        return {(r.topic, r.partition): r.offset if r.offset >= 0 else None for r in resp.offsets}

    async def auto_commit_loop(self, interval: float, current: Callable[[], dict[TP, int]]) -> None:
        """Every ``interval`` seconds, commit ``current()`` if any of it moved since the last
        commit.  A failed commit is logged and tried again at the next interval.  Runs until
        cancelled (by ``Consumer.close``)."""
        while True:
            await asyncio.sleep(interval)
            now = current()
            if any(self._committed_positions.get(tp) != o for tp, o in now.items()):
                try:
                    await self.commit(now)
                except Exception as exc:  # retried at the next interval; close() commits too
                    log.warning("auto commit of group %r failed: %s", self.group, exc)


def _check_commit(resp: messages.OffsetCommitResponse) -> None:
    for r in resp.partitions:
        errors.raise_for_code(r.error, r.message)


def _check_fetched(resp: messages.OffsetFetchResponse) -> None:
    for r in resp.offsets:
        errors.raise_for_code(r.error)
