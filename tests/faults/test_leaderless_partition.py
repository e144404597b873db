"""A partition with no leader holds up no other partition (QA, 3 brokers + etcd).

Topic ``r1``: 4 partitions, one replica each, 10 messages per partition.  The broker holding
``r1-1`` is killed (SIGKILL); once its session expired, its partitions have no leader.  The
consumer (``Consumer``, ``sluice consume``) reads the other partitions at once, warns
about the leaderless ones, and finds their positions when a leader is back; ``sluice
consume`` says which partitions it could not read, with exit status 1.
"""

from __future__ import annotations

import asyncio
import sys

from replicated import ThreeBrokers, eventually

from sluice.client import Admin, Consumer, Producer

TOPIC = "r1"
PARTITIONS = 4
PER_PARTITION = 10


async def _setup(cluster: ThreeBrokers) -> tuple[int, set[int], dict[int, list[bytes]]]:
    """Create and fill ``r1``, kill the broker of ``r1-1``; returns that broker, the
    partitions it led, and the values by partition."""
    await cluster.start()
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, PARTITIONS, replication_factor=1)
    parts = await eventually(
        lambda: _all_led(cluster), 20, "a leader for every partition of r1"
    )
    values = {p: [b"%d-%d" % (p, i) for i in range(PER_PARTITION)] for p in range(PARTITIONS)}
    async with Producer(cluster.bootstrap, acks="all") as producer:
        for p, vs in values.items():
            await (await producer.send_many(TOPIC, vs, partition=p))
    dead = parts[1].leader
    lost = {p.partition for p in parts if p.leader == dead}
    cluster.brokers[dead].kill()

    async def leaderless():
        now = await cluster.partitions(TOPIC, cluster.bootstrap_without(dead))
        return all(now[p].leader < 0 for p in lost)

    await eventually(leaderless, 20, "r1-1 without a leader")
    return dead, lost, values


async def _all_led(cluster: ThreeBrokers):
    parts = await cluster.partitions(TOPIC)
    return parts if all(p.leader > 0 for p in parts) else None


async def _cli(bootstrap: str, *args: str) -> tuple[int, list[bytes], str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluice.cli.main", "--bootstrap", bootstrap, "consume", TOPIC, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, out.splitlines(), err.decode()


def _expected(values: dict[int, list[bytes]], lost: set[int]) -> list[bytes]:
    return sorted(v for p, vs in values.items() if p not in lost for v in vs)


async def test_cli_prints_the_partitions_that_have_a_leader(tmp_path):
    cluster = ThreeBrokers(tmp_path)
    try:
        dead, lost, values = await _setup(cluster)
        bootstrap = cluster.bootstrap_without(dead)
        names = [f"r1-{p}" for p in sorted(lost)]

        # -e: the others up to their ends; the leaderless ones waited for (--timeout-ms), named
        code, lines, err = await _cli(bootstrap, "--from", "earliest", "-e", "--timeout-ms", "1500")
        assert sorted(lines) == _expected(values, lost), err
        assert code == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: NOT_LEADER (19): ") and all(n in last for n in names), err
        warned = [line for line in err.splitlines() if "no position yet" in line]
        assert len(warned) == 1 and all(n in warned[0] for n in names), err  # once, by name

        # no -e: stopping on --timeout-ms does not claim success either
        code, lines, err = await _cli(bootstrap, "--from", "earliest", "--timeout-ms", "1500")
        assert (sorted(lines), code) == (_expected(values, lost), 1), err
        assert "r1-1" in err.strip().splitlines()[-1], err

        # --group: the starting positions of the readable partitions are committed at once
        code, lines, err = await _cli(bootstrap, "--group", "gr1", "--timeout-ms", "1500")
        assert (sorted(lines), code) == (_expected(values, lost), 1), err
        async with Consumer(bootstrap, group="gr1") as c:
            committed = {p: await c.committed((TOPIC, p)) for p in range(PARTITIONS)}
        assert committed == {p: None if p in lost else PER_PARTITION for p in range(PARTITIONS)}

        # the leader comes back while -e waits for it: everything, status 0
        task = asyncio.ensure_future(_cli(bootstrap, "--from", "earliest", "-e"))
        await asyncio.sleep(1)
        assert not task.done()
        await cluster.start_broker(dead)
        code, lines, err = await task
        assert (sorted(lines), code) == (_expected(values, set()), 0), err
    finally:
        await cluster.close()


async def test_consumer_reads_the_others_and_positions_the_leaderless_partition_later(tmp_path, caplog):
    cluster = ThreeBrokers(tmp_path)
    try:
        dead, lost, values = await _setup(cluster)
        bootstrap = cluster.bootstrap_without(dead)
        tps = [(TOPIC, p) for p in range(PARTITIONS)]
        for seek in (True, False):  # seek_to_beginning, or auto_offset_reset="earliest"
            c = Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100, retry_timeout_ms=60000)
            try:
                c.assign(tps)
                if seek:
                    await asyncio.wait_for(c.seek_to_beginning(), 5)  # no waiting for r1-1
                got = []
                while len(got) < len(_expected(values, lost)):
                    batch = await asyncio.wait_for(c.getmany(timeout_ms=3000), 10)
                    assert batch, f"stalled with {got}"
                    got += [r.value for r in batch]
                assert sorted(got) == _expected(values, lost)
                assert all(c.position((TOPIC, p)) is None for p in lost)
            finally:
                await c.close()
        warned = [r.getMessage() for r in caplog.records if "no position yet" in r.getMessage()]
        assert any("r1-1" in m for m in warned), warned

        # the leader comes back: the positions are found (earliest) and the rest is read
        c = Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        try:
            c.assign(tps)
            await c.seek_to_beginning()
            got = [r.value for r in await c.getmany(timeout_ms=1000)]
            await cluster.start_broker(dead)
            while len(got) < PARTITIONS * PER_PARTITION:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=20000), 30)
                assert batch, f"stalled with {got}"
                got += [r.value for r in batch]
            assert sorted(got) == _expected(values, set())
        finally:
            await c.close()
    finally:
        await cluster.close()
