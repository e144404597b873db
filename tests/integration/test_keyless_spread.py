"""Keyless records spread evenly over a topic's partitions, through every client writer
(a real broker): 30,000 records without key or partition into 3 partitions leave each
partition between 25 % and 42 % of them — the ``Producer`` sending one record per call,
``SyncProducer`` from a plain loop, ``sluice produce`` with piped input.

The Spark sink's writers are in tests/spark/test_sink_keyless_spread.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sluice.client import Producer
from sluice.client.sync import SyncAdmin, SyncProducer

pytestmark = pytest.mark.timeout(120)

RECORDS = 30_000
VALUE = b"v" * 100  # about 13 batches of the default 256 KiB per writer


def shares(bootstrap: str, topic: str) -> list[float]:
    """Each partition's share of the topic's records (all of them stored: RECORDS)."""
    with SyncAdmin(bootstrap) as admin:
        ends = admin.list_offsets(topic)
    assert sum(ends.values()) == RECORDS, ends
    return [ends[p] / RECORDS for p in sorted(ends)]


def assert_even(got: list[float]) -> None:
    assert len(got) == 3 and all(0.25 <= s <= 0.42 for s in got), got


def create(bootstrap: str, topic: str) -> None:
    with SyncAdmin(bootstrap) as admin:
        admin.create_topic(topic, 3)


async def test_producer_send_spreads_keyless_records(broker):
    create(broker.bootstrap, "spread-async")
    async with Producer(broker.bootstrap) as producer:
        futures = [await producer.send("spread-async", VALUE) for _ in range(RECORDS)]
        await producer.flush()
    assert {f.result().partition for f in futures} == {0, 1, 2}
    assert_even(shares(broker.bootstrap, "spread-async"))


async def test_producer_with_a_long_linger_and_sends_by_the_hundred_spreads_them(broker):
    """Batches closed by a flush, never full: the next keyless batch still moves on."""
    create(broker.bootstrap, "spread-flushed")
    async with Producer(broker.bootstrap, linger_ms=60_000) as producer:
        for _ in range(RECORDS // 100):
            for _ in range(100):
                await producer.send("spread-flushed", b"small")
            await producer.flush()
    assert [round(s, 2) for s in shares(broker.bootstrap, "spread-flushed")] == [0.33, 0.33, 0.33]


def test_sync_producer_spreads_keyless_records(broker):
    create(broker.bootstrap, "spread-sync")
    with SyncProducer(broker.bootstrap) as producer:
        for _ in range(RECORDS):
            producer.send("spread-sync", VALUE)
        producer.flush()
    assert_even(shares(broker.bootstrap, "spread-sync"))


@pytest.mark.parametrize("value", [VALUE, b""], ids=["100-byte lines", "seq-like lines"])
def test_sluice_produce_spreads_keyless_lines(broker, value):
    """Long lines fill batches; short ones (``seq 1 30000``: 170 KB in all, less than one
    batch) spread too, a bulk send of at most ``KEYLESS_COUNT`` lines at a time."""
    create(broker.bootstrap, "spread-cli")
    lines = b"".join(b"%d" % i + value + b"\n" for i in range(1, RECORDS + 1))
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", broker.bootstrap, "produce", "spread-cli"],
        input=lines, capture_output=True, timeout=90,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert_even(shares(broker.bootstrap, "spread-cli"))
