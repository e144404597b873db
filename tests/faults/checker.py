"""A Jepsen-style checker: what producers were told, against what the partitions hold.

Producers send values made by ``History.value(producer, seq)`` and record each send's
outcome (``acked`` with its ``RecordMetadata``, or ``failed`` with its error).  After the
faults, every partition is read from its log start to its end and ``History.check(logs)``
verifies, raising ``AssertionError`` with what went wrong:

- every acknowledged message is in the log, once, at the partition and offset it was
  acknowledged with (never lost, never duplicated);
- a failed send that said ``maybe_stored=False`` is not in the log; one that said ``True``
  is there at most ``max_unsure_copies`` times; every failure says one or the other;
- offsets of each partition are dense and increasing from the log start;
- per (producer, partition), the first copies of its messages are in send order.

An acknowledgement with offset -1 (an idempotent producer's duplicate answered without its
place: producer.py) must be in its partition exactly once.  ``check_reads`` adds what
consumers saw during the faults: every record read is in the final log, at the offset it
was read at (nothing a consumer saw vanished or changed later).

It returns a ``Report`` with the counts (duplicates included) for the test to print.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sluice.errors import SluiceError


@dataclass
class Report:
    sent: int
    acked: int
    failed: int
    unsure: int  # failures that said the records may have been stored
    stored: int  # records in the log that came from this history
    duplicates: int  # records stored beyond their first copy

    def __str__(self) -> str:
        return (
            f"sent {self.sent}, acked {self.acked}, failed {self.failed} ({self.unsure} maybe "
            f"stored), stored {self.stored}, duplicates {self.duplicates}"
        )


@dataclass
class History:
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # value -> (p, offset)
    failed: dict[bytes, SluiceError] = field(default_factory=dict)
    sent: dict[bytes, tuple[str, int]] = field(default_factory=dict)  # value -> (producer, seq)

    def value(self, producer: str, seq: int, size: int = 0) -> bytes:
        """A unique value naming its producer and sequence, padded to ``size`` bytes."""
        v = f"{producer}:{seq:09d}".encode()
        self.sent[v] = (producer, seq)
        return v + b"." * max(0, size - len(v))

    def _key(self, value: bytes) -> bytes:
        return value.rstrip(b".")

    def ack(self, value: bytes, meta) -> None:
        self.acked[self._key(value)] = (meta.partition, meta.offset)

    def fail(self, value: bytes, exc: SluiceError) -> None:
        self.failed[self._key(value)] = exc

    def check(self, logs: dict[int, list], max_unsure_copies: int = 1, max_acked_copies: int = 1) -> Report:
        """``logs``: partition -> every record from the log start, in offset order.

        ``max_acked_copies`` > 1 allows an acknowledged message stored more than once (a
        producer without idempotence resending after a failover that its first attempt
        survived): it is still at the offset it was acknowledged with, and the extra copies
        are counted as duplicates."""
        copies: Counter = Counter()
        places: dict[bytes, list[tuple[int, int]]] = {}
        at: dict[tuple[int, int], bytes] = {}
        firsts: dict[tuple[str, int], list[int]] = {}
        for partition, records in logs.items():
            offsets = [r.offset for r in records]
            start = offsets[0] if offsets else 0
            assert offsets == list(range(start, start + len(offsets))), (
                f"partition {partition}: offsets are not dense and increasing"
            )
            for r in records:
                key = self._key(r.value or b"")
                if key not in self.sent:
                    continue
                copies[key] += 1
                places.setdefault(key, []).append((partition, r.offset))
                at[(partition, r.offset)] = key
                if copies[key] == 1:
                    producer, seq = self.sent[key]
                    firsts.setdefault((producer, partition), []).append(seq)
        for value, where in self.acked.items():
            if where[1] < 0:  # a duplicate answered without its offset: stored once, somewhere
                assert [p for p, _ in places.get(value, [])] == [where[0]], (
                    f"acknowledged {value!r} (offset unknown) in partition {where[0]} is at {places.get(value)}"
                )
                continue
            assert at.get(where) == value, f"acknowledged {value!r} at {where} is not there"
            assert copies[value] <= max_acked_copies, (
                f"acknowledged {value!r} at {where} stored {copies[value]} times, at {places[value]}"
            )
        unsure = 0
        for value, exc in self.failed.items():
            assert exc.maybe_stored in (True, False), f"{value!r} failed without saying: {exc!r}"
            if exc.maybe_stored:
                unsure += 1
                assert copies[value] <= max_unsure_copies, f"{value!r} stored {copies[value]}×"
            else:
                assert copies[value] == 0, f"{value!r} said not stored but is: {exc}"
        for (producer, partition), seqs in firsts.items():
            assert seqs == sorted(seqs), f"{producer} out of order in partition {partition}"
        return Report(
            sent=len(self.sent), acked=len(self.acked), failed=len(self.failed), unsure=unsure,
            stored=sum(copies.values()), duplicates=sum(n - 1 for n in copies.values() if n > 1),
        )


def check_reads(reads: dict[tuple[int, int], bytes], logs: dict[int, list]) -> int:
    """``reads``: (partition, offset) -> value of every record consumers read during the
    run.  Each must be in ``logs`` (the final read of every partition from its log start)
    at that offset with that value; returns how many were checked.  A record read below
    the final log start (deleted by retention) cannot be judged and is skipped."""
    final = {(p, r.offset): r.value or b"" for p, records in logs.items() for r in records}
    starts = {p: (records[0].offset if records else None) for p, records in logs.items()}
    checked = 0
    for (partition, offset), value in sorted(reads.items()):
        start = starts.get(partition)
        if start is not None and offset < start:
            continue
        assert final.get((partition, offset)) == value, (
            f"a consumer read {value!r} at partition {partition} offset {offset}; the log now has "
            f"{final.get((partition, offset))!r} there"
        )
        checked += 1
    return checked


async def read_logs(bootstrap: str, topic: str) -> dict[int, list]:
    """Every record of every partition of ``topic``, from its log start to its high
    watermark now, as the partition's leader has it (each leader is asked for the end of
    what it leads: any other broker does not know it)."""
    from sluice.client import Admin, Consumer
    from sluice.client.cluster import Cluster

    cluster = Cluster(bootstrap)
    try:
        meta = await cluster.refresh([topic])
    finally:
        await cluster.close()
    addresses = {b.node_id: f"{b.host}:{b.port}" for b in meta.brokers}
    [t] = [t for t in meta.topics if t.name == topic]
    ends: dict[int, int] = {}
    for leader in sorted({p.leader for p in t.partitions}):
        assert leader in addresses, f"{topic}: a partition has no live leader ({leader})"
        async with Admin(addresses[leader]) as admin:
            desc = await admin.describe_topic(topic)
        ends.update({d.partition: d.high_watermark for d in desc.partitions if d.leader == leader})
    consumer = Consumer(bootstrap, enable_auto_commit=False)
    consumer.assign([(topic, p) for p in ends])
    logs: dict[int, list] = {p: [] for p in ends}
    try:
        await consumer.seek_to_beginning()
        while any(consumer.position((topic, p)) < end for p, end in ends.items()):
            for rec in await consumer.getmany(timeout_ms=2000):
                logs[rec.partition].append(rec)
    finally:
        await consumer.close()
    return logs
