"""etcd metadata store: the brokers of a cluster share their metadata in etcd (3.4 and up).

``etcd://host:port[,host:port...][/cluster]`` names the etcd endpoints and the cluster
(default ``default``); several Sluice clusters can share one etcd.  Keys, under
``/sluice/<cluster>/``, hold JSON (readable with ``etcdctl get --prefix /sluice/``)::

    brokers/<node id>        BrokerRegistration                held by the broker's lease
    topics/<name>            TopicRecord
    partitions/<topic>/<p>   {"leader", "leader_epoch", "isr"}  version: the key's mod_revision
    controller               {"node_id"}                       held by the controller's lease;
                                                                epoch: the key's create_revision
    producer_ids             {"next"}
    cluster_id               {"id"}                            the cluster's id, set once

Every change of more than one key is one etcd transaction; every conditional change compares
a revision (``mod_revision`` or ``create_revision``), never a value read earlier, so a delete
and re-create in between cannot fool it.  etcd refuses transactions of more than
``--max-txn-ops`` operations (128 by default): a topic is created, or grown, by at most that
many partitions minus one at a time.

The store is composed of: ``EtcdClient`` (etcd_client.py), the connection — every call
bounded by ``request_timeout_ms``, raising ``MetadataUnavailable`` (retriable) naming the
endpoint when etcd cannot be reached, moving to the next endpoint, watches that ride out
outages (see ``store.py``); ``SessionKeeper`` (etcd_session.py), the session lease the
broker registration and the controller key are attached to, renewed and replaced once
lost; ``Election`` (etcd_election.py), the controller key.  This module holds the key
layout and the store's reads and writes.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence

import msgspec
from aetcd.utils import prefix_range_end

from sluice.cluster.etcd_client import EtcdClient
from sluice.cluster.etcd_election import Election
from sluice.cluster.etcd_session import SessionKeeper
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
from sluice.config import parse_cluster_url, session_ttl
from sluice.errors import (
    ClusterIdMismatch,
    ConfigError,
    MetadataUnavailable,
    NodeIdInUse,
    TopicAlreadyExists,
    unknown_partition,
)

log = logging.getLogger("sluice.cluster")


class _State(msgspec.Struct):
    """A partition state as stored: the version is the key's ``mod_revision``."""

    leader: int
    leader_epoch: int
    isr: list[int]


class _Counter(msgspec.Struct):
    next: int


class _ClusterId(msgspec.Struct):
    id: str


class EtcdStore(MetadataStore):
    """``MetadataStore`` on etcd (module docstring)."""

    def __init__(
        self, url: str, *, session_timeout_ms: int = 6000, request_timeout_ms: int = 3000
    ) -> None:
        self.endpoints, self.cluster = parse_cluster_url(url)
        self.session_ttl = session_ttl(session_timeout_ms)
        if request_timeout_ms < 10:
            raise ConfigError(f"etcd request timeout must be at least 10 ms, got {request_timeout_ms}")
        self.request_timeout = request_timeout_ms / 1000
        self._prefix = f"/sluice/{self.cluster}/".encode()
        self._etcd = EtcdClient(self.endpoints, self.cluster, self.request_timeout)
        self._registration: BrokerRegistration | None = None
        self._sessions = SessionKeeper(
            self._etcd, self.session_ttl, on_lost=self._session_lost, on_new=self._register_again
        )
        self._election = Election(self._etcd, self._sessions, self._key("controller"))

    def __repr__(self) -> str:
        return f"EtcdStore({self._etcd.where()})"

    def _key(self, *parts: object) -> bytes:
        return self._prefix + "/".join(str(p) for p in parts).encode()

    def _state(self, kv) -> PartitionState:
        s = self._etcd.decode(kv.key, kv.value, _State)
        return PartitionState(s.leader, s.leader_epoch, s.isr, kv.mod_revision)

    @staticmethod
    def _encode_state(state: PartitionState) -> bytes:
        return msgspec.json.encode(_State(state.leader, state.leader_epoch, list(state.isr)))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Reach an endpoint (trying each once), take a session, keep it alive."""
        for i in range(len(self.endpoints)):
            try:
                await self._etcd.call("connect", lambda c: c.status())
                break
            except MetadataUnavailable:
                if i == len(self.endpoints) - 1:
                    raise
        await self._sessions.start()

    def leaving(self) -> None:
        self._sessions.leaving()

    async def close(self) -> None:
        if self._etcd.closed:
            return
        with contextlib.suppress(MetadataUnavailable):
            await self.resign()
        self._etcd.closed = True
        await self._etcd.stop_tasks()
        await self._sessions.close()
        await self._etcd.close()

    def _session_lost(self) -> None:
        self._election.session_lost()

    async def _register_again(self) -> None:
        """A new session: the broker registered before registers again under it."""
        reg = self._registration
        if reg is None:
            return
        try:
            await self.register_broker(reg)
        except NodeIdInUse as exc:
            log.error("cannot register again: %s", exc)
            self._registration = None
        except MetadataUnavailable as exc:
            log.warning("cannot register again yet: %s", exc)  # the next session tries again

    async def claim_cluster_id(self, known: str | None) -> str:
        key = self._key("cluster_id")
        what = "read the cluster id"
        got = await self._etcd.call(what, lambda c: c.get(key))
        value = None if got is None else got.value
        if value is None and known is None:
            t = self._etcd.transactions
            new = msgspec.json.encode(_ClusterId(uuid.uuid4().hex))
            ok, racer = await self._etcd.txn("set the cluster id", [t.create(key) == 0], [t.put(key, new)], [t.get(key)])
            value = new if ok else racer[0][0][0]  # a broker starting alongside set it first
        have = None if value is None else self._etcd.decode(key, value, _ClusterId).id
        if known == EMBEDDED_CLUSTER_ID:
            raise ClusterIdMismatch(
                "this data directory is a single-node broker's (its metadata are embedded in it), and "
                f"cannot join the cluster at {self._etcd.where()} as it is: start it without --cluster, or give "
                "this broker a new data directory (nothing was changed)"
            )
        if known is not None and have != known:
            raise ClusterIdMismatch(
                f"{self._etcd.where()} {'has no cluster id' if have is None else f'has cluster id {have}'}, but "
                f"this data directory's replicas belong to cluster id {known}: "
                "its metadata were wiped, or this is another etcd or cluster name. Nothing was changed; "
                "start the broker against the cluster's own etcd (restored from a snapshot if it was lost)"
            )
        return have

    # ------------------------------------------------------------------ brokers

    async def register_broker(self, reg: BrokerRegistration) -> None:
        key, value = self._key("brokers", reg.node_id), msgspec.json.encode(reg)
        what = f"register node {reg.node_id}"

        async def attempt() -> bool | None:
            lease = self._sessions.live().lease
            t = self._etcd.transactions
            ok, got = await self._etcd.txn(
                what, [t.create(key) == 0], [t.put(key, value, lease=lease)], [t.get(key)]
            )
            if ok:
                return True
            if not got[0]:
                return None  # expired meanwhile
            holder, kv = got[0][0]
            if holder != value:
                other = self._etcd.decode(key, holder, BrokerRegistration)
                raise NodeIdInUse(
                    f"node id {reg.node_id} is held by a live broker at {other.host}:{other.port} "
                    f"({self._etcd.where()}); give this broker another --node-id, or if that broker "
                    f"just stopped, retry after its registration expires (at most "
                    f"{self.session_ttl} s)"
                )
            # the same broker, restarted before its old lease expired: take it over
            ok, _ = await self._etcd.txn(
                what, [t.mod(key) == kv.mod_revision], [t.put(key, value, lease=lease)]
            )
            return True if ok else None

        await self._etcd.retrying(what, attempt)
        self._registration = reg

    async def brokers(self) -> list[BrokerRegistration]:
        prefix = self._key("brokers", "")
        got = await self._etcd.call("list brokers", lambda c: c.get_prefix(prefix))
        regs = (self._etcd.decode(kv.key, kv.value, BrokerRegistration) for kv in got)
        return sorted(regs, key=lambda r: r.node_id)

    async def registration_token(self, node_id: int) -> int | None:
        key = self._key("brokers", node_id)
        got = await self._etcd.call(f"read the registration of node {node_id}", lambda c: c.get(key))
        return None if got is None or not got.lease else got.lease

    async def end_registration(self, node_id: int, token: int) -> bool:
        """Revoke the session lease ``token``: the registration and controller key it holds
        go at once (a broker registered again holds its key under a new lease)."""
        try:
            await self._etcd.call(
                f"end the registration of node {node_id}", lambda c: c.revoke_lease(token)
            )
        except MetadataUnavailable as exc:
            if "lease not found" in str(exc):
                return False  # expired or revoked already
            raise
        return True

    async def watch_brokers(self) -> AsyncIterator[list[BrokerRegistration]]:
        live: dict[bytes, BrokerRegistration] = {}
        async for diff in self._etcd.follow(self._key("brokers", "")):
            for key, kv in diff:
                if kv is None:
                    live.pop(key, None)
                else:
                    live[key] = self._etcd.decode(key, kv.value, BrokerRegistration)
            yield sorted(live.values(), key=lambda r: r.node_id)

    # ------------------------------------------------------------------ topics

    async def topics(self) -> dict[str, TopicRecord]:
        prefix = self._key("topics", "")
        got = await self._etcd.call("list topics", lambda c: c.get_prefix(prefix))
        records = (self._etcd.decode(kv.key, kv.value, TopicRecord) for kv in got)
        return {r.name: r for r in records}

    async def create_topic(self, record: TopicRecord, states: Sequence[PartitionState]) -> None:
        check_new_topic(record, states)
        t = self._etcd.transactions
        key = self._key("topics", record.name)
        puts = [t.put(key, msgspec.json.encode(record))] + [
            t.put(self._key("partitions", record.name, p), self._encode_state(s))
            for p, s in enumerate(states)
        ]
        ok, _ = await self._etcd.txn(f"create topic {record.name!r}", [t.create(key) == 0], puts)
        if not ok:
            raise TopicAlreadyExists(f"topic {record.name!r} already exists")

    async def delete_topic(self, name: str) -> None:
        t = self._etcd.transactions
        key, parts = self._key("topics", name), self._key("partitions", name, "")
        ok, _ = await self._etcd.txn(
            f"delete topic {name!r}",
            [t.create(key) > 0],
            [t.delete(key), t.delete(parts, range_end=prefix_range_end(parts))],
        )
        if not ok:
            raise unknown_topic(name)

    async def update_topic(
        self, record: TopicRecord, new_states: Sequence[PartitionState] = ()
    ) -> None:
        key = self._key("topics", record.name)
        what = f"update topic {record.name!r}"

        async def attempt() -> bool | None:
            got = await self._etcd.call(what, lambda c: c.get(key))
            if got is None:
                raise unknown_topic(record.name)
            current = self._etcd.decode(key, got.value, TopicRecord)
            check_topic_update(current, record, new_states)
            t = self._etcd.transactions
            puts = [t.put(key, msgspec.json.encode(record))] + [
                t.put(self._key("partitions", record.name, current.partitions + i), self._encode_state(s))
                for i, s in enumerate(new_states)
            ]
            ok, _ = await self._etcd.txn(what, [t.mod(key) == got.mod_revision], puts)
            return True if ok else None

        await self._etcd.retrying(what, attempt)

    async def reassign(
        self, topic: str, assignments: Mapping[int, Sequence[int]],
        moving: Mapping[int, Sequence[int]] | None = None, replication_factor: int | None = None,
    ) -> None:
        assignments = {p: list(r) for p, r in assignments.items()}
        key, parts = self._key("topics", topic), self._key("partitions", topic, "")
        what = f"reassign replicas of {topic!r}"

        async def attempt() -> bool | None:
            t = self._etcd.transactions
            _, (found, kvs) = await self._etcd.txn(
                what, [], [t.get(key), t.get(parts, range_end=prefix_range_end(parts))]
            )
            if not found:
                raise unknown_topic(topic)
            (value, meta), = found
            current = self._etcd.decode(key, value, TopicRecord)
            record = reassigned_record(current, assignments, moving, replication_factor)
            states = {int(kv.key[len(parts):]): self._state(kv) for _, kv in kvs}
            compare = [t.mod(key) == meta.mod_revision] + [
                t.mod(self._key("partitions", topic, p)) == states[p].version for p in assignments
            ]
            puts = [t.put(key, msgspec.json.encode(record))] + [
                t.put(self._key("partitions", topic, p), self._encode_state(reassigned_state(states[p], r)))
                for p, r in assignments.items()
            ]
            ok, _ = await self._etcd.txn(what, compare, puts)
            return True if ok else None

        await self._etcd.retrying(what, attempt)

    # ------------------------------------------------------------------ partition state

    async def partition_states(self, topic: str) -> list[PartitionState]:
        t = self._etcd.transactions
        key, parts = self._key("topics", topic), self._key("partitions", topic, "")
        _, (found, states) = await self._etcd.txn(
            f"read partition states of {topic!r}",
            [],
            [t.get(key), t.get(parts, range_end=prefix_range_end(parts))],
        )
        if not found:
            raise unknown_topic(topic)
        by_partition = {int(kv.key[len(parts):]): self._state(kv) for _, kv in states}
        return [by_partition[p] for p in sorted(by_partition)]

    async def cas_partition_state(
        self, topic: str, partition: int, expected_version: int, new_state: PartitionState
    ) -> bool:
        t = self._etcd.transactions
        key, pkey = self._key("topics", topic), self._key("partitions", topic, partition)
        ok, got = await self._etcd.txn(
            f"change the state of {topic}-{partition}",
            [t.version(pkey) > 0, t.mod(pkey) == expected_version],
            [t.put(pkey, self._encode_state(new_state))],
            [t.get(key), t.get(pkey)],
        )
        if ok:
            return True
        found_topic, found_partition = got
        if not found_topic:
            raise unknown_topic(topic)
        if not found_partition:
            n = self._etcd.decode(key, found_topic[0][0], TopicRecord).partitions
            raise unknown_partition(topic, partition, n)
        return False

    async def watch_partition_states(self) -> AsyncIterator[PartitionChange]:
        prefix = self._key("partitions", "")
        async for diff in self._etcd.follow(prefix):
            for key, kv in diff:
                topic, _, p = key[len(prefix):].decode().rpartition("/")
                yield PartitionChange(topic, int(p), None if kv is None else self._state(kv))

    # ------------------------------------------------------------------ controller

    async def campaign(self, node_id: int) -> Leadership:
        return await self._election.campaign(node_id)

    async def controller(self) -> int | None:
        return await self._election.controller()

    async def resign(self) -> None:
        await self._election.resign()

    # ------------------------------------------------------------------ producer ids

    async def allocate_producer_ids(self, block_size: int) -> tuple[int, int]:
        check_block_size(block_size)
        key = self._key("producer_ids")
        what = "allocate producer ids"

        async def attempt() -> tuple[int, int] | None:
            got = await self._etcd.call(what, lambda c: c.get(key))
            t = self._etcd.transactions
            if got is None:
                next_id, unchanged = 0, t.create(key) == 0
            else:
                next_id, unchanged = self._etcd.decode(key, got.value, _Counter).next, t.mod(key) == got.mod_revision
            first, last = producer_id_block(next_id, block_size)
            ok, _ = await self._etcd.txn(what, [unchanged], [t.put(key, msgspec.json.encode(_Counter(last + 1)))])
            return (first, last) if ok else None

        return await self._etcd.retrying(what, attempt)
