"""Partitions on fresh logs for the broker unit tests (no server, no sockets), and a whole
single-node ``Broker`` in this process (embedded metadata, no listener)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.broker.broker import Broker
from sluice.broker.partition import Partition
from sluice.config import ServerConfig, TopicConfig
from sluice.storage.log import PartitionLog


@pytest.fixture
async def open_partition(tmp_path):
    """open_partition(name="p", leader=True, tail_cache_bytes=1 MiB, **topic_config) -> a
    Partition on a fresh log
    in its own directory; every one is closed at the end of the test."""
    write_ex = ThreadPoolExecutor(1, thread_name_prefix="test-write")
    read_ex = ThreadPoolExecutor(2, thread_name_prefix="test-read")
    opened: list[Partition] = []

    def open_(
        name: str = "p", leader: bool = True, tail_cache_bytes: int = 1 << 20, **raw: str
    ) -> Partition:
        config = TopicConfig.parse(raw)
        plog = PartitionLog.open(tmp_path / name, config.log_config)
        part = Partition(
            "t", 0, plog, config, write_ex, read_ex,
            leader=leader, tail_cache_bytes=tail_cache_bytes,
        )
        opened.append(part)
        return part

    yield open_
    for part in opened:
        if not part.closing:
            await part.close()
    write_ex.shutdown(wait=True)
    read_ex.shutdown(wait=True)


@pytest.fixture
async def broker(tmp_path):
    b = Broker(ServerConfig(data_dir=tmp_path / "data", port=0))
    await b.start()
    try:
        yield b
    finally:
        await b.close()
