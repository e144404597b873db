"""Admin API against a real broker process: topic config changes and new partitions take
effect on the running broker and its clients, groups, offset resets, errors, restarts."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta, timezone

import pytest

from clock import millisecond_after_now
from sluice import errors
from sluice.client import Admin, Consumer, Producer, SyncAdmin, SyncConsumer, SyncProducer
from sluice.client.admin import OffsetReset
from sluice.harness import eventually

pytestmark = pytest.mark.timeout(60)


async def until(condition, what: str, timeout: float = 10, interval: float = 0.05):
    """Poll the async ``condition`` until it returns a truthy value; that value
    (``sluice.harness.eventually``)."""
    return await eventually(condition, timeout, what, interval=interval)


async def fill(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    async with Producer(bootstrap, linger_ms=0) as producer:
        await (await producer.send_many(topic, values, partition=partition))


# ---------------------------------------------------------------------- topic config


def test_alter_config_applies_to_the_running_broker(broker):
    async def main():
        b = broker.bootstrap
        async with Admin(b) as admin, Producer(b, linger_ms=0) as producer:
            await admin.create_topic("live", config={"retention.ms": "3600000"})
            big = b"x" * 2000
            await (await producer.send("live", big))  # the producer learns the 1 MiB limit

            await admin.alter_topic_config("live", {"max.message.bytes": "1024"})
            desc = await admin.describe_topic("live")
            assert desc.config["max.message.bytes"] == "1024"
            assert desc.config["retention.ms"] == "3600000"  # other overrides stay
            # the producer's metadata is stale: the broker itself refuses
            with pytest.raises(errors.MessageTooLarge, match="max.message.bytes=1024"):
                await (await producer.send("live", big))
            await (await producer.send("live", b"small"))

            # the writer follows a new timestamp type from its next write
            await admin.alter_topic_config("live", {"timestamp.type": "CreateTime"})
            meta = await (await producer.send("live", b"old", timestamp_ms=1_000_000))
            # a smaller segment.bytes rolls the active segment at the next append
            before = (await admin.describe_topic("live")).partitions[0].segments
            await admin.alter_topic_config("live", {"segment.bytes": "1024"})
            for _ in range(3):
                await (await producer.send("live", b"y" * 600))
            assert (await admin.describe_topic("live")).partitions[0].segments >= before + 2

            # --delete: back to the broker's default
            await admin.alter_topic_config("live", delete=["retention.ms", "timestamp.type"])
            desc = await admin.describe_topic("live")
            assert desc.config["retention.ms"] == str(7 * 24 * 3600 * 1000)
            assert desc.config["timestamp.type"] == "LogAppendTime"

        consumer = Consumer(b, enable_auto_commit=False, fetch_max_wait_ms=100)
        consumer.assign([("live", 0)])
        try:
            consumer.seek("live", 0, meta.offset)
            [rec] = await consumer.getmany(timeout_ms=2000, max_records=1)
            assert (rec.value, rec.timestamp) == (b"old", 1_000_000)
        finally:
            await consumer.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("config", "delete", "needle"),
    [
        ({"no.such.key": "1"}, [], "no.such.key"),
        ({"retention.ms": "abc"}, [], "retention.ms"),
        ({"retention.ms": "٣٣"}, [], "retention.ms must be an integer, got '٣٣'"),  # digits, but not ASCII
        ({"retention.ms": "1_000"}, [], "retention.ms must be an integer"),
        ({"segment.bytes": "10"}, [], "segment.bytes"),
        ({}, ["no.such.key"], "no.such.key"),
        ({"flush.ms": "5"}, ["flush.ms"], "both set and deleted"),
        ({"retention.ms": "5", "max.message.bytes": "1"}, [], "max.message.bytes"),  # all or nothing
    ],
)
def test_alter_config_refuses_bad_input_and_changes_nothing(broker, config, delete, needle):
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("c", config={"flush.ms": "2000"})
        before = admin.describe_topic("c").config
        with pytest.raises(errors.InvalidConfig, match=needle) as ei:
            admin.alter_topic_config("c", config, delete=delete)
        assert ei.value.code == 9
        with pytest.raises(errors.InvalidConfig):
            admin.alter_topic_config("c", config, delete=delete, validate_only=True)
        assert admin.describe_topic("c").config == before
        with pytest.raises(errors.UnknownTopic):
            admin.alter_topic_config("nope", {"retention.ms": "5"})


def test_validate_only_and_dry_run_change_nothing(broker):
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("v", partitions=2)
        before = admin.describe_topic("v")
        admin.alter_topic_config("v", {"retention.ms": "5"}, validate_only=True)
        assert admin.add_partitions("v", count=3, validate_only=True) == 5
        assert admin.describe_topic("v") == before
        admin.reset_group_offsets("g", "v", to="latest")
        resets = admin.reset_group_offsets("g", "v", to=5, dry_run=True)
        assert resets == [OffsetReset("v", 0, 0, 0), OffsetReset("v", 1, 0, 0)]  # clamped to the log
        admin.reset_group_offsets("fresh", "v", to="earliest", dry_run=True)
        assert [g.name for g in admin.list_groups()] == ["g"]  # a dry run creates no group


# ---------------------------------------------------------------------- partitions


def test_new_partitions_reach_a_running_producer_and_subscribed_consumer(broker):
    async def main():
        b = broker.bootstrap
        async with Admin(b) as admin:
            await admin.create_topic("grow", partitions=1)
            producer = Producer(b, linger_ms=0, metadata_max_age_ms=200)
            consumer = Consumer(b, auto_offset_reset="earliest", fetch_max_wait_ms=100, metadata_max_age_ms=200)
            consumer.subscribe(["grow"])
            await producer.start()
            try:
                await (await producer.send("grow", b"before"))
                assert await admin.add_partitions("grow", count=2) == 3
                # an explicit partition the producer has not heard of yet: it asks again
                meta = await (await producer.send("grow", b"p2", partition=2))
                assert (meta.partition, meta.offset) == (2, 0)

                # keyed sends spread over the new partitions once its metadata refreshes
                async def lands_on_new_partition():
                    key = b"k%d" % time.monotonic_ns()
                    return (await (await producer.send("grow", b"keyed", key=key))).partition > 0

                await until(lands_on_new_partition, "a keyed send to a new partition")

                seen: set[tuple[int, bytes]] = set()

                async def consumer_saw_p2():
                    seen.update((r.partition, r.value) for r in await consumer.getmany(timeout_ms=200))
                    return (2, b"p2") in seen

                await until(consumer_saw_p2, "the subscribed consumer to read partition 2")
                assert (0, b"before") in seen
                assert sorted(tp[1] for tp in consumer.assignment()) == [0, 1, 2]
            finally:
                await consumer.close()
                await producer.close()

    asyncio.run(main())


def test_add_partitions_refuses_bad_counts(broker):
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("p", partitions=3)
        for kw in ({"total": 2}, {"total": 3}, {"count": 0}, {"count": -1}, {"total": 10_001}):
            with pytest.raises(errors.InvalidPartitions) as ei:
                admin.add_partitions("p", **kw)
            assert ei.value.code == 8
        assert "above 3" in str(ei.value) or "10000" in str(ei.value)
        with pytest.raises(errors.InvalidPartitions) as ei:
            admin.add_partitions("p", count=-5)  # said as given, not as the total 3 - 5
        assert ei.value.message == "partitions to add must be at least 1, got -5"
        for kw in ({}, {"total": 4, "count": 1}, {"total": "4"}):
            with pytest.raises(errors.ConfigError):
                admin.add_partitions("p", **kw)
        with pytest.raises(errors.UnknownTopic):
            admin.add_partitions("nope", total=5)
        assert len(admin.describe_topic("p").partitions) == 3


# ---------------------------------------------------------------------- groups


def test_group_list_describe_delete(broker):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("orders", partitions=2)
        with SyncProducer(b, linger_ms=0) as producer:
            producer.send_many("orders", [b"a", b"b", b"c"], partition=0).result()
            producer.send_many("orders", [b"d"], partition=1).result()
        assert admin.list_groups() == []

        t0 = int(time.time() * 1000)
        consumer = SyncConsumer(b, group="billing", enable_auto_commit=False)
        try:
            consumer.assign([("orders", 0)])
            consumer.seek("orders", 0, 0)
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 2:
                assert time.monotonic() < deadline
                got += consumer.getmany(timeout_ms=500, max_records=2 - len(got))
            consumer.commit()
        finally:
            consumer.close()
        t1 = int(time.time() * 1000)

        [listing] = admin.list_groups()
        assert (listing.name, listing.topics, listing.partitions, listing.lag) == ("billing", ["orders"], 1, 1)
        assert t0 <= listing.last_commit_ms <= t1

        desc = admin.describe_group("billing")
        p0, p1 = desc.partitions
        assert (p0.partition, p0.committed_offset, p0.high_watermark, p0.lag) == (0, 2, 3, 1)
        assert t0 <= p0.commit_time_ms <= t1
        assert p0.committed_by.startswith("127.0.0.1:")
        # a partition of the same topic the group never committed
        assert (p1.partition, p1.committed_offset, p1.high_watermark, p1.lag) == (1, -1, 1, -1)
        assert (p1.commit_time_ms, p1.committed_by) == (-1, "")

        admin.delete_group("billing")
        assert admin.list_groups() == []
        for call in (admin.describe_group, admin.delete_group):
            with pytest.raises(errors.UnknownGroup) as ei:
                call("billing")
            assert ei.value.code == 22
            with pytest.raises(errors.InvalidGroup):
                call("bad name")


def test_internal_groups_topic_is_hidden_read_only_and_readable(broker):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("orders")
        assert [t.name for t in admin.list_topics()] == ["orders"]
        internal = [t for t in admin.list_topics(include_internal=True) if t.internal]
        assert [(t.name, len(t.partitions)) for t in internal] == [("__groups", 8)]
        admin.reset_group_offsets("billing", "orders", to=0)
    with SyncProducer(b, linger_ms=0, retries=0) as producer:
        with pytest.raises(errors.InvalidRequest, match="topic __groups is internal: written by brokers only"):
            producer.send("__groups", b"forged", partition=0).result()
    consumer = SyncConsumer(b, auto_offset_reset="earliest")
    try:  # clients may read it: one record per committed partition
        consumer.assign([("__groups", p) for p in range(8)])
        got = []
        deadline = time.monotonic() + 10
        while not got:
            assert time.monotonic() < deadline
            got += consumer.getmany(timeout_ms=200)
        assert len(got) == 1 and got[0].key.startswith(b"\x94\x00\xa7billing")
    finally:
        consumer.close()


def test_reset_group_offsets(broker):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("r", partitions=2)
        with SyncProducer(b, linger_ms=0) as producer:
            producer.send_many("r", [b"old-%d" % i for i in range(3)], partition=0).result()
            cut = millisecond_after_now()  # the old messages are before it, the new ones after
            producer.send_many("r", [b"new-0", b"new-1"], partition=0).result()

        def reset(**kw):
            return [(r.partition, r.old, r.new) for r in admin.reset_group_offsets("g", "r", **kw)]

        assert reset(to=2) == [(0, None, 2), (1, None, 0)]  # a new group; clamped to the log
        assert reset(shift_by=1, partitions=[0]) == [(0, 2, 3)]
        assert reset(shift_by=-10) == [(0, 3, 0), (1, 0, 0)]
        assert reset(to="latest") == [(0, 0, 5), (1, 0, 0)]
        assert reset(to="earliest", dry_run=True) == [(0, 5, 0), (1, 0, 0)]
        assert [p.committed_offset for p in admin.describe_group("g").partitions] == [5, 0]
        assert reset(to=cut.replace(tzinfo=None)) == [(0, 5, 3), (1, 0, 0)]  # naive: UTC
        assert reset(to=cut.astimezone(timezone(timedelta(hours=2)))) == [(0, 3, 3), (1, 0, 0)]
        assert reset(to=cut + timedelta(days=1)) == [(0, 3, 5), (1, 0, 0)]  # after all: the end
        assert reset(to="earliest") == [(0, 5, 0), (1, 0, 0)]

        for kw in ({}, {"to": "earliest", "shift_by": 1}, {"to": -1}, {"to": "first"}, {"shift_by": 1.5}):
            with pytest.raises(errors.ConfigError):
                admin.reset_group_offsets("g", "r", **kw)
        with pytest.raises(errors.InvalidRequest, match="no committed offset"):
            admin.reset_group_offsets("other", "r", shift_by=1)
        with pytest.raises(errors.UnknownTopic):
            admin.reset_group_offsets("g", "nope", to="earliest")
        with pytest.raises(errors.UnknownPartition):
            admin.reset_group_offsets("g", "r", to="earliest", partitions=[5])
        with pytest.raises(errors.InvalidGroup):
            admin.reset_group_offsets("bad name", "r", to="earliest")


# ---------------------------------------------------------------------- restarts


def test_changes_survive_a_broker_crash(broker):
    b = broker.bootstrap
    with SyncAdmin(b) as admin:
        admin.create_topic("keep", partitions=1, config={"flush.ms": "500"})
        admin.alter_topic_config("keep", {"retention.ms": "60000", "max.message.bytes": "4096"})
        admin.alter_topic_config("keep", delete=["flush.ms"])
        admin.add_partitions("keep", total=3)
        admin.reset_group_offsets("g", "keep", to="latest")
        before = admin.describe_group("g")
    broker.kill()  # SIGKILL: whatever was acknowledged is on disk
    broker.start()
    with SyncAdmin(b) as admin:
        desc = admin.describe_topic("keep")
        assert (desc.config["retention.ms"], desc.config["max.message.bytes"]) == ("60000", "4096")
        assert desc.config["flush.ms"] == "1000"
        assert len(desc.partitions) == 3
        assert admin.describe_group("g") == before
        with SyncProducer(b, linger_ms=0) as producer:
            assert producer.send("keep", b"on p2", partition=2).result().offset == 0
            with pytest.raises(errors.MessageTooLarge):
                producer.send("keep", b"x" * 5000).result()
    text = broker.log()
    assert "Traceback" not in text
