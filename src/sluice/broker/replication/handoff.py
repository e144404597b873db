"""Controlled shutdown: a stopping broker hands each partition it leads to an in-sync
follower before it stops, instead of leaving it leaderless until the controller notices.

For each partition led here (``hand_off``): the successor is an in-sync follower that is
alive and fetched within ``RECENT_FETCH_S`` (so not a paused or dead broker still listed in
the ISR), the one furthest along; the partition state moves to it by compare-and-swap on
the version just read, in a new leader epoch, with this broker out of the ISR (it is
leaving: the new leader must not wait for its fetches).  The new state is applied here at
once: ``acks=all`` writes still waiting here fail with ``LEADERSHIP_LOST`` (retriable, may
have been stored), and the producers resend them to the new leader under the same
sequences, so nothing waits for a follower that will not fetch again.  A partition with no
such follower, or whose state changed meanwhile, is left as it is: the controller elects
its leader once this broker's registration ends, as after a crash.

Safety is that of any election: the swap fails if anything changed the state since it was
read, and the new epoch fences this broker's replica requests and writes.

``hand_over`` is that swap for one partition; a leader whose disk fails makes it too
(stepdown.py).

Event loop only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sluice.broker.partition import Partition
from sluice.broker.registry import Topic, TopicRegistry
from sluice.cluster.store import MetadataStore, PartitionState
from sluice.errors import UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.replication")

RECENT_FETCH_S = 1.0  # a follower fetches at least every 0.5 s (follower.py) while alive


def successor(part: Partition, isr: list[int], live: set[int], now: float) -> int | None:
    """The in-sync, live follower of ``part`` that fetched lately and has the most of its
    log (the first in ``isr`` order among equals), or None."""
    best, best_end = None, -1
    for r in isr:
        f = part.followers.get(r)
        if r == part.replica_id or r not in live or f is None:
            continue
        if now - f.fetched_at <= RECENT_FETCH_S and f.log_end > best_end:
            best, best_end = r, f.log_end
    return best


async def hand_over(store: MetadataStore, part: Partition, st: PartitionState, live: set[int]) -> PartitionState | None:
    """Hand the leadership of ``part``, in state ``st`` (as read from ``store``, naming
    this broker leader), to its ``successor`` among the other in-sync replicas: by
    compare-and-swap on ``st``'s version, in a new leader epoch, with this broker out of
    the ISR.  Returns the new state, or None when there is no successor; raises
    ``StateChanged`` when the swap lost to a change made meanwhile (and what the store
    raises: ``MetadataUnavailable``, ``UnknownTopic``, ``UnknownPartition``)."""
    isr = [r for r in st.isr if r != part.replica_id]
    heir = successor(part, isr, live, time.monotonic())
    if heir is None:
        return None
    new = PartitionState(heir, st.leader_epoch + 1, isr)
    if not await store.cas_partition_state(part.topic, part.index, st.version, new):
        raise StateChanged(f"the state of {part.topic}-{part.index} changed since version {st.version}")
    return new


class StateChanged(Exception):
    """A swap lost to a change of the partition state made meanwhile (never leaves the
    broker: the caller reads the state again, or leaves the partition to the controller)."""


async def hand_off(
    node_id: int, store: MetadataStore, registry: TopicRegistry, live: Callable[[], set[int]],
    apply: Callable[[Topic, int, PartitionState], None],
) -> int:
    """Hand every partition led here (``registry``) to a ``successor`` (module
    docstring), applying each new state here with ``apply(topic, index, state)``; returns
    how many moved.  ``live()``: the node ids of the live brokers.  Raises
    ``MetadataUnavailable`` when the store does not answer (the caller bounds the
    wait)."""
    moved = 0
    for topic in list(registry.topics.values()):
        led = [p for p in topic.partitions.values() if p.is_leader]
        if not led:
            continue
        try:
            states = await store.partition_states(topic.name)
        except UnknownTopic:
            continue
        for part in led:
            st = states[part.index] if part.index < len(states) else None
            if st is None or st.leader != node_id or not part.is_leader:
                continue
            try:
                new = await hand_over(store, part, st, live())
            except StateChanged:
                continue  # changed meanwhile: the controller takes it from here
            except (UnknownTopic, UnknownPartition):
                break
            if new is None:
                log.info("%s-%d: no live in-sync follower to hand leadership to", part.topic, part.index)
                continue
            log.info("%s-%d: leadership handed to broker %d in epoch %d (ISR %s): this broker stops",
                     part.topic, part.index, new.leader, new.leader_epoch, new.isr)
            if registry.topics.get(topic.name) is topic:
                apply(topic, part.index, new)
            moved += 1
    return moved
