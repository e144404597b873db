"""Driver side of a read: which partitions, which offsets, how the work is split.

``Planner`` asks the cluster (blocking admin client) which partitions a read covers and
turns offset specs (``earliest``, ``latest``, JSON, a timestamp) into offsets.  The rest is
pure arithmetic on ``{(topic, partition): offset}`` maps: capping a micro-batch at
``maxOffsetsPerTrigger`` and cutting large ranges into ``minPartitions`` pieces.  Streaming
offsets go into Spark's checkpoint as ``{"topic": {"partition": offset}}``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from sluice import errors
from sluice.client.sync import SyncAdmin
from sluice.spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions
from sluice.spark.reading import OffsetRange

__all__ = ["Planner", "limit_offsets", "split_ranges", "to_json", "from_json", "ranges"]

TP = tuple[str, int]
Offsets = dict[TP, int]


class Planner:
    """The cluster as a read sees it.  Owns a ``SyncAdmin``; ``close()`` it."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._admin: SyncAdmin | None = None

    @property
    def admin(self) -> SyncAdmin:
        if self._admin is None:
            self._admin = SyncAdmin(self.opts.bootstrap)
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def partitions(self, strict: bool = True) -> list[TP]:
        """Every partition of the read's topics, now.  A named topic that does not exist is
        ``UnknownTopic`` when ``strict`` (else left out); a pattern may match nothing."""
        found = {t.name: len(t.partitions) for t in self.admin.list_topics()}
        if strict and self.opts.pattern is None:
            missing = [t for t in self.opts.topics if t not in found]
            if missing:
                raise errors.UnknownTopic(f"topic(s) {', '.join(missing)} do not exist")
        names = sorted(t for t in found if self.opts.matches(t))
        return [(t, p) for t in names for p in range(found[t])]

    def list_offsets(self, tps: Iterable[TP], timestamp: int) -> Offsets:
        """Offsets at ``timestamp`` (``LATEST``, ``EARLIEST`` or ms: the first offset with a
        timestamp at or after it, else the log end)."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for t, p in tps:
            by_topic[t].append(p)
        out: Offsets = {}
        for t, parts in by_topic.items():
            for p, off in self.admin.list_offsets(t, parts, timestamp).items():
                out[(t, p)] = off
        return out

    def resolve(self, spec: OffsetSpec, tps: list[TP], default: str) -> Offsets:
        """Offsets of ``tps`` per ``spec``; partitions a JSON spec leaves out get ``default``
        (``"earliest"`` or ``"latest"``)."""
        if isinstance(spec, int):
            return self.list_offsets(tps, spec)
        if isinstance(spec, str):
            return self.list_offsets(tps, EARLIEST if spec == "earliest" else LATEST)
        covered = set(tps)
        unknown = [f"{t}/{p}" for t, parts in spec.items() for p in parts if (t, p) not in covered]
        if unknown:
            raise errors.UnknownPartition(
                f"offsets given for partitions the read does not cover: {', '.join(unknown)}"
            )
        wanted = {tp: spec.get(tp[0], {}).get(tp[1], _WORD[default]) for tp in tps}
        out = {tp: off for tp, off in wanted.items() if off >= 0}
        for special in (EARLIEST, LATEST):
            todo = [tp for tp, off in wanted.items() if off == special]
            if todo:
                out.update(self.list_offsets(todo, special))
        return out


_WORD = {"earliest": EARLIEST, "latest": LATEST}


def ranges(start: Mapping[TP, int], end: Mapping[TP, int], opts: ReadOptions) -> list[OffsetRange]:
    """One ``OffsetRange`` per partition with ``start < end``, then split per
    ``minPartitions``."""
    out = [
        OffsetRange(t, p, start[(t, p)], off, opts)
        for (t, p), off in sorted(end.items())
        if (t, p) in start and start[(t, p)] < off
    ]
    return split_ranges(out, opts.min_partitions)


def split_ranges(rngs: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Cut ranges so there are at least ``min_partitions`` of them when there are that many
    offsets: ranges longer than ⌊total/min_partitions⌋ are cut into near-equal pieces."""
    if not min_partitions or len(rngs) >= min_partitions:
        return rngs
    total = sum(r.size for r in rngs)
    if total == 0:
        return rngs
    target = max(1, total // min_partitions)  # pieces ≤ target long: ≥ total/target ≥ min of them
    out = []
    for r in rngs:
        pieces = max(1, -(-r.size // target))
        step, extra = divmod(r.size, pieces)
        lo = r.start
        for i in range(pieces):
            hi = lo + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, lo, hi, r.options))
            lo = hi
    return out


def limit_offsets(start: Mapping[TP, int], latest: Mapping[TP, int], max_rows: int) -> Offsets:
    """End offsets that read at most ``max_rows`` records past ``start``, shared among
    partitions in proportion to what each has waiting (like Spark's Kafka source).  Reads
    exactly ``min(max_rows, waiting)``; a partition missing from ``start`` waits from 0."""
    waiting = {tp: max(0, off - start.get(tp, 0)) for tp, off in latest.items()}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(latest)
    take = {tp: n * max_rows // total for tp, n in waiting.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(waiting, key=lambda tp: waiting[tp] - take[tp], reverse=True):
        if left == 0:
            break
        if take[tp] < waiting[tp]:
            take[tp] += 1
            left -= 1
    return {tp: start.get(tp, 0) + take[tp] if waiting[tp] else off for tp, off in latest.items()}


def to_json(offsets: Mapping[TP, int]) -> dict:
    """``{(topic, p): off}`` → ``{"topic": {"p": off}}``, the form kept in the checkpoint."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = off
    return out


def from_json(doc: Mapping) -> Offsets:
    return {(t, int(p)): int(off) for t, parts in doc.items() for p, off in parts.items()}
