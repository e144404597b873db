"""Group commits of the fetch consumer: a part of ``Consumer`` (client/consumer.py).

``commit()`` stores positions (the next offset to read) for the consumer's group and
returns once they are durable.  Calls coalesce: one commit request runs at a time in its
own task; later calls wait for it (shielded, so a cancelled caller never fails the others)
and then send only the latest positions.  Requests go to the group's coordinator
(``Cluster.coordinator_request``) and are retried like the consumer's other requests
(``_retrying``).  With ``enable_auto_commit`` a task commits the positions that moved every
``auto_commit_interval_ms``.
"""

from __future__ import annotations

import asyncio
import logging

from sluice import errors
from sluice.protocol import messages

log = logging.getLogger("sluice.client.consumer")

TP = tuple[str, int]


class GroupCommits:
    async def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """Store ``offsets`` (default: current positions) for the group; durable on return.

        Calls coalesce: one commit request runs at a time, in its own task; later calls wait
        for it, then one request carries the latest offsets of all of them.  Cancelling a
        caller cancels only its wait, never the request others wait on.
        """
        if self.group is None:
            raise errors.ConfigError("commit() needs a consumer group (group=...)")
        if not self._started:
            await self.start()
        if offsets is None:
            offsets = {tp: self._skipped(tp, off) for tp, off in self._positions.items() if off is not None}
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


                await self._retrying(lambda: self._cluster.coordinator_request(self.group, req, _check_commit))
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
        """The group's committed offset for ``tp`` (next offset to read), or None."""
        if self.group is None:
            raise errors.ConfigError("committed() needs a consumer group (group=...)")
        if not self._started:
            await self.start()
        committed = await self._retrying(lambda: self._fetch_committed([tp]))
        return committed.get(tuple(tp))

    async def _fetch_committed(self, tps: list[TP]) -> dict[TP, int | None]:
        req = messages.OffsetFetchRequest(
            group=self.group,
            partitions=[messages.TopicPartition(topic=t, partition=p) for t, p in tps],
        )
        resp = await self._cluster.coordinator_request(self.group, req, _check_fetched)
        return {(r.topic, r.partition): r.offset if r.offset >= 0 else None for r in resp.offsets}

    async def _auto_commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval)
            current = {tp: o for tp, o in self._positions.items() if o is not None}
            if any(self._committed_positions.get(tp) != o for tp, o in current.items()):
                try:
                    await self.commit(current)
                except Exception as exc:  # retried at the next interval; close() commits too
                    log.warning("auto commit of group %r failed: %s", self.group, exc)


def _check_commit(resp: messages.OffsetCommitResponse) -> None:
    for r in resp.partitions:
        errors.raise_for_code(r.error, r.message)


def _check_fetched(resp: messages.OffsetFetchResponse) -> None:
    for r in resp.offsets:
        errors.raise_for_code(r.error)
