"""Transactional messages across SIGKILLs: of the producer between its half message and its
end, and of the broker between half message and commit (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

from sluice.client.transaction import LocalTransactionState as S
from sluice.client.transaction import TransactionProducer
from txn_helpers import FAST_CHECKS, list_open, make_topic, read_all

# A producer process that stores a half message, reports its id, then hangs inside its
# local transaction until it is killed.
HANGING_PRODUCER = textwrap.dedent("""
    import asyncio, sys, time
    from sluice.client.transaction import TransactionProducer

    async def main(bootstrap):
        p = TransactionProducer(bootstrap, group="payments")
        await p.start()
        def local(msg):
            print(msg.txn_id, flush=True)
            time.sleep(3600)  # the local transaction never finishes: SIGKILL comes first
        await p.send_in_transaction("orders", b"charge-42", local, key=b"42")

    asyncio.run(main(sys.argv[1]))
""")


async def test_producer_killed_after_half_resolved_by_a_new_instance(broker_factory):
    b = broker_factory(extra_args=FAST_CHECKS).start()
    await make_topic(b.bootstrap)
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING_PRODUCER, b.bootstrap],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        txn_id = line.decode().strip()
        assert txn_id.startswith("orders/0/"), (line, proc.stderr.read() if proc.poll() is not None else "")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert [t.offset for t in await list_open(b.bootstrap)] == [int(txn_id.rsplit("/", 1)[1])]
    assert await read_all(b.bootstrap, "orders", wait=0.5) == []  # the half is invisible

    asked = []

    def check(msg):
        asked.append(msg.txn_id)
        return S.COMMIT  # the application's record says the charge went through

    async with TransactionProducer(b.bootstrap, group="payments", check_local_transaction=check):
        deadline = time.monotonic() + 20
        while await list_open(b.bootstrap) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    assert asked and set(asked) == {txn_id}
    recs = await read_all(b.bootstrap, "orders")
    assert [(r.key, r.value) for r in recs] == [(b"42", b"charge-42")]  # exactly one copy


async def test_broker_killed_between_half_and_commit(broker_factory):
    """Half messages stored, broker SIGKILLed before they are ended: after the restart a
    retried commit makes its message visible once, a commit repeated after another crash
    adds no copy, and a half left UNKNOWN is settled by check-back (rolled back here)."""
    b = broker_factory(extra_args=FAST_CHECKS).start()
    await make_topic(b.bootstrap)
    p = TransactionProducer(b.bootstrap, group="stock", retry_timeout_ms=60_000, request_timeout_ms=5000)
    await p.start()
    try:
        to_commit = await p.send_half("orders", b"reserve-1")
        undecided = await p.send_half("orders", b"reserve-2")
        b.kill()
        ending = asyncio.ensure_future(p.end_transaction(to_commit.txn_id, commit=True))
        await asyncio.sleep(1.0)
        assert not ending.done()  # retrying while the broker is down
        b.start()
        first = await asyncio.wait_for(ending, 60)
        assert first.state == "committed" and not first.already

        b.kill()  # the commit is in the log: repeating it after a crash is answered, not copied
        b.start()
        again = await p.end_transaction(to_commit.txn_id, commit=True)
        assert (again.state, again.offset, again.already) == ("committed", first.offset, True)
    finally:
        await p.close()

    async with TransactionProducer(
        b.bootstrap, group="stock", check_local_transaction=lambda msg: S.ROLLBACK
    ):
        deadline = time.monotonic() + 20
        while await list_open(b.bootstrap) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    assert await list_open(b.bootstrap) == []
    recs = await read_all(b.bootstrap, "orders")
    assert [r.value for r in recs] == [b"reserve-1"]
    assert undecided.offset < first.offset
