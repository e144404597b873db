"""acks=all on one broker, honestly: through the high watermark, refused at once when the
topic asks for more in-sync replicas than there are; high watermarks checkpointed."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer
from sluice.protocol import messages as m

pytestmark = pytest.mark.timeout(120)


async def _create(bootstrap: str, name: str, config: dict | None = None, partitions: int = 1) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(name, partitions=partitions, config=config or {})


async def _read(bootstrap: str, topic: str, n: int) -> list:
    out: list = []
    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            out += await consumer.getmany(timeout_ms=500)
    return out


def test_acks_all_is_answered_and_readable(broker):
    async def run():
        await _create(broker.bootstrap, "all", {"flush.messages": "1"})
        async with Producer(broker.bootstrap, acks="all", linger_ms=1) as producer:
            futures = [await producer.send("all", b"v%d" % i, partition=0) for i in range(300)]
            metas = [await f for f in futures]
        assert [md.offset for md in metas] == list(range(300))
        async with Admin(broker.bootstrap) as admin:
            part = (await admin.describe_topic("all")).partitions[0]
        assert part.high_watermark == 300
        records = await _read(broker.bootstrap, "all", 300)
        assert [r.value for r in records] == [b"v%d" % i for i in range(300)]

    asyncio.run(run())


def test_min_insync_replicas_above_the_replicas_is_refused_at_create_and_alter(broker):
    """Such a topic could never take an acks=all write (a producer would retry until its
    delivery timeout): refused when configured.  (An ISR that shrinks below it refuses
    acks=all at once: tests/broker/test_partition_acks.py.)"""

    async def run():
        with pytest.raises(errors.InvalidConfig, match="min.insync.replicas=2 for topic 'strict': it has 1 replica"):
            await _create(broker.bootstrap, "strict", {"min.insync.replicas": "2"})
        await _create(broker.bootstrap, "strict", {"min.insync.replicas": "1"})
        async with Admin(broker.bootstrap) as admin:
            with pytest.raises(errors.InvalidConfig, match="min.insync.replicas=2"):
                await admin.alter_topic_config("strict", {"min.insync.replicas": "2"})
            assert [t.name for t in await admin.list_topics()] == ["strict"]
        async with Producer(broker.bootstrap, acks="all", retries=0) as producer:
            assert (await (await producer.send("strict", b"z", partition=0))).offset == 0

    asyncio.run(run())


def test_unknown_acks_value_is_an_invalid_request(broker):
    async def run():
        await _create(broker.bootstrap, "acks")
        async with Producer(broker.bootstrap) as producer:
            conn = await producer._cluster.connection(0)
            req = m.ProduceRequest(partitions=[], acks=2)
            resp, _ = await conn.request(req, (), 5, check=False)
            assert resp.error == errors.InvalidRequest.code and "acks" in resp.message

    asyncio.run(run())


def test_high_watermarks_are_checkpointed(broker_factory):
    broker = broker_factory(extra_args=["--hw-checkpoint-ms", "100", "--groups-partitions", "1"]).start()
    path = broker.data_dir / "logs" / "replication-offset-checkpoint"

    async def run():
        await _create(broker.bootstrap, "cp", partitions=2)
        async with Producer(broker.bootstrap, acks="all") as producer:
            await (await producer.send_many("cp", [b"a"] * 7, partition=0))
            await (await producer.send_many("cp", [b"b"] * 3, partition=1))

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while not (path.exists() and "cp 0 7" in path.read_text()):
        assert time.monotonic() < deadline, "no checkpoint within 10 s"
        time.sleep(0.05)
    assert path.read_text().splitlines() == ["0", "3", "__groups 0 0", "cp 0 7", "cp 1 3"]
    assert broker.stop() == 0
    assert path.read_text().splitlines()[2:] == ["__groups 0 0", "cp 0 7", "cp 1 3"]
    path.write_text("garbage\n")  # derived data: a bad file is set aside, the broker starts
    broker.start()
    assert "replication-offset-checkpoint is corrupt" in broker.log()
    assert len(asyncio.run(_read(broker.bootstrap, "cp", 7))) == 7
