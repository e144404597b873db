"""Disk full: a data directory on a small tmpfs.

Producing until the disk is full gives producers a clear DISK_FULL error, nothing that was
acknowledged is lost, and producing resumes once space is freed, without a broker restart.
Needs root to mount a tmpfs (CI runs as root); elsewhere the test is skipped, saying why.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from sluice.client import Admin, Consumer, Producer
from sluice.errors import DeliveryTimeout, DiskFull, SluiceError


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, DiskFull) or (
        isinstance(exc, DeliveryTimeout) and "DISK_FULL" in str(exc)
    )


async def _fill(bootstrap: str, topic: str, acked: list[bytes], failed: dict) -> BaseException:
    """Produce 4 KiB messages until one fails; returns that failure.  Every failed send is
    kept in ``failed`` with its error (whose ``maybe_stored`` says what became of it)."""
    producer = Producer(bootstrap, linger_ms=2, delivery_timeout_ms=2000, retry_backoff_ms=50)
    await producer.start()
    try:
        i = 0
        while True:
            futs = []
            for _ in range(64):
                value = f"{i:08d}".encode() + os.urandom(4088)
                i += 1
                futs.append((value, await producer.send(topic, value, partition=0)))
            results = await asyncio.gather(*(f for _, f in futs), return_exceptions=True)
            # a later, smaller batch may still fit after an earlier one failed: keep every ack
            for (value, _), r in zip(futs, results, strict=True):
                if isinstance(r, BaseException):
                    failed[value] = r
                else:
                    acked.append(value)
            if failed:
                return next(iter(failed.values()))
            if i > 10_000:
                raise AssertionError("the 6 MiB disk never filled")
    finally:
        await producer.close()


async def _scenario(broker, disk) -> None:
    admin = Admin(broker.bootstrap)
    await admin.create_topic("full", partitions=1, config={"segment.bytes": "1048576"})
    await admin.close()
    ballast = disk / "ballast"
    ballast.write_bytes(b"\0" * (1536 * 1024))

    acked: list[bytes] = []
    failed: dict[bytes, SluiceError] = {}
    failure = await _fill(broker.bootstrap, "full", acked, failed)
    assert _is_disk_full(failure), f"expected a disk-full error, got {failure!r}"
    assert "no space left" in str(failure).lower() or "DISK_FULL" in str(failure)
    assert len(acked) > 100

    # fill what is left one message at a time; then every send fails the same clear way
    producer = Producer(broker.bootstrap, delivery_timeout_ms=1000, retry_backoff_ms=50)
    await producer.start()
    for i in range(2000):
        value = f"tail-{i:05d}".encode() + os.urandom(4086)
        try:
            await (await producer.send("full", value, partition=0))
        except SluiceError as exc:
            assert _is_disk_full(exc), exc
            failed[value] = exc
            break
        acked.append(value)
    else:
        raise AssertionError("the disk never filled up again")
    value = b"x" * 4096
    fut = await producer.send("full", value, partition=0)
    with pytest.raises(SluiceError) as info:
        await fut
    assert _is_disk_full(info.value)
    failed[value] = info.value

    ballast.unlink()  # free space: producing resumes without a restart
    resumed = []
    for i in range(50):
        value = f"after-{i}".encode()
        await (await producer.send("full", value, partition=0))
        resumed.append(value)
    await producer.close()

    consumer = Consumer(broker.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    consumer.assign([("full", 0)])
    await consumer.start()
    await consumer.seek_to_beginning()
    async with Admin(broker.bootstrap) as admin:
        end = (await admin.describe_topic("full")).partitions[0].high_watermark
    got: list[bytes] = []
    while consumer.position(("full", 0)) < end:
        batch = await consumer.getmany(timeout_ms=3000)
        assert batch, f"stalled at offset {consumer.position(('full', 0))} of {end}"
        got += [r.value for r in batch]
    await consumer.close()

    # A failed send whose attempt may have been written (a retry unanswered when its
    # deadline passed) may be in the log, once; one that says "not stored" must not be.
    for value, exc in failed.items():
        assert exc.maybe_stored in (True, False), exc
        assert got.count(value) <= (1 if exc.maybe_stored else 0), exc
    assert [v for v in got if v not in failed] == acked + resumed, (
        "every acknowledged message, once, in order"
    )


def test_disk_full_then_space_freed(broker_factory, small_disk):
    broker = broker_factory(data_dir=small_disk / "data").start()
    asyncio.run(_scenario(broker, small_disk))
    assert broker.alive
