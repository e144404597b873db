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

Event loop only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sluice.broker.partition import Partition
from sluice.cluster.store import PartitionState
from sluice.errors import UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.replication")

RECENT_FETCH_S = 1.0  # a follower fetches at least every 0.5 s (broker/fetcher.py) while alive


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


async def hand_off(broker, apply: Callable[[object, int, PartitionState], None]) -> int:
    """Hand every partition ``broker`` leads to a ``successor`` (module docstring), applying
    each new state here with ``apply(topic, index, state)``; returns how many moved.
    Raises ``MetadataUnavailable`` when the store does not answer (the caller bounds the
    wait)."""
    me = broker.config.node_id
    moved = 0
    for topic in list(broker.topics.values()):
        led = [p for p in topic.partitions.values() if p.is_leader]
        if not led:
            continue
        try:
            states = await broker.metadata.partition_states(topic.name)
        except UnknownTopic:
            continue
        live = set(broker.live_brokers)
        now = time.monotonic()
        for part in led:
            st = states[part.index] if part.index < len(states) else None
            if st is None or st.leader != me or not part.is_leader:
                continue
            target = successor(part, list(st.isr), live, now)
            if target is None:
                log.info("%s-%d: no live in-sync follower to hand leadership to", part.topic, part.index)
                continue
            new = PartitionState(target, st.leader_epoch + 1, [r for r in st.isr if r != me])
            try:
                if not await broker.metadata.cas_partition_state(part.topic, part.index, st.version, new):
                    continue  # changed meanwhile: the controller takes it from here
            except (UnknownTopic, UnknownPartition):
                break
            log.info("%s-%d: leadership handed to broker %d in epoch %d (ISR %s): this broker stops",
                     part.topic, part.index, target, new.leader_epoch, new.isr)
            if broker.topics.get(topic.name) is topic:
                apply(topic, part.index, new)
            moved += 1
    return moved
