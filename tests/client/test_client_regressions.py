"""Client regressions from review, against a real broker process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, SyncConsumer
from sluice.harness import freeze


async def create(bootstrap: str, name: str, partitions: int = 1) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(name, partitions)


@contextlib.contextmanager
def frozen(broker):
    """SIGSTOP the broker: connections stay open, nothing is answered."""
    freeze(broker.proc.pid)
    try:
        yield
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)


def test_out_of_range_commit_resets(broker):
    """B1: a committed offset past the log end is reset (earliest), not reused forever."""
    b = broker.bootstrap

    async def main():
        await create(b, "oor")
        async with Producer(b) as p:
            await (await p.send_many("oor", [b"m%d" % i for i in range(10)], partition=0))
        c = Consumer(b, group="g", enable_auto_commit=False)
        c.assign([("oor", 0)])
        await c.start()
        await c.commit({("oor", 0): 1000})
        await c.close()
        c = Consumer(b, group="g", auto_offset_reset="earliest", fetch_max_wait_ms=100)
        c.assign([("oor", 0)])
        try:
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 10 and time.monotonic() < deadline:
                got += await c.getmany(timeout_ms=200)
            assert [r.value for r in got] == [b"m%d" % i for i in range(10)]
            assert c.position(("oor", 0)) == 10
        finally:
            await c.close()

    asyncio.run(main())


def test_delivery_timeout_bounds_a_request_in_flight(broker):
    """B6: a frozen broker fails a send at delivery_timeout_ms, not request_timeout_ms."""
    b = broker.bootstrap

    async def main():
        await create(b, "dt")
        async with Producer(b, delivery_timeout_ms=1000, request_timeout_ms=20000) as p:
            await (await p.send("dt", b"warm"))
            with frozen(broker):
                t0 = time.monotonic()
                fut = await p.send("dt", b"v")
                with pytest.raises(errors.DeliveryTimeout):
                    await asyncio.wait_for(fut, 10)
                assert time.monotonic() - t0 < 3

    asyncio.run(main())


def test_cancelled_close_leaves_no_future_pending(broker):
    """B5: close() given up on while a request is in flight still fails its record."""
    b = broker.bootstrap

    async def main():
        await create(b, "cc")
        p = Producer(b, request_timeout_ms=5000)
        await p.start()
        await (await p.send("cc", b"warm"))
        with frozen(broker):
            fut = await p.send("cc", b"v")
            await asyncio.sleep(0.1)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(p.close(), 0.3)
            assert fut.done()
            with pytest.raises(errors.ClientClosed):
                fut.result()
        await p.close()

    asyncio.run(main())


def test_sync_iteration_break_then_commit(broker):
    """B2: the facade's iterator commits exactly past the last record the loop saw."""
    b = broker.bootstrap

    async def produce():
        await create(b, "si")
        async with Producer(b) as p:
            await (await p.send_many("si", [b"m%d" % i for i in range(10)], partition=0))

    asyncio.run(produce())
    c = SyncConsumer(b, group="sg", fetch_max_wait_ms=100)  # auto commit on close
    try:
        c.assign([("si", 0)])
        seen = []
        for rec in c:
            seen.append(rec.offset)
            if len(seen) == 3:
                break
        assert c.position(("si", 0)) == 3
    finally:
        c.close()
    c = SyncConsumer(b, group="sg", fetch_max_wait_ms=100)
    try:
        c.assign([("si", 0)])
        assert c.committed(("si", 0)) == 3
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 7 and time.monotonic() < deadline:
            got += c.getmany(timeout_ms=300)
        assert [r.offset for r in got] == list(range(3, 10))
    finally:
        c.close()


def test_subscribe_and_assign_refuse_a_bare_name_or_pair(broker):
    """``subscribe("payments")`` once read the topics "p", "a", "y"... (none of them, so
    silently nothing); ``assign(("t", 0))`` failed with an unpacking ValueError.  Both are
    TypeErrors naming the argument, and the list forms read the topic."""
    b = broker.bootstrap

    async def main():
        await create(b, "payments")
        async with Producer(b) as p:
            await (await p.send("payments", b"paid", partition=0))
        async with Consumer(b, fetch_max_wait_ms=100) as c:
            with pytest.raises(TypeError, match=r"subscribe\(\).*'payments'.*\['payments'\]"):
                c.subscribe("payments")
            with pytest.raises(TypeError, match=r"assign\(\).*\('payments', 0\)"):
                c.assign(("payments", 0))
            with pytest.raises(TypeError, match="assign"):
                c.assign([("payments", "0")])
            assert c.assignment() == []
            c.subscribe(["payments"])
            await c.seek_to_beginning()
            assert [r.value for r in await c.getmany(timeout_ms=5000)] == [b"paid"]
            c.assign([("payments", 0)])
            await c.seek_to_beginning()
            assert [r.value for r in await c.getmany(timeout_ms=5000)] == [b"paid"]

    asyncio.run(main())
    with SyncConsumer(b) as sc:  # the blocking twin says the same, not of the letters
        with pytest.raises(TypeError, match=r"subscribe\(\).*'payments'"):
            sc.subscribe("payments")
        with pytest.raises(TypeError, match=r"assign\(\).*\('payments', 0\)"):
            sc.assign(("payments", 0))
        sc.subscribe(t for t in ["payments"])  # any iterable, listed in the caller's thread
        sc.seek_to_beginning()
        assert [r.value for r in sc.getmany(timeout_ms=5000)] == [b"paid"]
