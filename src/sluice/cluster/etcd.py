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

**Session.**  One lease per store, granted with a TTL of ``session_timeout_ms`` (whole
seconds; etcd may grant more, at least 1.5 × its election timeout) and renewed every third
of it.  The broker registration and the controller key are attached to it.  When no renewal
succeeded for a whole TTL (etcd unreachable, or the lease expired there) the session is
lost: the controller's ``Leadership.lost`` is set before etcd can elect another, and as soon
as etcd answers again the store takes a new lease, registers the broker again and revokes
the old lease (so its keys go at once).

**Failures.**  Every call is bounded by ``request_timeout_ms``; a call that cannot reach etcd
in time raises ``MetadataUnavailable`` (retriable) naming the endpoint.  gRPC reconnects on
its own (at most a second apart), so calls work again as soon as etcd is back; with several
endpoints the store moves to the next one after a failed call.  Watches ride out outages
(see ``store.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import aetcd
import msgspec
from aetcd import rpc
from aetcd.utils import prefix_range_end

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
    InvalidPartitions,
    InvalidRequest,
    MetadataUnavailable,
    NodeIdInUse,
    TopicAlreadyExists,
    UnknownServerError,
    unknown_partition,
)

log = logging.getLogger("sluice.cluster")

T = TypeVar("T")

_GRPC_OPTIONS = {
    # reconnect within a second of etcd coming back, not after gRPC's default 2 minutes
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # notice a silently dead connection under a watch (etcd refuses pings under 5 s apart)
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}
_CONTENDED_TRIES = 20  # read-check-write loops lost to concurrent writers before giving up
CAMPAIGN_LOG_EVERY_S = 30.0  # "campaign for controller waits" (etcd out): at most one line per this


class _State(msgspec.Struct):
    """A partition state as stored: the version is the key's ``mod_revision``."""

    leader: int
    leader_epoch: int
    isr: list[int]


class _Controller(msgspec.Struct):
    node_id: int


class _Counter(msgspec.Struct):
    next: int


class _ClusterId(msgspec.Struct):
    id: str


@dataclass
class _Session:
    lease: int
    ttl: float  # as granted, seconds
    expires: float  # monotonic time from which etcd may have let the lease expire
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    failing: bool = False  # the last renewal failed (logged once)


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
        self._endpoint = 0
        self._client = self._new_client()
        self._session: _Session | None = None
        self._stale_leases: list[int] = []  # of lost sessions, to revoke once etcd answers
        self._registration: BrokerRegistration | None = None
        self._leadership: Leadership | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._leaving = False  # the broker is stopping: a lost session is not replaced

    def __repr__(self) -> str:
        return f"EtcdStore({self._where()})"

    # ------------------------------------------------------------------ plumbing

    def _where(self) -> str:
        host, port = self.endpoints[self._endpoint]
        return f"etcd {host}:{port}, cluster {self.cluster!r}"

    def _new_client(self) -> aetcd.Client:
        host, port = self.endpoints[self._endpoint]
        return aetcd.Client(host, port, timeout=self.request_timeout, options=_GRPC_OPTIONS)

    def _key(self, *parts: object) -> bytes:
        return self._prefix + "/".join(str(p) for p in parts).encode()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _call(
        self, what: str, op: Callable[[aetcd.Client], Awaitable[T]], timeout: float | None = None
    ) -> T:
        """Run one etcd call within the request timeout; errors become Sluice errors."""
        client = self._client
        try:
            return await bounded(op(client), timeout or self.request_timeout)
        except aetcd.InvalidArgumentError as exc:
            if "too many operations" in str(exc):
                raise InvalidPartitions(
                    f"{what}: etcd allows at most --max-txn-ops operations (128 by default) in "
                    f"one transaction, one per partition: create or grow the topic by fewer "
                    f"partitions at a time, or raise that limit of etcd"
                ) from exc
            raise InvalidRequest(f"{what}: etcd refused it: {exc}") from exc
        except (TimeoutError, aetcd.ClientError, rpc.AioRpcError) as exc:
            if isinstance(exc, TimeoutError):
                why = (
                    f"{self._where()} did not answer within {(timeout or self.request_timeout) * 1000:.0f} ms "
                    "(a change may still take effect when it does: check before retrying)"
                )
            else:
                why = f"{self._where()} failed ({str(exc) or type(exc).__name__})"
            if isinstance(exc, TimeoutError | aetcd.ConnectionFailedError | aetcd.ConnectionTimeoutError):
                await self._next_endpoint(client)
            raise MetadataUnavailable(f"{what}: {why}; retry when etcd is back") from exc

    async def _next_endpoint(self, failed: aetcd.Client) -> None:
        if len(self.endpoints) == 1 or failed is not self._client or self._closed:
            return
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)
        self._client = self._new_client()
        log.warning("moving to %s", self._where())
        self._spawn(_close_quietly(failed))

    async def _cancel(self, watch) -> None:
        with contextlib.suppress(Exception):
            await bounded(watch.cancel(), self.request_timeout)

    async def _txn(self, what: str, compare: list, success: list, failure: Sequence = ()):
        return await self._call(
            what, lambda c: c.transaction(compare=compare, success=success, failure=list(failure))
        )

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T | None]]) -> T:
        """Repeat a read-check-write ``attempt`` until it returns something other than None
        (None: a concurrent writer won the race)."""
        for _ in range(_CONTENDED_TRIES):
            result = await attempt()
            if result is not None:
                return result
        raise MetadataUnavailable(f"{what}: lost {_CONTENDED_TRIES} races to concurrent writers; retry")

    def _decode(self, key: bytes, value: bytes, type_: type[T]) -> T:
        try:
            return msgspec.json.decode(value, type=type_)
        except msgspec.MsgspecError as exc:
            raise UnknownServerError(
                f"{self._where()}: key {key.decode(errors='replace')} holds {value[:200]!r}, "
                f"not a {type_.__name__} ({exc})"
            ) from exc

    def _state(self, kv) -> PartitionState:
        s = self._decode(kv.key, kv.value, _State)
        return PartitionState(s.leader, s.leader_epoch, s.isr, kv.mod_revision)

    @staticmethod
    def _encode_state(state: PartitionState) -> bytes:
        return msgspec.json.encode(_State(state.leader, state.leader_epoch, list(state.isr)))

    def _live_session(self) -> _Session:
        s = self._session
        if self._closed or s is None or s.lost.is_set():
            raise MetadataUnavailable(
                f"no session with {self._where()} (etcd unreachable, or the session expired: "
                "a new one is being made); retry"
            )
        return s

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Reach an endpoint (trying each once), take a session, keep it alive."""
        for i in range(len(self.endpoints)):
            try:
                await self._call("connect", lambda c: c.status())
                break
            except MetadataUnavailable:
                if i == len(self.endpoints) - 1:
                    raise
        self._session = await self._new_session()
        self._spawn(self._keep_alive())

    def leaving(self) -> None:
        self._leaving = True

    async def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(MetadataUnavailable):
            await self.resign()
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:  # bounded: a task stuck in the etcd client must not hold the close
            await asyncio.wait(list(self._tasks), timeout=2 * self.request_timeout)
        if self._session is not None:
            self._stale_leases.append(self._session.lease)
            self._session.lost.set()
        await self._revoke_stale_leases()
        await _close_quietly(self._client)

    # ------------------------------------------------------------------ session

    async def _new_session(self) -> _Session:
        sent = time.monotonic()
        lease = await self._call("grant a session lease", lambda c: c.lease(self.session_ttl))
        return _Session(lease.id, float(lease.ttl), sent + lease.ttl)

    async def _keep_alive(self) -> None:
        """Renew the session every third of its TTL; replace it once lost (module docstring)."""
        retry = min(0.5, self.session_ttl / 6)
        next_try = time.monotonic()
        while True:
            try:
                next_try = await self._renew_or_replace(next_try, retry)
            except Exception:  # a bug: keep the session alive regardless
                log.exception("etcd session upkeep failed")
                next_try = time.monotonic() + retry

    async def _renew_or_replace(self, next_try: float, retry: float) -> float:
        """One step of ``_keep_alive``; returns when to try the next renewal."""
        s = self._session
        if s is None and self._leaving:
            await asyncio.sleep(retry)
            return next_try
        if s is None:
            try:
                s = await self._new_session()
            except MetadataUnavailable:
                await asyncio.sleep(retry)
                return next_try
            self._session = s
            log.warning("new etcd session with %s", self._where())
            await self._register_again()
            await self._revoke_stale_leases()
            return time.monotonic() + s.ttl / 3
        await asyncio.sleep(max(0.0, min(next_try, s.expires) - time.monotonic()))
        sent = time.monotonic()
        if sent >= s.expires:
            self._lose(s, f"not renewed for {s.ttl:g} s")
            return sent
        try:
            reply = await self._call(
                "renew the session lease", lambda c: c.refresh_lease(s.lease),
                timeout=min(self.request_timeout, s.expires - sent),
            )
        except MetadataUnavailable as exc:
            (log.debug if s.failing else log.warning)("%s", exc)
            s.failing = True
            return time.monotonic() + retry
        if reply is None or reply.TTL <= 0:
            self._lose(s, "the lease expired in etcd")
            return sent
        s.expires, s.failing = sent + s.ttl, False
        return sent + s.ttl / 3

    def _lose(self, s: _Session, why: str) -> None:
        log.error("etcd session lost (%s): %s", why, self._where())
        s.lost.set()
        self._session = None
        self._stale_leases.append(s.lease)
        if self._leadership is not None:
            log.error("controller epoch %d ends with the session", self._leadership.epoch)
            self._leadership.lost.set()
            self._leadership = None

    async def _register_again(self) -> None:
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

    async def _revoke_stale_leases(self) -> None:
        while self._stale_leases:
            lease = self._stale_leases[0]
            try:
                await self._call("revoke an old lease", lambda c, lease=lease: c.revoke_lease(lease))
            except MetadataUnavailable as exc:
                if "lease not found" not in str(exc):
                    return  # unreachable: it expires by itself, or is revoked with the next one
            self._stale_leases.pop(0)

    # ------------------------------------------------------------------ watches

    async def _follow(self, prefix: bytes) -> AsyncIterator[list[tuple[bytes, object | None]]]:
        """Changes under ``prefix`` as lists of ``(key, kv or None if deleted)``.

        The first list holds every key present (maybe none); after an outage or a compacted
        revision the prefix is read again and the differences yielded.  Ends on close.
        """
        known: dict[bytes, int] = {}  # key -> mod_revision
        first, failing = True, False
        while not self._closed:
            watch = None
            try:
                snap = await self._call(f"read {prefix.decode()}", lambda c: c.get_prefix(prefix))
                failing = False
                current = {kv.key: kv for kv in snap}
                diff = [(k, kv) for k, kv in sorted(current.items()) if known.get(k) != kv.mod_revision]
                diff += [(k, None) for k in sorted(known.keys() - current.keys())]
                known = {k: kv.mod_revision for k, kv in current.items()}
                if diff or first:
                    first = False
                    yield diff
                start = snap.header.revision + 1
                watch = await self._call(
                    f"watch {prefix.decode()}", lambda c, start=start: c.watch_prefix(prefix, start_revision=start)
                )
                async for event in watch:
                    if event.kind == "DELETE":
                        known.pop(event.kv.key, None)
                        yield [(event.kv.key, None)]
                    else:
                        known[event.kv.key] = event.kv.mod_revision
                        yield [(event.kv.key, event.kv)]
            except (MetadataUnavailable, aetcd.ClientError) as exc:
                (log.debug if failing else log.info)(
                    "watch of %s interrupted (%s); catching up when etcd answers", prefix.decode(), exc
                )
                failing = True
                await asyncio.sleep(min(0.5, self.request_timeout))
            finally:
                if watch is not None:
                    await self._cancel(watch)

    async def claim_cluster_id(self, known: str | None) -> str:
        key = self._key("cluster_id")
        what = "read the cluster id"
        got = await self._call(what, lambda c: c.get(key))
        value = None if got is None else got.value
        if value is None and known is None:
            t = self._client.transactions
            new = msgspec.json.encode(_ClusterId(uuid.uuid4().hex))
            ok, racer = await self._txn("set the cluster id", [t.create(key) == 0], [t.put(key, new)], [t.get(key)])
            value = new if ok else racer[0][0][0]  # a broker starting alongside set it first
        have = None if value is None else self._decode(key, value, _ClusterId).id
        if known == EMBEDDED_CLUSTER_ID:
            raise ClusterIdMismatch(
                "this data directory is a single-node broker's (its metadata are embedded in it), and "
                f"cannot join the cluster at {self._where()} as it is: start it without --cluster, or give "
                "this broker a new data directory (nothing was changed)"
            )
        if known is not None and have != known:
            raise ClusterIdMismatch(
                f"{self._where()} {'has no cluster id' if have is None else f'has cluster id {have}'}, but "
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
            lease = self._live_session().lease
            t = self._client.transactions
            ok, got = await self._txn(
                what, [t.create(key) == 0], [t.put(key, value, lease=lease)], [t.get(key)]
            )
            if ok:
                return True
            if not got[0]:
                return None  # expired meanwhile
            holder, kv = got[0][0]
            if holder != value:
                other = self._decode(key, holder, BrokerRegistration)
                raise NodeIdInUse(
                    f"node id {reg.node_id} is held by a live broker at {other.host}:{other.port} "
                    f"({self._where()}); give this broker another --node-id, or if that broker "
                    f"just stopped, retry after its registration expires (at most "
                    f"{self.session_ttl} s)"
                )
            # the same broker, restarted before its old lease expired: take it over
            ok, _ = await self._txn(
                what, [t.mod(key) == kv.mod_revision], [t.put(key, value, lease=lease)]
            )
            return True if ok else None

        await self._retrying(what, attempt)
        self._registration = reg

    async def brokers(self) -> list[BrokerRegistration]:
        prefix = self._key("brokers", "")
        got = await self._call("list brokers", lambda c: c.get_prefix(prefix))
        regs = (self._decode(kv.key, kv.value, BrokerRegistration) for kv in got)
        return sorted(regs, key=lambda r: r.node_id)

    async def registration_token(self, node_id: int) -> int | None:
        key = self._key("brokers", node_id)
        got = await self._call(f"read the registration of node {node_id}", lambda c: c.get(key))
        return None if got is None or not got.lease else got.lease

    async def end_registration(self, node_id: int, token: int) -> bool:
        """Revoke the session lease ``token``: the registration and controller key it holds
        go at once (a broker registered again holds its key under a new lease)."""
        try:
            await self._call(
                f"end the registration of node {node_id}", lambda c: c.revoke_lease(token)
            )
        except MetadataUnavailable as exc:
            if "lease not found" in str(exc):
                return False  # expired or revoked already
            raise
        return True

    async def watch_brokers(self) -> AsyncIterator[list[BrokerRegistration]]:
        live: dict[bytes, BrokerRegistration] = {}
        async for diff in self._follow(self._key("brokers", "")):
            for key, kv in diff:
                if kv is None:
                    live.pop(key, None)
                else:
                    live[key] = self._decode(key, kv.value, BrokerRegistration)
            yield sorted(live.values(), key=lambda r: r.node_id)

    # ------------------------------------------------------------------ topics

    async def topics(self) -> dict[str, TopicRecord]:
        prefix = self._key("topics", "")
        got = await self._call("list topics", lambda c: c.get_prefix(prefix))
        records = (self._decode(kv.key, kv.value, TopicRecord) for kv in got)
        return {r.name: r for r in records}

    async def create_topic(self, record: TopicRecord, states: Sequence[PartitionState]) -> None:
        check_new_topic(record, states)
        t = self._client.transactions
        key = self._key("topics", record.name)
        puts = [t.put(key, msgspec.json.encode(record))] + [
            t.put(self._key("partitions", record.name, p), self._encode_state(s))
            for p, s in enumerate(states)
        ]
        ok, _ = await self._txn(f"create topic {record.name!r}", [t.create(key) == 0], puts)
        if not ok:
            raise TopicAlreadyExists(f"topic {record.name!r} already exists")

    async def delete_topic(self, name: str) -> None:
        t = self._client.transactions
        key, parts = self._key("topics", name), self._key("partitions", name, "")
        ok, _ = await self._txn(
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
            got = await self._call(what, lambda c: c.get(key))
            if got is None:
                raise unknown_topic(record.name)
            current = self._decode(key, got.value, TopicRecord)
            check_topic_update(current, record, new_states)
            t = self._client.transactions
            puts = [t.put(key, msgspec.json.encode(record))] + [
                t.put(self._key("partitions", record.name, current.partitions + i), self._encode_state(s))
                for i, s in enumerate(new_states)
            ]
            ok, _ = await self._txn(what, [t.mod(key) == got.mod_revision], puts)
            return True if ok else None

        await self._retrying(what, attempt)

    async def reassign(
        self, topic: str, assignments: Mapping[int, Sequence[int]],
        moving: Mapping[int, Sequence[int]] | None = None, replication_factor: int | None = None,
    ) -> None:
        assignments = {p: list(r) for p, r in assignments.items()}
        key, parts = self._key("topics", topic), self._key("partitions", topic, "")
        what = f"reassign replicas of {topic!r}"

        async def attempt() -> bool | None:
            t = self._client.transactions
            _, (found, kvs) = await self._txn(
                what, [], [t.get(key), t.get(parts, range_end=prefix_range_end(parts))]
            )
            if not found:
                raise unknown_topic(topic)
            (value, meta), = found
            current = self._decode(key, value, TopicRecord)
            record = reassigned_record(current, assignments, moving, replication_factor)
            states = {int(kv.key[len(parts):]): self._state(kv) for _, kv in kvs}
            compare = [t.mod(key) == meta.mod_revision] + [
                t.mod(self._key("partitions", topic, p)) == states[p].version for p in assignments
            ]
            puts = [t.put(key, msgspec.json.encode(record))] + [
                t.put(self._key("partitions", topic, p), self._encode_state(reassigned_state(states[p], r)))
                for p, r in assignments.items()
            ]
            ok, _ = await self._txn(what, compare, puts)
            return True if ok else None

        await self._retrying(what, attempt)

    # ------------------------------------------------------------------ partition state

    async def partition_states(self, topic: str) -> list[PartitionState]:
        t = self._client.transactions
        key, parts = self._key("topics", topic), self._key("partitions", topic, "")
        _, (found, states) = await self._txn(
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
        t = self._client.transactions
        key, pkey = self._key("topics", topic), self._key("partitions", topic, partition)
        ok, got = await self._txn(
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
            n = self._decode(key, found_topic[0][0], TopicRecord).partitions
            raise unknown_partition(topic, partition, n)
        return False

    async def watch_partition_states(self) -> AsyncIterator[PartitionChange]:
        prefix = self._key("partitions", "")
        async for diff in self._follow(prefix):
            for key, kv in diff:
                topic, _, p = key[len(prefix):].decode().rpartition("/")
                yield PartitionChange(topic, int(p), None if kv is None else self._state(kv))

    # ------------------------------------------------------------------ controller

    async def campaign(self, node_id: int) -> Leadership:
        key, value = self._key("controller"), msgspec.json.encode(_Controller(node_id))
        said_at = -math.inf  # the wait is logged once per CAMPAIGN_LOG_EVERY_S, not every try
        while not self._closed:
            if self._leadership is not None and not self._leadership.lost.is_set():
                return self._leadership
            try:
                s = self._live_session()
                t = self._client.transactions
                ok, got = await self._txn(
                    "campaign for controller",
                    [t.create(key) == 0], [t.put(key, value, lease=s.lease)], [t.get(key)],
                )
                if ok:
                    return self._elected(node_id, got[0].response_put.header.revision, s)
                if got[0]:
                    await self._wait_for_vacancy(key, got[0][0][1], s)
            except MetadataUnavailable as exc:
                if time.monotonic() - said_at >= CAMPAIGN_LOG_EVERY_S:
                    said_at = time.monotonic()
                    log.info("campaign for controller waits: %s", exc)
                await asyncio.sleep(min(0.5, self.request_timeout))
        raise MetadataUnavailable("the metadata store is closed")

    def _elected(self, node_id: int, epoch: int, s: _Session) -> Leadership:
        lead = Leadership(node_id, epoch)
        if s.lost.is_set() or s is not self._session:
            lead.lost.set()  # lost while the answer travelled
            return lead
        self._leadership = lead
        self._spawn(self._guard(lead))
        log.info("node %d is the controller (epoch %d)", node_id, epoch)
        return lead

    async def _wait_for_vacancy(self, key: bytes, holder, s: _Session) -> None:
        """Return once the controller key held as ``holder`` is gone, or after a while (the
        caller tries again).  A key left by this store's own earlier term is removed."""
        if holder.lease == s.lease:
            t = self._client.transactions
            await self._txn("remove an old term", [t.create(key) == holder.create_revision], [t.delete(key)])
            return
        start = holder.mod_revision + 1
        watch = await self._call("watch the controller", lambda c: c.watch(key, start_revision=start))
        try:
            async with asyncio.timeout(s.ttl):
                async for event in watch:
                    if event.kind == "DELETE":
                        return
        except TimeoutError:
            return
        except aetcd.ClientError as exc:
            raise MetadataUnavailable(f"watch the controller: {self._where()}: {exc}") from exc
        finally:
            await self._cancel(watch)

    async def _guard(self, lead: Leadership) -> None:
        """Set ``lead.lost`` once the controller key stops being this term's."""
        key = self._key("controller")
        held = False  # the first change list holds the key if it is there
        async for diff in self._follow(key):
            for k, kv in diff:
                if k == key:
                    held = kv is not None and kv.create_revision == lead.epoch
            if not held or lead.lost.is_set():
                break
        if self._leadership is lead:
            self._leadership = None
        if not lead.lost.is_set():
            log.error("controller epoch %d ended: its key was removed or replaced", lead.epoch)
            lead.lost.set()

    async def controller(self) -> int | None:
        key = self._key("controller")
        got = await self._call("read the controller", lambda c: c.get(key))
        return None if got is None else self._decode(key, got.value, _Controller).node_id

    async def resign(self) -> None:
        lead = self._leadership
        if lead is None:
            return
        lead.lost.set()
        t = self._client.transactions
        key = self._key("controller")
        await self._txn("resign as controller", [t.create(key) == lead.epoch], [t.delete(key)])
        if self._leadership is lead:
            self._leadership = None
        log.info("node %d resigned as controller (epoch %d)", lead.node_id, lead.epoch)

    # ------------------------------------------------------------------ producer ids

    async def allocate_producer_ids(self, block_size: int) -> tuple[int, int]:
        check_block_size(block_size)
        key = self._key("producer_ids")
        what = "allocate producer ids"

        async def attempt() -> tuple[int, int] | None:
            got = await self._call(what, lambda c: c.get(key))
            t = self._client.transactions
            if got is None:
                next_id, unchanged = 0, t.create(key) == 0
            else:
                next_id, unchanged = self._decode(key, got.value, _Counter).next, t.mod(key) == got.mod_revision
            first, last = producer_id_block(next_id, block_size)
            ok, _ = await self._txn(what, [unchanged], [t.put(key, msgspec.json.encode(_Counter(last + 1)))])
            return (first, last) if ok else None

        return await self._retrying(what, attempt)


async def _close_quietly(client: aetcd.Client) -> None:
    with contextlib.suppress(Exception):
        await bounded(client.close(), 2)


async def bounded(aw: Awaitable[T], timeout: float) -> T:
    """``await aw``, but return (raising ``TimeoutError``) after ``timeout`` seconds even if
    ``aw`` ignores its cancellation: it runs as a task of its own, cancelled and left
    behind when late.  (``asyncio.timeout`` alone cannot bound aetcd, whose watch teardown
    swallows ``CancelledError`` and can block on a full request queue once etcd went away.)"""
    task = asyncio.ensure_future(aw)
    # its outcome is seen even when nobody reads it: late, or this caller cancelled (as
    # ``PeerLiveness`` cancels its watchers) just as the call ended
    task.add_done_callback(_retrieve)
    try:
        done, _ = await asyncio.wait([task], timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        raise TimeoutError
    return task.result()


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()

