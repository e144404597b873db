"""Replica assignment: which brokers hold the partitions of a new topic, which take
over the replicas of brokers that left, and which replicas move to even out the load
(brokers that joined).

Kafka's goals, greedily: preferred leaders (the first replica of each partition) spread
evenly over the brokers first; then, round by round, each partition's next replica goes
to the broker holding the fewest that it does not use yet.  Ties rotate with the
partition index so that equal brokers take turns.

A broker's *load* is the number of partition replicas it holds (``replica_load``); new
replicas, and replacements of lost ones (``replace_lost_replicas``), go to the least
loaded; ``spread_replicas`` moves replicas from the most to the least loaded live
brokers until their loads differ by at most one; ``grow_replicas`` adds replicas to the
partitions of topics short of their replication factor (internal topics created while
brokers were down).  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

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


def replica_load(assignments: Iterable[Sequence[Sequence[int]]]) -> dict[int, int]:
    """How many partition replicas each broker holds, over topics' ``assignment`` lists."""
    load: dict[int, int] = {}
    for assignment in assignments:
        for replicas in assignment:
            for r in replicas:
                load[r] = load.get(r, 0) + 1
    return load


def replace_lost_replicas(
    assignments: Mapping[str, Sequence[Sequence[int]]],
    live: Iterable[int],
    *,
    topics: Collection[str] | None = None,
    keep: Collection[tuple[str, int]] = (),
) -> dict[str, dict[int, list[int]]]:
    """The new replica lists of the partitions that name a broker not in ``live``.

    ``assignments`` maps each topic of the cluster to its replica lists (by partition):
    all of them count in the load.  Only the partitions of ``topics`` (None: all) are
    planned, except those in ``keep`` ((topic, partition) pairs: an offline partition's
    dead replicas may hold its only copy).  The result maps topic -> partition -> new
    list, only for partitions that change.  Each dead broker
    is replaced in place (same position in the list) by the least loaded live broker not
    in the list already (ties: the lower node id); every replacement counts in the load
    of the next.  A dead broker no live broker can replace (all of them are in the list
    already) stays: the partition stays under-replicated until more brokers join.  Topics
    and partitions are planned in order (by name, then index), so the plan is
    deterministic.
    """
    live = sorted(set(live))
    alive = set(live)
    held = {b: 0 for b in live}
    for b, n in replica_load(assignments.values()).items():
        if b in alive:
            held[b] = n
    plan: dict[str, dict[int, list[int]]] = {}
    for name in sorted(assignments if topics is None else set(topics) & set(assignments)):
        for p, replicas in enumerate(assignments[name]):
            if (name, p) in keep or all(r in alive for r in replicas):
                continue
            new = list(replicas)
            for i, r in enumerate(new):
                if r in alive:
                    continue
                spare = [b for b in live if b not in new]
                if not spare:
                    continue
                b = min(spare, key=lambda b: (held[b], b))
                held[b] += 1
                new[i] = b
            if new != list(replicas):
                plan.setdefault(name, {})[p] = new
    return plan


def spread_replicas(
    assignments: Mapping[str, Sequence[Sequence[int]]],
    live: Iterable[int],
    *,
    leaders: Mapping[str, Sequence[int]] | None = None,
    topics: Collection[str] | None = None,
    keep: Collection[tuple[str, int]] = (),
) -> dict[str, dict[int, list[int]]]:
    """The target replica lists that even out the replica load of the ``live`` brokers,
    topic by topic and then overall.

    ``assignments`` maps each topic to its replica lists (with moves still pending already
    done: their targets); all of them count in the load.  Partitions of ``topics`` (None:
    all) are moved, except those in ``keep`` and those naming a broker not in ``live``.
    Greedily, one replica at a time moves from a most to a least loaded live broker, in
    place (same position in the list), in a partition the latter does not hold:

    1. per topic, while its most loaded live broker holds at least two of its replicas
       more than its least loaded one (ties: the overall load, then the node id);
    2. overall, while the most loaded live broker holds at least two replicas more than
       the least loaded one, in a topic where the former holds more than the latter (so
       each topic stays even).

    Partitions that the broker giving up a replica does not lead (``leaders``: topic ->
    leader by partition) go first, then by topic and partition (deterministic).  Every
    move makes a sum of squared loads smaller, so this ends; with every partition movable
    it ends with max - min <= 1 over ``live``, both per topic and overall.  A replica may
    move more than once; the result maps topic -> partition -> target list, only for
    partitions whose target differs from their list.  Never two replicas of a partition
    on one broker.
    """
    live = sorted(set(live))
    alive = set(live)
    leaders = leaders or {}
    planned = {name: [list(r) for r in a] for name, a in assignments.items()}
    held = dict.fromkeys(live, 0)
    per_topic = {name: dict.fromkeys(live, 0) for name in planned}
    for name, a in planned.items():
        for replicas in a:
            for r in replicas:
                if r in alive:
                    held[r] += 1
                    per_topic[name][r] += 1
    movable = sorted(
        (name, p)
        for name in (planned if topics is None else set(topics) & set(planned))
        for p, replicas in enumerate(planned[name])
        if (name, p) not in keep and all(r in alive for r in replicas)
    )

    def leads(name: str, p: int, b: int) -> bool:
        lead = leaders.get(name, ())
        return p < len(lead) and lead[p] == b

    def move(high: int, low: int, names: Collection[str]) -> bool:
        candidates = [(n, p) for n, p in movable
                      if n in names and high in planned[n][p] and low not in planned[n][p]]
        if not candidates:
            return False
        name, p = min(candidates, key=lambda tp: (leads(*tp, high), tp))
        replicas = planned[name][p]
        replicas[replicas.index(high)] = low
        for count in (held, per_topic[name]):
            count[high] -= 1
            count[low] += 1
        return True

    def pairs(count: Mapping[int, int]):
        """(high, low) pairs at least two apart, the furthest apart first."""
        by_load = sorted(live, key=lambda b: (count[b], held[b], b))
        return [(h, lo) for h in reversed(by_load) for lo in by_load if count[h] - count[lo] >= 2]

    for name in sorted({n for n, _ in movable}):
        count = per_topic[name]
        while any(move(h, lo, {name}) for h, lo in pairs(count)):
            pass
    while any(
        move(h, lo, {n for n, c in per_topic.items() if c[h] > c[lo]}) for h, lo in pairs(held)
    ):
        pass
    plan: dict[str, dict[int, list[int]]] = {}
    for name, p in movable:
        if planned[name][p] != list(assignments[name][p]):
            plan.setdefault(name, {})[p] = planned[name][p]
    return plan


def grow_replicas(
    assignments: Mapping[str, Sequence[Sequence[int]]],
    wanted: Mapping[str, int],
    live: Iterable[int],
    *,
    keep: Collection[str] = (),
) -> dict[str, dict[int, list[int]]]:
    """The grown replica lists of the topics of ``wanted`` (topic -> the replication factor
    it is meant to have) that have fewer replicas, as far as the ``live`` brokers allow.

    ``assignments`` maps each topic of the cluster to its replica lists: all of them count
    in the load.  A topic in ``keep`` (a pending move, a partition without a live leader)
    is not planned.  A topic's factor is one for all its partitions, so it grows to the
    largest factor up to ``wanted`` that every partition can reach with live brokers it
    does not hold yet; each partition appends the least loaded of them (ties: the lower
    node id), every addition counting in the load of the next.  The result maps topic ->
    partition -> new list (old list first: the preferred leader stays), for every
    partition of each topic that grows; topics in name order, so the plan is
    deterministic.
    """
    live = sorted(set(live))
    alive = set(live)
    held = dict.fromkeys(live, 0)
    for b, n in replica_load(assignments.values()).items():
        if b in alive:
            held[b] = n
    plan: dict[str, dict[int, list[int]]] = {}
    for name in sorted(wanted):
        lists = assignments.get(name)
        if name in keep or not lists:
            continue
        factor = len(lists[0])
        reachable = min(len(r) + len(alive - set(r)) for r in lists)
        grown = min(wanted[name], reachable)
        if grown <= factor or any(len(r) != factor for r in lists):
            continue
        out = {}
        for p, replicas in enumerate(lists):
            new = list(replicas)
            while len(new) < grown:
                b = min((b for b in live if b not in new), key=lambda b: (held[b], b))
                held[b] += 1
                new.append(b)
            out[p] = new
        plan[name] = out
    return plan
