"""The benchmark workloads of ``docs/benchmarks.md``, run against one broker.

Each workload function takes the broker address and returns a result row in the shape of
``peers-results.jsonl``.  Rules kept from the spec: one producer connection, at most 1000
records unacknowledged, payloads ``os.urandom`` generated before the clock starts, topic
deleted and re-created before each workload, ``time.perf_counter`` around the measured part
only, nearest-rank percentiles.  P1 / C1 / L1 ack from the page cache (``flush.messages=0``,
background fsync every second); P2 and L1-fsync fsync before every ack (``flush.messages=1``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from sluice.client import Admin, Consumer, Producer
from sluice.client.sync import SyncProducer
from sluice.errors import UnknownTopic

TOPIC = "bench"
WINDOW = 1000  # records unacknowledged at most
CHUNK = 250  # records per send_many call: four chunks in flight fill the window
PAGE_CACHE = {"flush.messages": "0", "flush.ms": "1000"}
FSYNC_ALWAYS = {"flush.messages": "1"}


@dataclass
class Row:
    workload: str
    msgs: int = 0
    bytes: int = 0
    seconds: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    max_ms: float | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self, version: str) -> dict:
        s = self.seconds
        return {
            "system": "sluice",
            "version": version,
            "workload": self.workload,
            "msgs": self.msgs,
            "bytes": self.bytes,
            "seconds": round(s, 3),
            "msgs_per_s": round(self.msgs / s, 1) if s else 0.0,
            "mb_per_s": round(self.bytes / s / 1e6, 2) if s else 0.0,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "p999_ms": self.p999_ms,
            "max_ms": self.max_ms,
            "notes": "; ".join(self.notes),
        }


def durability(config: dict[str, str]) -> str:
    """The flush policy of a workload's topic, for its notes."""
    if config is FSYNC_ALWAYS:
        return "fsync before ack (flush.messages=1)"
    return "page-cache ack (flush.messages=0, flush.ms=1000)"


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


async def reset_topic(bootstrap: str, config: dict[str, str], partitions: int = 1) -> None:
    admin = Admin(bootstrap)
    try:
        try:
            await admin.delete_topic(TOPIC)
        except UnknownTopic:
            pass
        await admin.create_topic(TOPIC, partitions=partitions, config=config)
    finally:
        await admin.close()


async def stored_messages(bootstrap: str) -> int:
    """Messages in the bench topic per the broker (its high watermark)."""
    admin = Admin(bootstrap)
    try:
        desc = await admin.describe_topic(TOPIC)
    finally:
        await admin.close()
    return sum(p.high_watermark - p.log_start_offset for p in desc.partitions)


async def send_bulk(producer: Producer, part: list[bytes]) -> asyncio.Future:
    """One ``send_many`` call for the chunk: the P1 / P2 client."""
    return await producer.send_many(TOPIC, part, partition=0)


async def send_each(producer: Producer, part: list[bytes]) -> asyncio.Future:
    """One ``send`` per record of the chunk, then their futures awaited in turn (by one
    task per chunk): the P1-send client.  In turn, not with ``asyncio.gather``, which puts
    a callback on each future and costs more than the send itself."""
    send = producer.send
    futures = [await send(TOPIC, v, partition=0) for v in part]

    async def each() -> None:
        for f in futures:
            await f

    return asyncio.ensure_future(each())


async def publish(producer: Producer, payloads: list[bytes], deadline: float, send_chunk=send_bulk) -> tuple[int, bool]:
    """Send ``payloads`` CHUNK records at a time with ``send_chunk`` (which returns one
    future for the chunk), at most WINDOW unacknowledged; (acknowledged, stopped early)."""
    slots = asyncio.Semaphore(WINDOW // CHUNK)
    acked = 0
    failure: list[BaseException] = []

    def done(fut: asyncio.Future, n: int) -> None:
        nonlocal acked
        slots.release()
        if fut.exception() is not None:
            failure.append(fut.exception())
        else:
            acked += n

    stopped = False
    for i in range(0, len(payloads), CHUNK):
        await slots.acquire()
        if failure:
            raise failure[0]
        if time.perf_counter() > deadline:
            stopped = True
            break
        part = payloads[i : i + CHUNK]
        fut = await send_chunk(producer, part)
        n = len(part)
        fut.add_done_callback(lambda f, n=n: done(f, n))
    await producer.flush()
    for _ in range(WINDOW // CHUNK):
        await slots.acquire()
    if failure:
        raise failure[0]
    return acked, stopped


def publish_sync(producer: SyncProducer, payloads: list[bytes], deadline: float) -> tuple[int, bool]:
    """``SyncProducer.send`` per record from a plain loop, then ``flush``; at most WINDOW
    records unacknowledged (before each CHUNK of sends, the last record of the CHUNK sent
    WINDOW records earlier must be acknowledged).  Blocking: run it in a thread."""
    pending: deque[concurrent.futures.Future] = deque()
    send = producer.send
    sent = 0
    stopped = False
    for i in range(0, len(payloads), CHUNK):
        if len(pending) >= WINDOW // CHUNK:
            pending.popleft().result()
        if time.perf_counter() > deadline:
            stopped = True
            break
        for v in payloads[i : i + CHUNK]:
            fut = send(TOPIC, v, partition=0)
        pending.append(fut)
        sent = min(i + CHUNK, len(payloads))
    producer.flush()
    for fut in pending:
        fut.result()  # records of one partition are acknowledged in order
    return sent, stopped


# client -> (how the workload sends, for the notes)
CLIENTS = {
    "send_many": f"Producer.send_many, {CHUNK} records per call",
    "send": f"Producer.send per record, the futures of {CHUNK} sends awaited in turn",
    "sync": "SyncProducer.send per record from a plain loop, then flush",
}

_SETTINGS = {"acks": "leader", "linger_ms": 0, "batch_size": 1 << 20}


def _producer(bootstrap: str, **kw) -> Producer:
    return Producer(bootstrap, **_SETTINGS, **kw)


async def _timed_async(bootstrap, payloads, config, meter, client, producer_kw) -> tuple:
    producer = _producer(bootstrap, **producer_kw)
    await producer.start()
    try:
        await producer.send_many(TOPIC, payloads[:1], partition=0)  # warm metadata + connection
        await producer.flush()
        await reset_topic(bootstrap, config)  # same partitions: the producer's metadata holds
        meter.start()
        t0 = time.perf_counter()
        acked, stopped = await publish(producer, payloads, t0 + 60, send_each if client == "send" else send_bulk)
        return acked, stopped, time.perf_counter() - t0, meter.stop()
    finally:
        await producer.close()


def _timed_sync(bootstrap, payloads, config, meter, producer_kw) -> tuple:
    with SyncProducer(bootstrap, **_SETTINGS, **producer_kw) as producer:
        producer.send_many(TOPIC, payloads[:1], partition=0)  # warm metadata + connection
        producer.flush()
        asyncio.run(reset_topic(bootstrap, config))
        meter.start()
        t0 = time.perf_counter()
        acked, stopped = publish_sync(producer, payloads, t0 + 60)
        return acked, stopped, time.perf_counter() - t0, meter.stop()


async def run_publish(
    bootstrap: str, name: str, size: int, count: int, config: dict, meter, client: str = "send_many",
    **producer_kw,
) -> Row:
    """A publish workload (P1, P2): ``count`` records of ``size`` bytes to one partition,
    sent by ``client`` (a key of ``CLIENTS``); checks that every record was stored."""
    await reset_topic(bootstrap, config)
    payloads = [os.urandom(size) for _ in range(count)]
    if client == "sync":
        timed = asyncio.to_thread(_timed_sync, bootstrap, payloads, config, meter, producer_kw)
    else:
        timed = _timed_async(bootstrap, payloads, config, meter, client, producer_kw)
    acked, stopped, seconds, cpu = await timed
    stored = await stored_messages(bootstrap)
    if not stopped and (acked != count or stored != count):
        raise RuntimeError(f"{acked} acked and {stored} stored of {count} sent")
    row = Row(name, acked, acked * size, seconds)
    idempotent = "idempotent" if producer_kw.get("enable_idempotence", True) else "not idempotent"
    row.notes += [durability(config), f"client: {CLIENTS[client]} ({idempotent}), ≤{WINDOW} unacked", cpu]
    if stopped:
        row.notes.append("STOPPED at the 60s cap")
    return row


async def fill_backlog(bootstrap: str, count: int, size: int) -> float:
    """A new ``bench`` topic (page-cache flush policy) holding ``count`` random messages of
    ``size`` bytes, published by the P1 publisher; the seconds it took."""
    await reset_topic(bootstrap, PAGE_CACHE)
    payloads = [os.urandom(size) for _ in range(count)]
    producer = _producer(bootstrap)
    await producer.start()
    try:
        t0 = time.perf_counter()
        await publish(producer, payloads, t0 + 120)
        return time.perf_counter() - t0
    finally:
        await producer.close()


async def run_c1(bootstrap: str, meter, count: int = 200_000, size: int = 1024) -> Row:
    fill = await fill_backlog(bootstrap, count, size)
    consumer = Consumer(bootstrap, group="bench-c1", auto_offset_reset="earliest", enable_auto_commit=False)
    received = nbytes = 0
    try:
        consumer.assign([(TOPIC, 0)])
        await consumer.start()
        await consumer.seek_to_beginning()
        meter.start()
        t0 = time.perf_counter()
        commits = []
        while received < count:
            records = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            if not records:
                raise RuntimeError(f"C1 stalled after {received} messages")
            before = received
            for rec in records:
                nbytes += len(rec.value)
            received += len(records)
            if received // 100 > before // 100:  # a cumulative ack passed a 100th message
                commits.append(asyncio.ensure_future(consumer.commit()))
        await consumer.commit()  # the final message is acked before the clock stops
        seconds = time.perf_counter() - t0
        cpu = meter.stop()
        await asyncio.gather(*commits)
    finally:
        await consumer.close()
    if received != count or nbytes != count * size:
        raise RuntimeError(f"C1 received {received} messages / {nbytes} bytes")
    row = Row("C1", received, nbytes, seconds)
    row.notes += [
        f"fill {fill:.2f}s", "page-cache ack",
        "client: Consumer.getmany (fetch long-poll, prefetch), group commit every 100th message (coalesced)",
        cpu,
    ]
    return row


async def run_l1(
    bootstrap: str, meter, rate: int = 5000, seconds: float = 20.0, size: int = 1024,
    name: str = "L1", config: dict[str, str] = PAGE_CACHE,
) -> Row:
    """L1 (page-cache acks) or, with ``config=FSYNC_ALWAYS``, L1-fsync: the same paced
    end-to-end latency with an fsync before every acknowledgement."""
    await reset_topic(bootstrap, config)
    total = int(rate * seconds)
    tails = [os.urandom(size - 8) for _ in range(total)]
    producer = _producer(bootstrap)
    await producer.start()
    consumer = None
    try:
        await (await producer.send_many(TOPIC, [b"warm-up"], partition=0))  # connect before the clock
        consumer = subprocess.Popen(
            [sys.executable, "-m", "sluice.bench.l1_consumer", bootstrap, TOPIC, str(total)],
            stdout=subprocess.PIPE, text=True,
        )
        ready = consumer.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"L1 consumer did not start: {ready!r}")
        meter.start()
        t0 = time.perf_counter()
        i = worst_backlog = tick = 0
        while i < total:
            # a 1 ms tick: publish every message due by now (schedule i / rate), await the acks
            due = min(total, int((time.perf_counter() - t0) * rate) + 1)
            worst_backlog = max(worst_backlog, due - i)
            if due > i:
                batch = [time.monotonic_ns().to_bytes(8, "big") + tails[j] for j in range(i, due)]
                await (await producer.send_many(TOPIC, batch, partition=0))
                i = due
            tick = max(tick + 1, int((time.perf_counter() - t0) * 1000))
            await asyncio.sleep(max(0.0, t0 + (tick + 1) / 1000 - time.perf_counter()))
        elapsed = time.perf_counter() - t0
        cpu = meter.stop()
        out, _ = consumer.communicate(timeout=60)
    finally:
        await producer.close()
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    result = json.loads(out.strip().splitlines()[-1])
    lat = sorted(result["latencies_ms"])
    row = Row(name, len(lat), len(lat) * size, elapsed)
    if lat:
        row.p50_ms, row.p99_ms = round(percentile(lat, 50), 3), round(percentile(lat, 99), 3)
        row.p999_ms, row.max_ms = round(percentile(lat, 99.9), 3), round(lat[-1], 3)
    row.notes += [
        f"target {rate} msg/s; achieved {total / elapsed:.0f} msg/s; worst backlog {worst_backlog} msgs",
        f"{durability(config)}; producer linger_ms=0, 1 ms tick; consumer: separate process, fetch long-poll",
        cpu,
    ]
    if len(lat) != total:
        row.notes.append(f"FAILED: consumer received {len(lat)} of {total}")
    return row
