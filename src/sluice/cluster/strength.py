"""Topics brought up to full strength: replicas added to the topics that have fewer than
their ``TopicRecord.full_factor`` (an internal topic created while brokers were down), as
soon as live brokers can hold them.

Called by the controller on each reconcile pass (so a broker that returns, or joins, gets
the missing replicas within a pass) and by ``sluice cluster rebalance``
(broker/replication/reassignment.py).  The growth is one ``MetadataStore.reassign`` per topic that
raises its replication factor and appends the new replicas to every partition's list;
the brokers newly listed open the partition empty and follow its leader, which admits
them to the ISR once caught up (the machinery of replica replacement).  A topic with a
pending move, or with a partition without a live leader, waits: its replicas are not
settled.  Event loop only.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from sluice.cluster.assignment import grow_replicas
from sluice.cluster.store import MetadataStore
from sluice.errors import BrokerError, UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.strength")


@dataclass(frozen=True)
class Growth:
    """One topic's growth: the replica lists before and after (by partition), and the error
    when the store refused it (None: done)."""

    topic: str
    old: list[list[int]]
    new: dict[int, list[int]]
    error: BrokerError | None = None


async def restore_strength(
    store: MetadataStore, live: Collection[int], topics: Collection[str] | None = None
) -> list[Growth]:
    """Grow every topic of ``topics`` (None: all) that is short of its ``full_factor`` as far
    as the ``live`` brokers allow; one ``Growth`` per topic planned.  A topic changed
    concurrently (the store refuses the stale plan) is left to the next pass."""
    live = set(live)
    if not live:
        return []  # a store outage looks like no brokers at all: change nothing
    records = await store.topics()
    short = {
        name: r.full_factor for name, r in records.items()
        if r.full_factor > r.replication_factor and (topics is None or name in topics)
    }
    if not short:
        return []
    keep = set()
    for name in short:
        if records[name].moving:
            keep.add(name)
            continue
        try:
            states = await store.partition_states(name)
        except UnknownTopic:
            keep.add(name)
            continue
        if any(st.leader not in live for st in states):
            keep.add(name)
    plan = grow_replicas({n: r.assignment for n, r in records.items()}, short, live, keep=keep)
    out = []
    for name, changes in plan.items():
        record = records[name]
        factor = len(changes[0])
        try:
            await store.reassign(name, changes, replication_factor=factor)
        except (UnknownTopic, UnknownPartition):
            continue
        except BrokerError as exc:
            log.warning("cannot add replicas to %s: %s", name, exc)
            out.append(Growth(name, record.assignment, changes, exc))
            continue
        log.info(
            "%s: replication factor %d -> %d (of %d), replicas %s -> %s (live brokers %s)",
            name, record.replication_factor, factor, record.full_factor, record.assignment,
            [changes[p] for p in sorted(changes)], sorted(live),
        )
        out.append(Growth(name, record.assignment, changes))
    return out
