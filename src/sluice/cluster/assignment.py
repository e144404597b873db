"""Replica assignment: which brokers hold the partitions of a new topic.

Kafka's goals, greedily: preferred leaders (the first replica of each partition) spread
evenly over the brokers first; then, round by round, each partition's next replica goes
to the broker holding the fewest that it does not use yet.  Ties rotate with the
partition index so that equal brokers take turns.  Pure: no I/O.
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

    def turn(b: int, k: int) -> int:
        return (brokers.index(b) - k) % n

    out = []
    for k in range(start, start + partitions):  # leaders first: evenly over the brokers
        leader = min(brokers, key=lambda b, k=k: (leading[b], held[b], turn(b, k)))
        leading[leader] += 1
        held[leader] += 1
        out.append([leader])
    for _ in range(factor - 1):  # then each round of followers, to the least loaded
        for k, replicas in enumerate(out, start):
            b = min((b for b in brokers if b not in replicas), key=lambda b, k=k: (held[b], turn(b, k)))
            held[b] += 1
            replicas.append(b)
    return out
