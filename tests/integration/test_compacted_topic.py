"""A compacted topic on a real broker: the cleaner runs from the retention pass, a consumer
from the beginning sees the latest value of every key at its original offset, and a
restart keeps the cleaned log."""

from __future__ import annotations

import asyncio
import time

from sluice.client import Admin, Consumer, Producer

KEYS, ROUNDS, DELETED = 20, 30, 5
TOPIC = "compacted"


async def _produce(bootstrap: str) -> dict[int, tuple[bytes, bytes | None]]:
    """ROUNDS updates of every key, the last round deleting the first DELETED keys;
    returns offset -> (key, value) as acknowledged."""
    produced = {}
    async with Admin(bootstrap) as admin:
        await admin.create_topic(TOPIC, config={
            "cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.percent": "1",
        })
    async with Producer(bootstrap, linger_ms=0) as p:
        for r in range(ROUNDS):
            for k in range(KEYS):
                key = b"key-%d" % k
                value = None if r == ROUNDS - 1 and k < DELETED else b"round-%d-" % r + b"x" * 40
                meta = await (await p.send(TOPIC, value, key=key, partition=0))
                produced[meta.offset] = (key, value)
    return produced


async def _consume(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    consumer = Consumer(bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    consumer.assign([(TOPIC, 0)])
    got = []
    try:
        while consumer.position((TOPIC, 0)) is None or consumer.position((TOPIC, 0)) < end:
            batch = await consumer.getmany(timeout_ms=5000)
            assert batch, f"stalled at {consumer.position((TOPIC, 0))} of {end}"
            got += [(r.offset, r.key, r.value) for r in batch]
    finally:
        await consumer.close()
    return got


def _cleaned_up_to(broker) -> int:
    try:
        return int((broker.data_dir / "logs" / f"{TOPIC}-0" / "cleaner-offset-checkpoint").read_text())
    except FileNotFoundError:
        return 0


def test_consumers_of_a_compacted_topic_see_the_latest_value_per_key(broker_factory):
    broker = broker_factory(extra_args=["--retention-check-ms", "100"]).start()
    produced = asyncio.run(_produce(broker.bootstrap))
    end = KEYS * ROUNDS
    assert sorted(produced) == list(range(end))
    latest = {}
    for offset in sorted(produced):
        key, value = produced[offset]
        latest[key] = (offset, value)

    deadline = time.monotonic() + 30
    while _cleaned_up_to(broker) < end - 10:  # every closed segment (~6 records each) cleaned
        assert time.monotonic() < deadline, f"not cleaned: {_cleaned_up_to(broker)}\n{broker.log()}"
        time.sleep(0.1)
    cleaned = _cleaned_up_to(broker)

    def check(got) -> None:
        assert [o for o, *_ in got] == sorted({o for o, *_ in got}), "offsets increase"
        assert all(produced[o] == (k, v) for o, k, v in got), "each record at its original offset"
        below = [k for o, k, _ in got if o < cleaned]
        assert len(below) == len(set(below)), "one record per key in the cleaned part"
        assert {k: (o, v) for o, k, v in got} == latest  # tombstones included (delete.retention.ms: 1 day)
        assert len(got) < end // 5

    got = asyncio.run(_consume(broker.bootstrap, end))
    check(got)
    broker.stop()
    broker.start()
    assert asyncio.run(_consume(broker.bootstrap, end)) == got
