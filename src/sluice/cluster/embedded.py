"""Embedded metadata store: one broker, its data directory.

The default when no etcd is configured: ``sluice serve`` just works.  One node holds every
replica: each partition has the replica list ``[node_id]``, which leads it and is its ISR;
what is kept per partition is its leader epoch and version.  Files::

    <data>/meta/topics.json         topics and their partitions' leader epochs and versions
    <data>/meta/producer_ids.json   the next producer id not yet allocated

``topics.json``::

    {"topics": {"orders": {"partitions": 2, "config": {"retention.ms": "1000"},
                           "internal": false,
                           "states": [{"leader_epoch": 0, "version": 3}, ...]}},
     "revision": 3}

``states`` and ``revision`` came after the first format: a file without them loads with
epoch 0 and version 0 for every partition, and older brokers ignore them.  ``revision``
counts writes; a write's revision becomes the version of every state it writes (so a
version is never given twice to a partition, even across a re-created topic).

Every change is written atomically (tmp + fsync + rename, ``storage/checkpoint.py``) by one
worker thread, in order, before it becomes visible: a crash leaves the old or the new
metadata, and a caller cancelled while its change is being written leaves the store
consistent (the change completes or fails as a whole).  Reads and watches see the state
of the last completed change; they run on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from sluice.cluster.store import (
    EMBEDDED_CLUSTER_ID,
    BrokerRegistration,
    Leadership,
    MetadataStore,
    PartitionChange,
    PartitionState,
    TopicRecord,
    check_block_size,
    check_new_topic,
    check_topic_update,
    producer_id_block,
    reassigned_record,
    reassigned_state,
    unknown_topic,
)
from sluice.errors import (
    ClusterIdMismatch,
    ConfigError,
    InvalidRequest,
    NodeIdInUse,
    StorageError,
    TopicAlreadyExists,
    storage_error_from_os,
    unknown_partition,
)
from sluice.storage.checkpoint import write_json
from sluice.storage.identity import holds_partitions

log = logging.getLogger("sluice.cluster")


@dataclass(frozen=True)
class _Snapshot:
    """Everything the store holds, replaced whole by each change."""

    topics: dict[str, TopicRecord]
    states: dict[str, list[PartitionState]]
    revision: int
    next_producer_id: int


class EmbeddedStore(MetadataStore):
    """``MetadataStore`` for a single broker (module docstring)."""

    def __init__(self, data_dir: Path, node_id: int = 0) -> None:
        self.node_id = node_id
        self.path = Path(data_dir) / "meta" / "topics.json"
        self.producer_ids_path = self.path.with_name("producer_ids.json")
        self._written: _Snapshot | None = None  # the worker thread's: on disk
        self._snapshot: _Snapshot | None = None  # the event loop's: visible
        self._io = ThreadPoolExecutor(1, thread_name_prefix="sluice-metadata")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._registration: BrokerRegistration | None = None
        self._leadership: Leadership | None = None
        self._partition_watchers: set[asyncio.Queue] = set()
        self._broker_watchers: set[asyncio.Queue] = set()
        self._found = True

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._found = self.path.exists()  # False: no single-node broker ever ran here
        self._written = self._snapshot = await self._loop.run_in_executor(self._io, self._load)

    async def claim_cluster_id(self, known: str | None) -> str:
        """Always ``EMBEDDED_CLUSTER_ID``: the store is in the data directory it serves.  A
        directory that recorded an etcd cluster's id is refused (``ClusterIdMismatch``):
        this store would not list its topics, and the broker would drop their replicas."""
        if known is None and not self._found and holds_partitions(self.path.parent.parent):
            raise ClusterIdMismatch(  # replicas, but never a single-node broker's metadata
                f"this data directory holds replicas but no single-node metadata ({self.path}): it is a cluster "
                "member's, recorded before cluster ids; start it with the cluster's --cluster etcd://... "
                "(nothing was changed)"
            )
        if known not in (None, EMBEDDED_CLUSTER_ID):
            raise ClusterIdMismatch(
                f"this data directory holds node {self.node_id}'s replicas of etcd cluster {known}, but the "
                "broker was started without --cluster: start it with the cluster's --cluster etcd://... "
                "(nothing was changed)"
            )
        return EMBEDDED_CLUSTER_ID

    async def close(self) -> None:
        await self.resign()
        self._registration = None
        for q in (*self._partition_watchers, *self._broker_watchers):
            q.put_nowait(None)
        self._io.shutdown(wait=True)

    # ------------------------------------------------------------------ files

    @staticmethod
    def _unreadable(path: Path, exc: Exception) -> StorageError:
        """Unlike other state files these are not set aside: starting without them would make
        every topic vanish while its data stays on disk, or hand out producer ids again.
        The operator restores the file and starts again; the message says what starting
        without it costs."""
        logs = path.parent.parent / "logs"
        lost = (
            "every topic (their data in {logs} is no longer served, and is set aside when a topic "
            "of the same name is created) and every group's committed offsets"
            if path.name == "topics.json" else "the producer ids handed out (they would be given again)"
        ).format(logs=logs)
        return StorageError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); restore it from a backup and start "
            f"again. Starting without it (moved away) forgets {lost}"
        )

    def _read(self, path: Path, parse: Callable, default):
        """``parse(JSON content of path)``, ``default`` if absent; ``StorageError`` if unreadable."""
        try:
            return parse(json.loads(path.read_bytes()))
        except FileNotFoundError:
            return default
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._unreadable(path, exc) from exc

    def _load(self) -> _Snapshot:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        topics, states, revision = self._read(self.path, self._parse_topics, ({}, {}, 0))
        next_id = self._read(self.producer_ids_path, lambda raw: int(raw["next"]), 0)
        return _Snapshot(topics, states, revision, next_id)

    def _parse_topics(self, raw) -> tuple[dict, dict, int]:
        topics, states = {}, {}
        node = self.node_id
        for name, t in raw["topics"].items():
            n = int(t["partitions"])
            topics[name] = TopicRecord(
                name=name, partitions=n,
                config={str(k): str(v) for k, v in t.get("config", {}).items()},
                internal=bool(t.get("internal", False)),
                assignment=[[node] for _ in range(n)],
            )
            kept = t.get("states", [])[:n]
            states[name] = [
                PartitionState(node, int(s["leader_epoch"]), [node], int(s["version"])) for s in kept
            ] + [PartitionState(node, 0, [node]) for _ in range(n - len(kept))]
        return topics, states, int(raw.get("revision", 0))

    def _save(self, snap: _Snapshot) -> None:
        write_json(
            self.path,
            {
                "topics": {
                    t.name: {
                        "partitions": t.partitions, "config": t.config, "internal": t.internal,
                        "states": [
                            {"leader_epoch": s.leader_epoch, "version": s.version}
                            for s in snap.states[t.name]
                        ],
                    }
                    for t in snap.topics.values()
                },
                "revision": snap.revision,
            },
        )

    # ------------------------------------------------------------------ changes

    async def _change(self, change: Callable[[_Snapshot], tuple[_Snapshot, list, object]]):
        """Run ``change(written) -> (new, partition changes, result)`` in the worker thread,
        write what it changed, then make it visible on the loop; returns ``result``."""
        return await self._loop.run_in_executor(self._io, self._apply, change)

    def _apply(self, change):
        old = self._written
        new, changes, result = change(old)
        if new is not old:
            try:
                if new.next_producer_id != old.next_producer_id:
                    write_json(self.producer_ids_path, {"next": new.next_producer_id})
                if new.revision != old.revision:  # every other change counts a revision
                    self._save(new)
            except OSError as exc:
                raise storage_error_from_os(exc, f"write {self.path.parent}") from exc
            self._written = new
            self._loop.call_soon_threadsafe(self._publish, new, changes)
        return result

    def _publish(self, snap: _Snapshot, changes: list[PartitionChange]) -> None:
        self._snapshot = snap
        for q in self._partition_watchers:
            for c in changes:
                q.put_nowait(c)

    def _check_single_node(self, record: TopicRecord, states: Sequence[PartitionState]) -> None:
        node = self.node_id
        if any(replicas != [node] for replicas in record.assignment):
            raise InvalidRequest(
                f"topic {record.name!r}: a single broker (node {node}) holds the only replica of "
                f"each partition; more replicas need more brokers"
            )
        for s in states:
            self._check_state(s)

    def _check_state(self, state: PartitionState) -> None:
        if state.leader != self.node_id or state.isr != [self.node_id]:
            raise InvalidRequest(
                f"a single broker (node {self.node_id}) leads every partition and is its only "
                f"in-sync replica, not {state}"
            )

    # ------------------------------------------------------------------ brokers

    async def register_broker(self, reg: BrokerRegistration) -> None:
        if reg.node_id != self.node_id:
            raise ConfigError(f"this data directory's store is node {self.node_id}'s, not {reg.node_id}'s")
        if self._registration not in (None, reg):
            raise NodeIdInUse(f"node {reg.node_id} is already registered as {self._registration}")
        self._registration = reg
        for q in self._broker_watchers:
            q.put_nowait([reg])

    async def brokers(self) -> list[BrokerRegistration]:
        return [self._registration] if self._registration else []

    async def watch_brokers(self) -> AsyncIterator[list[BrokerRegistration]]:
        q: asyncio.Queue = asyncio.Queue()
        self._broker_watchers.add(q)
        try:
            q.put_nowait(await self.brokers())
            while (live := await q.get()) is not None:
                yield live
        finally:
            self._broker_watchers.discard(q)

    # ------------------------------------------------------------------ topics

    async def topics(self) -> dict[str, TopicRecord]:
        return dict(self._snapshot.topics)

    async def create_topic(self, record: TopicRecord, states: Sequence[PartitionState]) -> None:
        check_new_topic(record, states)
        self._check_single_node(record, states)

        def change(s: _Snapshot):
            if record.name in s.topics:
                raise TopicAlreadyExists(f"topic {record.name!r} already exists")
            rev = s.revision + 1
            written = [replace(st, version=rev) for st in states]
            new = replace(
                s, topics={**s.topics, record.name: record},
                states={**s.states, record.name: written}, revision=rev,
            )
            return new, [PartitionChange(record.name, p, st) for p, st in enumerate(written)], None

        await self._change(change)

    async def delete_topic(self, name: str) -> None:
        def change(s: _Snapshot):
            if name not in s.topics:
                raise unknown_topic(name)
            topics, states = dict(s.topics), dict(s.states)
            del topics[name]
            gone = states.pop(name)
            new = replace(s, topics=topics, states=states, revision=s.revision + 1)
            return new, [PartitionChange(name, p, None) for p in range(len(gone))], None

        await self._change(change)

    async def update_topic(
        self, record: TopicRecord, new_states: Sequence[PartitionState] = ()
    ) -> None:
        self._check_single_node(record, new_states)

        def change(s: _Snapshot):
            current = s.topics.get(record.name)
            if current is None:
                raise unknown_topic(record.name)
            check_topic_update(current, record, new_states)
            rev = s.revision + 1
            added = [replace(st, version=rev) for st in new_states]
            new = replace(
                s, topics={**s.topics, record.name: record},
                states={**s.states, record.name: s.states[record.name] + added}, revision=rev,
            )
            first = current.partitions
            return new, [PartitionChange(record.name, first + i, st) for i, st in enumerate(added)], None

        await self._change(change)

    async def reassign(
        self, topic: str, assignments: Mapping[int, Sequence[int]],
        moving: Mapping[int, Sequence[int]] | None = None, replication_factor: int | None = None,
    ) -> None:
        """One node holds every replica: the only list there is, ``[node_id]``, can be
        written again (its states get new versions); any other is ``InvalidRequest``, and
        so is every pending move (it needs two nodes): none is ever kept here."""
        assignments = {p: list(r) for p, r in assignments.items()}

        def change(s: _Snapshot):
            current = s.topics.get(topic)
            if current is None:
                raise unknown_topic(topic)
            record = reassigned_record(current, assignments, moving, replication_factor)
            self._check_single_node(record, ())
            rev = s.revision + 1
            states = list(s.states[topic])
            for p in sorted(assignments):
                states[p] = replace(reassigned_state(states[p], assignments[p]), version=rev)
            new = replace(s, topics={**s.topics, topic: record}, states={**s.states, topic: states}, revision=rev)
            return new, [PartitionChange(topic, p, states[p]) for p in sorted(assignments)], None

        await self._change(change)

    # ------------------------------------------------------------------ partition state

    async def partition_states(self, topic: str) -> list[PartitionState]:
        states = self._snapshot.states.get(topic)
        if states is None:
            raise unknown_topic(topic)
        return list(states)

    async def cas_partition_state(
        self, topic: str, partition: int, expected_version: int, new_state: PartitionState
    ) -> bool:
        self._check_state(new_state)

        def change(s: _Snapshot):
            states = s.states.get(topic)
            if states is None:
                raise unknown_topic(topic)
            if not 0 <= partition < len(states):
                raise unknown_partition(topic, partition, len(states))
            if states[partition].version != expected_version:
                return s, [], False
            rev = s.revision + 1
            written = replace(new_state, version=rev)
            changed = [*states[:partition], written, *states[partition + 1 :]]
            new = replace(s, states={**s.states, topic: changed}, revision=rev)
            return new, [PartitionChange(topic, partition, written)], True

        return await self._change(change)

    async def watch_partition_states(self) -> AsyncIterator[PartitionChange]:
        q: asyncio.Queue = asyncio.Queue()
        self._partition_watchers.add(q)
        try:
            for topic, states in self._snapshot.states.items():
                for p, state in enumerate(states):
                    q.put_nowait(PartitionChange(topic, p, state))
            while (change := await q.get()) is not None:
                yield change
        finally:
            self._partition_watchers.discard(q)

    # ------------------------------------------------------------------ controller

    async def campaign(self, node_id: int) -> Leadership:
        """The only node is elected at once; its epoch is a new revision (persisted)."""
        if node_id != self.node_id:
            raise InvalidRequest(f"only node {self.node_id} can be elected in this data directory")
        if self._leadership is None or self._leadership.lost.is_set():
            epoch = await self._change(
                lambda s: (replace(s, revision=s.revision + 1), [], s.revision + 1)
            )
            self._leadership = Leadership(node_id, epoch)
        return self._leadership

    async def controller(self) -> int | None:
        held = self._leadership is not None and not self._leadership.lost.is_set()
        return self.node_id if held else None

    async def resign(self) -> None:
        if self._leadership is not None:
            self._leadership.lost.set()
            self._leadership = None

    # ------------------------------------------------------------------ producer ids

    async def allocate_producer_ids(self, block_size: int) -> tuple[int, int]:
        check_block_size(block_size)

        def change(s: _Snapshot):
            first, last = producer_id_block(s.next_producer_id, block_size)
            return replace(s, next_producer_id=last + 1), [], (first, last)

        return await self._change(change)
