"""Replica assignment: which brokers hold the partitions of a new topic.

Kafka's goals, greedily: every partition gets ``factor`` distinct brokers; preferred
leaders (the first replica) spread evenly over the brokers, then replicas go to the
brokers holding the fewest; ties rotate with the partition index so that equal brokers
take turns.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluice.errors import InvalidReplicationFactor


def assign_replicas(
    partitions: int,
    factor: int,
    brokers: Sequence[int],
    load: Mapping[int, int] | None = None,
    *,
    start: int = 0,
) -> list[list[int]]:
    """Replica lists (preferred leader first) for ``partitions`` new partitions, numbered
    from ``start``, over ``brokers`` (live node ids); ``load`` counts the replicas each
    broker holds already.  ``InvalidReplicationFactor`` unless 1 <= factor <= brokers."""
    brokers = sorted(set(brokers))
    if not 1 <= factor <= len(brokers):
        raise InvalidReplicationFactor(
            f"replication factor {factor} needs that many live brokers; {len(brokers)} alive"
        )
    held = {b: (load or {}).get(b, 0) for b in brokers}
    leading = dict.fromkeys(brokers, 0)
    n = len(brokers)
    out = []
    for k in range(start, start + partitions):
        def turn(b: int, k: int = k) -> int:
            return (brokers.index(b) - k) % n

        leader = min(brokers, key=lambda b: (leading[b], held[b], turn(b)))
        others = sorted((b for b in brokers if b != leader), key=lambda b: (held[b], turn(b)))
        replicas = [leader, *others[: factor - 1]]
        leading[leader] += 1
        for b in replicas:
            held[b] += 1
        out.append(replicas)
    return out
