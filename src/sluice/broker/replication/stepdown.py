"""Stepping down from a failed disk: a leader that cannot write hands its leadership away.

A partition's writer calls ``DiskStepDown.disk_failed`` when, while it leads, its disk
refuses a write or an fsync (``EIO``, ``EROFS``...) or a write has not returned for
``DISK_STALL_S`` (a hung or frozen disk: broker/disk_health.py).  Keeping the leadership
would leave the partition unwritable, or stalled, while healthy followers sit idle (seed
``000``: fail fast).  So the broker hands it, by compare-and-swap on the partition's state
in the metadata store, to an in-sync follower that is alive and fetching (the one
furthest ahead: ``handoff.hand_over``, the swap of a controlled shutdown), in a new
leader epoch, and leaves the ISR itself: its copy may lack what its disk lost.  Every ISR member has every acknowledged record, so the new
leader has them too: this is an ordinary clean election, made by the leader instead of
the controller, and the version check makes it lose to any change made meanwhile (the
controller's, an ISR change).  The store's watch then applies the new state here
(``make_follower``) as everywhere.

With no other live in-sync replica the leader keeps the partition (it holds the only
copy): producers keep getting the storage error, and a leader fenced after a failed
fsync (``DiskHealth.fence``) starts a new epoch of its own instead (the partition states'
``new_leader_epoch``: states.py), in which it cuts what its disk may have lost before
writing again.  A full disk hands nothing over: it is
reported to producers and waits for space.

Event loop only.  One hand-over at a time per partition and epoch; a failed attempt (the
store unreachable, the state changed) is retried every ``RETRY_S`` while the partition
still leads in the same epoch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sluice.broker.partition import Partition
from sluice.broker.replication.handoff import StateChanged, hand_over
from sluice.cluster.store import MetadataStore
from sluice.errors import MetadataUnavailable, StorageError, UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.replication")

RETRY_S = 0.2


class DiskStepDown:
    """Hands away the leadership of partitions whose disk failed (module docstring).

    Collaborators: ``node_id``, this broker's; ``store``, the metadata store swapped in;
    ``live()``, the node ids of the live brokers; ``new_leader_epoch(partition, why)``,
    the partition states' (states.py): a fenced leader with no successor starts a new
    epoch through it."""

    def __init__(
        self, node_id: int, store: MetadataStore, live: Callable[[], set[int]],
        new_leader_epoch: Callable[[Partition, str], None],
    ) -> None:
        self.node_id = node_id
        self.metadata = store
        self.live = live
        self.new_leader_epoch = new_leader_epoch
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

    async def _hand_over(self, part: Partition, epoch: int, err: StorageError) -> None:
        me = self.node_id
        while part.is_leader and part.leader_epoch == epoch and not part.closing:
            try:
                states = await self.metadata.partition_states(part.topic)
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
            try:
                new = await hand_over(self.metadata, part, st, self.live())
            except (UnknownTopic, UnknownPartition):
                return
            except StateChanged:  # read it again
                await asyncio.sleep(RETRY_S)
                continue
            except MetadataUnavailable as exc:
                log.warning("cannot hand over %s-%d yet: %s", part.topic, part.index, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if new is not None:
                log.warning("%s-%d: %s; broker %d leads it in epoch %d, ISR %s",
                            part.topic, part.index, err, new.leader, new.leader_epoch, new.isr)
            elif part.fenced:
                # no other in-sync replica: a new epoch of this leader cuts what may be lost
                self.new_leader_epoch(part, f"{err}; no other in-sync replica")
            else:
                log.error(
                    "%s-%d: %s; no other in-sync replica is alive, so this broker keeps leading it",
                    part.topic, part.index, err,
                )
            return
