"""Stepping down from a failed disk: a leader that cannot write hands its leadership away.

A partition's writer calls ``DiskStepDown.disk_failed`` when, while it leads, its disk
refuses a write or an fsync (``EIO``, ``EROFS``...) or a write has not returned for
``DISK_STALL_S`` (a hung or frozen disk: broker/partition.py).  Keeping the leadership
would leave the partition unwritable, or stalled, while healthy followers sit idle (seed
``000``: fail fast).  So the broker hands it, by compare-and-swap on the partition's state
in the metadata store, to an in-sync follower that is alive and fetching (the one
furthest ahead: ``handoff.successor``, as at a controlled shutdown), in a new leader
epoch, and leaves the ISR itself: its copy may lack what its disk lost.  Every ISR member has every acknowledged record, so the new
leader has them too: this is an ordinary clean election, made by the leader instead of
the controller, and the version check makes it lose to any change made meanwhile (the
controller's, an ISR change).  The store's watch then applies the new state here
(``make_follower``) as everywhere.

With no other live in-sync replica the leader keeps the partition (it holds the only
copy): producers keep getting the storage error, and a leader fenced after a failed
fsync (``Partition._fence``) starts a new epoch of its own instead, in which it cuts what
its disk may have lost before writing again.  A full disk hands nothing over: it is
reported to producers and waits for space.

Event loop only.  One hand-over at a time per partition and epoch; a failed attempt (the
store unreachable, the state changed) is retried every ``RETRY_S`` while the partition
still leads in the same epoch.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sluice.broker.handoff import successor
from sluice.cluster.store import PartitionState
from sluice.errors import MetadataUnavailable, StorageError, UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.replication")

RETRY_S = 0.2


class DiskStepDown:
    def __init__(self, broker) -> None:
        """``broker``: its metadata store, node id, live brokers and partitions are used."""
        self._broker = broker
        self._running: dict[tuple[str, int], int] = {}  # partition -> epoch handed over

    def disk_failed(self, part, err: StorageError) -> None:
        """``part`` leads here and its disk failed with ``err``: hand the leadership over
        (in a task; at most one per partition and epoch)."""
        key = (part.topic, part.index)
        if not part.is_leader or self._running.get(key) == part.leader_epoch:
            return
        self._running[key] = part.leader_epoch
        task = asyncio.ensure_future(self._hand_over(part, part.leader_epoch, err))
        task.add_done_callback(lambda t, key=key, epoch=part.leader_epoch: self._done(key, epoch, t))

    def _done(self, key: tuple[str, int], epoch: int, task: asyncio.Task) -> None:
        if self._running.get(key) == epoch:  # not a later epoch's hand-over, started meanwhile
            del self._running[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("handing over %s-%d failed", *key, exc_info=task.exception())

    async def _hand_over(self, part, epoch: int, err: StorageError) -> None:
        me = self._broker.config.node_id
        while part.is_leader and part.leader_epoch == epoch and not part.closing:
            try:
                states = await self._broker.metadata.partition_states(part.topic)
            except (UnknownTopic, UnknownPartition):
                return
            except MetadataUnavailable as exc:
                log.warning("cannot hand over %s-%d yet: %s", part.topic, part.index, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if part.index >= len(states):
                return
            st = states[part.index]
            if st.leader != me or st.leader_epoch != epoch:
                return  # moved on already
            isr = [r for r in st.isr if r != me]
            heir = successor(part, isr, set(self._broker.live_brokers), time.monotonic())
            if heir is not None:
                new = PartitionState(heir, epoch + 1, isr)
                what = f"broker {heir} leads it in epoch {epoch + 1}, ISR {isr}"
            elif part.fenced:
                new = PartitionState(me, epoch + 1, st.isr)
                what = f"no other in-sync replica: a new epoch {epoch + 1} of this leader cuts what may be lost"
            else:
                log.error(
                    "%s-%d: %s; no other in-sync replica is alive, so this broker keeps leading it",
                    part.topic, part.index, err,
                )
                return
            try:
                if await self._broker.metadata.cas_partition_state(part.topic, part.index, st.version, new):
                    log.warning("%s-%d: %s; %s", part.topic, part.index, err, what)
                    return
            except MetadataUnavailable as exc:
                log.warning("cannot hand over %s-%d yet: %s", part.topic, part.index, exc)
            await asyncio.sleep(RETRY_S)
