"""A seeded nemesis: random process, storage and metadata-store faults under a recorded
workload, then the history checker (checker.py).

Three brokers and etcd (replicated.py ``ThreeBrokers``: sessions of 1 s), a topic of three
partitions with three replicas, ``min.insync.replicas=2`` and ``flush.messages=1``; two or
three idempotent ``acks=all`` producers (``Workload``) and a consumer reading everything
from the start.  For ``--nemesis-seconds`` the nemesis picks, with a ``random.Random``
seeded by ``--nemesis-seed``, one fault of ``FAULTS`` at a time, holds it, heals it, waits
until every broker is back and every partition has a leader, and rests a little.  Then the
cluster is left to heal fully, the producers stop, every partition is read from its log
start and checked:

- nothing acknowledged is lost, none of it is stored twice, and it is at the offset its
  acknowledgement named; a failure that said "not stored" is not stored, one that said
  "maybe" is stored at most once (idempotence: no duplicates);
- per producer and partition, messages are stored in send order;
- every record the consumer read during the faults is still there, at the same offset.

A failure names the seed and the faults with their times: run it again with
``pytest tests/faults/test_nemesis.py --nemesis-seed S --nemesis-seconds N``.  Long runs:
``--nemesis-seconds 1800`` (a random seed unless given; it is printed).  The options are
registered by tests/faults/conftest.py, so name this file or directory on the command
line to use them.

Faults are entries of ``FAULTS`` (name -> coroutine of the ``Nemesis``), each healing
what it did before it returns; ``--nemesis-faults`` picks some by name.  The storage
faults go through the storage fault injector (storage/faults.py): every broker runs armed
(``SLUICE_TEST_DISK_FAULTS=armed``; without a rule file that costs nothing) and a fault
writes rules to the victim's ``disk-faults.json``, then removes them:

- ``read-only-follower``: EROFS on a follower's writes, fsyncs and rolls of one partition;
- ``frozen-follower-disk``: the same with ``hang`` (each call blocks until the rule goes,
  as on a frozen file system): the injector's model of ``fsfreeze``, not a real one, which
  needs root and a loop mount per broker (test_disk_failover.py runs the real one);
- ``leader-disk-error``: EIO on every write, fsync and roll of a partition's leader.

A storage fault is healed when its victim is back in every ISR of the topic (no restart
is needed: a broker whose disk works again catches up by itself).  The CI seed's schedule
starts with storage faults, and the CI run checks that it tried one.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable

import pytest
from checker import check_reads, read_logs
from replicated import NODES, SESSION_MS, ThreeBrokers, Workload, eventually, inject

from sluice.client import Consumer
from sluice.errors import SluiceError
from sluice.harness import freeze
from sluice.storage import faults as disk_faults

TOPIC = "nemesis"
PARTITIONS = 3
CI_SEED = 20261146  # its first faults: a leader's disk error, a read-only follower
CI_SECONDS = 25.0
RECOVERY_S = 60.0  # every broker back and every partition led, after each fault
SESSION_S = SESSION_MS / 1000


class Nemesis:
    """The faults' view of the cluster: the seeded random source, the brokers, etcd, and a
    log of what was done when (seconds since the start)."""

    def __init__(self, cluster: ThreeBrokers, rng: random.Random) -> None:
        self.cluster, self.rng = cluster, rng
        self.started = time.monotonic()
        self.log: list[str] = []

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.started:7.2f}s  {what}")

    async def hold(self, low: float, high: float) -> float:
        seconds = round(self.rng.uniform(low, high), 2)
        await asyncio.sleep(seconds)
        return seconds

    async def leader_of(self, partition: int) -> int | None:
        """The partition's leader as the metadata says now (None: unknown or none)."""
        try:
            leader, _ = await self.cluster.leader_of(TOPIC, partition)
        except (TimeoutError, SluiceError, OSError):
            return None
        return leader if leader in NODES else None

    def kill(self, node: int) -> None:
        self.cluster.brokers[node].kill()

    async def restart(self, *nodes: int) -> None:
        await asyncio.gather(*(self.cluster.start_broker(n) for n in nodes))

    def inject(self, node: int, **rules) -> None:
        """Give broker ``node``'s disk the storage fault ``rules`` (storage/faults.py; the
        brokers run armed), now; no rules: its disk works again."""
        inject(self.cluster, node, **rules)

    async def follower_of(self, partition: int) -> tuple[int | None, int]:
        """(the partition's leader or None, a broker that follows it: any other one)."""
        leader = await self.leader_of(partition)
        return leader, self.rng.choice([n for n in NODES if n != leader])

    async def disk_fault(self, node: int, rules: dict, low: float, high: float) -> str:
        """Hold the storage fault ``rules`` on ``node`` for a while, then heal it and wait
        until ``node`` is back in the ISR of every partition of the topic: a disk that works
        again needs no restart (a follower fetches again, a leader that handed over catches
        up as a follower), so a broker that stays out is a failure of the run.  Returns how
        long it was held and the partitions as they were just before the heal."""
        self.inject(node, **rules)
        try:
            held = await self.hold(low, high)
            seen = await self.states()
        finally:
            self.inject(node)
        await self.cluster.fully_replicated(TOPIC, timeout=RECOVERY_S)
        return f"for {held} s (then: {seen})"

    async def states(self) -> str:
        """Each partition's leader and ISR now, for the log."""
        try:
            parts = await self.cluster.partitions(TOPIC)
        except (TimeoutError, SluiceError, OSError) as exc:
            return f"metadata unavailable: {exc!r}"
        return ", ".join(f"p{p.partition} leader {p.leader} ISR {sorted(p.isr)}" for p in parts)

    async def recovered(self) -> None:
        """Every broker registered and every partition of the topic led by one of them."""

        async def check():
            meta = await self.cluster.metadata(TOPIC)
            live = {b.node_id for b in meta.brokers}
            [t] = [t for t in meta.topics if t.name == TOPIC]
            return live == set(NODES) and all(p.leader in live for p in t.partitions)

        await eventually(check, RECOVERY_S, "every broker back and every partition led")


async def sigkill_leader(n: Nemesis) -> str:
    partition = n.rng.randrange(PARTITIONS)
    leader = await n.leader_of(partition)
    node = leader if leader is not None else n.rng.choice(NODES)
    n.kill(node)
    down = await n.hold(0.2, 3.0)
    await n.restart(node)
    return f"SIGKILL broker {node} (leader of partition {partition}: {leader}), restarted after {down} s"


async def sigkill_any(n: Nemesis) -> str:
    node = n.rng.choice(NODES)
    n.kill(node)
    down = await n.hold(0.2, 3.0)
    await n.restart(node)
    return f"SIGKILL broker {node}, restarted after {down} s"


async def sigstop_past_session(n: Nemesis) -> str:
    partition = n.rng.randrange(PARTITIONS)
    leader = await n.leader_of(partition)
    node = leader if leader is not None and n.rng.random() < 0.5 else n.rng.choice(NODES)
    pid = n.cluster.brokers[node].proc.pid
    await asyncio.to_thread(freeze, pid, True)
    try:
        paused = await n.hold(2 * SESSION_S, 4 * SESSION_S)
    finally:
        os.killpg(pid, signal.SIGCONT)
    return f"SIGSTOP broker {node} for {paused} s (session {SESSION_S} s), then SIGCONT"


async def etcd_restart(n: Nemesis) -> str:
    n.cluster.etcd.kill()
    down = await n.hold(0.2, 2.0)
    await asyncio.to_thread(n.cluster.etcd.start)
    return f"SIGKILL etcd, restarted after {down} s"


async def kill_all(n: Nemesis) -> str:
    for node in NODES:  # at once, as a power loss would (flush.messages=1: fsynced before acks)
        n.kill(node)
    down = await n.hold(0.2, 2.0)
    await n.restart(*NODES)
    return f"SIGKILL every broker, restarted after {down} s"


def _partition_dir(partition: int) -> str:
    """What the paths of the partition's segment files contain (broker/topics.py)."""
    return f"{os.sep}{TOPIC}-{partition}{os.sep}"


async def read_only_follower(n: Nemesis) -> str:
    """A follower's copy of one partition turns read-only (EROFS on its segment writes,
    fsyncs and rolls; limited to that partition, so the broker is only a follower here):
    it reports a storage error and leaves the ISR; healed, it catches up and rejoins."""
    partition = n.rng.randrange(PARTITIONS)
    leader, node = await n.follower_of(partition)
    rules = {"write": "EROFS", "fsync": "EROFS", "roll": "EROFS", "only": _partition_dir(partition)}
    held = await n.disk_fault(node, rules, 1.0, 4.0)
    return f"EROFS on broker {node}'s copy of partition {partition} (leader {leader}) {held}, then writable"


async def frozen_follower_disk(n: Nemesis) -> str:
    """A follower's copy of one partition sits on a frozen disk.  Modelled by the storage
    fault injector's ``hang`` (its writes, fsyncs and rolls block in their threads until
    the rule is removed, as under ``fsfreeze``), not by a real fsfreeze of a loop mount:
    that needs root and a mounted image per broker, and test_disk_failover.py already
    checks the real one.  The follower reports the stall after DISK_STALL_S and leaves the
    ISR; thawed, its hung writes finish and it catches up."""
    partition = n.rng.randrange(PARTITIONS)
    leader, node = await n.follower_of(partition)
    rules = {"write": "hang", "fsync": "hang", "roll": "hang", "only": _partition_dir(partition)}
    held = await n.disk_fault(node, rules, 1.0, 4.0)
    return f"froze broker {node}'s copy of partition {partition} (leader {leader}) {held}, then thawed"


async def leader_disk_error(n: Nemesis) -> str:
    """The whole disk of a partition's leader fails (EIO on every segment write, fsync and
    roll): it hands the partitions it leads to in-sync followers (a failed fsync of a
    published group fences its epoch first) and drops out of the ISRs it follows; healed,
    it catches up as a follower."""
    partition = n.rng.randrange(PARTITIONS)
    leader = await n.leader_of(partition)
    node = leader if leader is not None else n.rng.choice(NODES)
    held = await n.disk_fault(node, {"write": "EIO", "fsync": "EIO", "roll": "EIO"}, 1.0, 3.0)
    return f"EIO on broker {node}'s disk (leader of partition {partition}: {leader}) {held}, then healed"


STORAGE_FAULTS = ("read-only-follower", "frozen-follower-disk", "leader-disk-error")

FAULTS: dict[str, Callable[[Nemesis], Awaitable[str]]] = {
    "read-only-follower": read_only_follower,
    "frozen-follower-disk": frozen_follower_disk,
    "leader-disk-error": leader_disk_error,
    "sigkill-leader": sigkill_leader,
    "sigkill-any": sigkill_any,
    "sigstop-past-session": sigstop_past_session,
    "etcd-restart": etcd_restart,
    "kill-all": kill_all,
}


class Reader:
    """A consumer reading every partition from the start for the whole run, remembering
    what it read where; started again where it was when it fails."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.reads: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self._next: dict[int, int] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> Reader:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while not self._stop.is_set():
            consumer = Consumer(self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=200,
                                request_timeout_ms=3000, metadata_max_age_ms=1000)
            try:
                consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
                await consumer.start()
                await consumer.seek_to_beginning()
                for p, offset in self._next.items():
                    consumer.seek(TOPIC, p, offset)
                while not self._stop.is_set():
                    for rec in await consumer.getmany(timeout_ms=300):
                        self.reads[(rec.partition, rec.offset)] = rec.value or b""
                        self._next[rec.partition] = rec.offset + 1
            except SluiceError as exc:
                self.errors.append(repr(exc))
                await asyncio.sleep(0.2)
            finally:
                await consumer.close()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


def _settings(config) -> tuple[int, float, list[str]]:
    seed = config.getoption("--nemesis-seed", default=None)
    seconds = config.getoption("--nemesis-seconds", default=None)
    names = config.getoption("--nemesis-faults", default=None)
    if seed is None:
        seed = CI_SEED if seconds is None else random.SystemRandom().randrange(1 << 32)
    faults = sorted(FAULTS) if not names else [f.strip() for f in names.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        pytest.fail(f"--nemesis-faults: unknown {unknown}; known: {sorted(FAULTS)}")
    return seed, CI_SECONDS if seconds is None else seconds, faults


async def test_nemesis(tmp_path, request, monkeypatch):
    seed, seconds, names = _settings(request.config)
    monkeypatch.setenv(disk_faults.ENV, disk_faults.ARMED)  # every broker: no rules, no cost
    rng = random.Random(seed)
    producers = rng.choice((2, 3))
    print(f"nemesis seed {seed}, {seconds} s, {producers} producers, faults {names}")
    cluster = ThreeBrokers(tmp_path, name="nemesis")
    workload = reader = stopping = None
    nemesis = Nemesis(cluster, rng)
    try:
        await cluster.start()
        await cluster.create_topic(TOPIC, PARTITIONS, {"flush.messages": "1"})
        workload = await Workload(
            cluster.bootstrap, TOPIC, list(range(PARTITIONS)), producers=producers, window=5,
            delivery_timeout_ms=10_000, request_timeout_ms=3000,
        ).start()
        reader = Reader(cluster.bootstrap).start()
        await workload.progress(50, 30, "before the first fault")
        nemesis.started = time.monotonic()
        while time.monotonic() - nemesis.started < seconds:
            name = rng.choice(names)
            nemesis.note(f"{name}: started")  # named even when it never heals
            nemesis.note(f"{name}: {await FAULTS[name](nemesis)}")
            await nemesis.recovered()
            nemesis.note("recovered")
            await nemesis.hold(0.5, 2.0)
        if seed == CI_SEED and set(names) == set(FAULTS):  # the CI run must try the disks too
            assert any(f" {f}: " in line for line in nemesis.log for f in STORAGE_FAULTS), \
                "the CI seed's schedule has no storage fault: pick another CI_SEED"
        await cluster.fully_replicated(TOPIC, timeout=RECOVERY_S)
        nemesis.note("fully replicated")
        await workload.progress(20, 30, "after the faults")
        stopping, workload = workload, None
        await stopping.stop()
        await reader.stop()
        logs = await read_logs(cluster.bootstrap, TOPIC)
        report = stopping.history.check(logs)
        read = check_reads(reader.reads, logs)
    except BaseException as exc:
        nemesis.note(f"producer errors {dict((workload or stopping).errors)}" if workload or stopping else "")
        raise AssertionError(
            f"nemesis seed {seed} ({seconds} s, faults {names}) failed: {exc!r}\n" + "\n".join(nemesis.log)
        ) from exc
    finally:
        for part in (workload, reader):
            if part is not None:
                try:
                    await part.stop()
                except Exception:  # noqa: BLE001 - already stopped, or failing: the cluster goes anyway
                    pass
        await cluster.close()
    print(f"{report}; {read} consumer reads checked; producer errors {dict(stopping.errors)}; "
          f"consumer restarts {len(reader.errors)}")
    print("\n".join(nemesis.log))
