"""The idempotent producer against a real broker process: answers lost after the write was
stored (a fault-injecting proxy), across a broker SIGKILL and restart, sequences across
2**31, and an older epoch fenced by a newer one."""

from __future__ import annotations

import asyncio

import pytest
from proxy import FaultyProxy

from sluice.client import Admin, Consumer, Producer
from sluice.client.sequences import SEQUENCE_MOD, PartitionSequences
from sluice.errors import ProducerFenced
from sluice.harness import eventually, free_port
from sluice.protocol.messages import Api

DERIVED = 1 << 62


async def _read_all(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) of a partition."""
    async with Admin(bootstrap) as admin:
        end = (await admin.describe_topic(topic)).partitions[partition].high_watermark
    consumer = Consumer(bootstrap, enable_auto_commit=False)
    consumer.assign([(topic, partition)])
    out = []
    try:
        await consumer.seek_to_beginning()
        while consumer.position((topic, partition)) < end:
            out += [(r.offset, r.value) for r in await consumer.getmany(timeout_ms=2000)]
    finally:
        await consumer.close()
    return out


async def _lost_answers(broker, proxy_port: int, restart: bool) -> None:
    async with Admin(broker.bootstrap) as admin:
        await admin.create_topic("idem", partitions=1)
    proxy = await FaultyProxy("127.0.0.1", broker.port, port=proxy_port).start()
    try:
        # the retry waits out the restart: it reaches the restarted broker, not the old one
        async with Producer(proxy.address, linger_ms=0, retry_backoff_ms=300) as producer:
            first = await (await producer.send("idem", b"first", partition=0))
            proxy.lose_responses(Api.PRODUCE, 1)
            futs = []
            for i in range(5):  # several requests in flight; the first answer is lost
                futs.append(await producer.send("idem", b"v%d" % i, partition=0))
            await eventually(lambda: proxy.lost == 1, 20, "the lost answer", interval=0.01)
            if restart:
                broker.kill()  # SIGKILL: the producer state must come back from the log
                broker.start()
            metas = await asyncio.wait_for(asyncio.gather(*futs), 60)
        stored = await _read_all(proxy.address, "idem")
    finally:
        await proxy.close()
    assert [v for _, v in stored] == [b"first"] + [b"v%d" % i for i in range(5)]
    assert [first.offset, *(m.offset for m in metas)] == [o for o, _ in stored]


@pytest.mark.parametrize("restart", [False, True], ids=["lost-answer", "lost-answer-and-sigkill"])
def test_lost_answers_store_one_copy_and_resolve_to_it(broker_factory, restart):
    proxy_port = free_port()
    broker = broker_factory(extra_args=["--advertise", f"127.0.0.1:{proxy_port}"])
    broker.start()
    asyncio.run(_lost_answers(broker, proxy_port, restart))


async def _wrap(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic("wrap", partitions=1)
    async with Producer(bootstrap, linger_ms=0, producer_id=DERIVED + 11, producer_epoch=0) as p:
        st = p._sender.identity.partitions[("wrap", 0)] = PartitionSequences(DERIVED + 11, 0, True)
        st.next_sequence = SEQUENCE_MOD - 5  # test hook: the partition's first sequence
        results = []
        for i in range(6):  # batches of 3: 2**31-5, 2**31-2, 1, 4, 7, 10
            results.append(await (await p.send_many("wrap", [b"%d-%d" % (i, j) for j in range(3)], partition=0)))
        assert st.next_sequence == 13 and st.epoch == 0
    assert results == [(0, 3 * i) for i in range(6)]
    # a new producer with the same identity repeats the batches after the boundary: duplicates
    async with Producer(bootstrap, linger_ms=0, producer_id=DERIVED + 11, producer_epoch=0) as p:
        st = p._sender.identity.partitions[("wrap", 0)] = PartitionSequences(DERIVED + 11, 0, True)
        st.next_sequence = 4
        again = await (await p.send_many("wrap", [b"3-%d" % j for j in range(3)], partition=0))
    assert again == (0, 9)
    stored = await _read_all(bootstrap, "wrap")
    assert [v for _, v in stored] == [b"%d-%d" % (i, j) for i in range(6) for j in range(3)]


def test_sequences_across_2_31(broker):
    asyncio.run(_wrap(broker.bootstrap))


async def _fencing(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic("fence", partitions=1)
    async with Producer(bootstrap, linger_ms=0, producer_id=DERIVED + 3, producer_epoch=0) as old:
        await (await old.send("fence", b"old-before", partition=0))
        async with Producer(bootstrap, linger_ms=0, producer_id=DERIVED + 3, producer_epoch=1) as new:
            await (await new.send("fence", b"new", partition=0))
        with pytest.raises(ProducerFenced) as info:
            await (await old.send("fence", b"old-after", partition=0))
        assert info.value.maybe_stored is False
        with pytest.raises(ProducerFenced):
            await old.send("fence", b"later", partition=0)
    assert [v for _, v in await _read_all(bootstrap, "fence")] == [b"old-before", b"new"]


def test_an_older_epoch_is_fenced(broker):
    asyncio.run(_fencing(broker.bootstrap))
