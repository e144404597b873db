"""Frozen settings: per-topic config and broker (server) config, with validation.

Topic configs travel on the wire and in the metadata store as ``dict[str, str]`` with
Kafka-style dotted keys (``retention.ms``); ``TopicConfig.parse`` turns them into a frozen
dataclass or raises ``InvalidConfig`` naming the key and what is allowed.  Unknown keys are
errors, not silently ignored.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import ConfigError, InvalidConfig, InvalidPartitions, InvalidTopicName
from sluice.storage.log import LogConfig

DAY_MS = 24 * 3600 * 1000
_CENTURY_MS = 36_525 * DAY_MS
MAX_PARTITIONS = 10_000

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


_HOST = re.compile(r"[A-Za-z0-9._:-]{1,253}")  # a host name, IPv4 or IPv6 address
_INTEGER = re.compile(r"-?[0-9]+")  # a config number: ASCII digits, "-" for a negative one
_CLUSTER_URL = re.compile(r"etcd://(?P<hosts>[^/]+)(?:/(?P<cluster>[A-Za-z0-9._-]+))?/?")


def _unspecified(host: str) -> bool:
    """True for an address that means "every address of this machine" (0.0.0.0, ::, 0)."""
    if host in ("", "0"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://host:port[,host:port...][/cluster]`` -> (endpoints, cluster name).

    ``ConfigError`` saying the expected form for anything else.
    """
    form = "expected etcd://HOST:PORT[,HOST:PORT...][/CLUSTER-NAME]"
    m = _CLUSTER_URL.fullmatch(url.strip()) if isinstance(url, str) else None
    if m is None:
        raise ConfigError(f"bad cluster address {url!r}: {form}")
    endpoints = []
    for part in m["hosts"].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(f"bad etcd endpoint {part!r} in {url!r}: {form}")
        endpoints.append((host, int(port)))
    return endpoints, m["cluster"] or "default"


def session_ttl(session_timeout_ms: int) -> int:
    """The lease TTL, in whole seconds, for a session timeout; ``ConfigError`` below 1 s."""
    if session_timeout_ms < 1000:
        raise ConfigError(f"session timeout must be at least 1000 ms, got {session_timeout_ms}")
    return math.ceil(session_timeout_ms / 1000)


def check_topic_name(name: str, *, internal_ok: bool = False) -> None:
    """Raise ``InvalidTopicName`` unless ``name`` is a legal topic name.

    Legal: 1-249 characters from ``A-Z a-z 0-9 . _ -``, not ``.`` or ``..``; names starting
    with ``__`` are reserved for internal topics.
    """
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidTopicName(
            f"invalid topic name {name!r}: use 1-249 characters from A-Z a-z 0-9 . _ -"
        )
    if name.startswith("__") and not internal_ok:
        raise InvalidTopicName(f"invalid topic name {name!r}: names starting with __ are reserved")


def check_partitions(n) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_PARTITIONS:
        raise InvalidPartitions(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {n!r}")


@dataclass(frozen=True)
class _Key:
    attr: str
    minimum: int
    maximum: int | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic settings. Defaults favour durability: every write is fsynced before its ack."""

    retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    segment_bytes: int = 256 * 1024 * 1024
    segment_ms: int = 7 * DAY_MS
    max_message_bytes: int = 1024 * 1024
    flush_messages: int = 1  # 1: fsync before every ack ("always"); N: every N; 0: by time only
    flush_ms: int = 1000  # background fsync of unflushed data at least this often; 0: never
    timestamp_type: str = "LogAppendTime"  # or "CreateTime"
    index_interval_bytes: int = 4096
    min_insync_replicas: int = 1  # acks=all needs this many in-sync replicas, else refused
    replica_wait_max_requests: int = 1000  # acks=all requests waiting per partition
    replica_wait_max_bytes: int = 64 * 1024 * 1024  # their bytes, per partition
    write_queue_max_bytes: int = 64 * 1024 * 1024  # bytes queued for the writer per partition
    # acks=all is refused at once when an in-sync follower is this many bytes behind (-1: no bound)
    replica_lag_max_bytes: int = 256 * 1024 * 1024
    cleanup_policy: str = "delete"  # "compact": keep the latest record of each key
    # compact: a tombstone (null value) stays this long after its segment was first cleaned
    delete_retention_ms: int = DAY_MS
    # compact: clean when never-cleaned bytes are at least this share of the cleanable bytes
    min_cleanable_dirty_percent: int = 50
    # elect a replica that is not in sync when no in-sync one is alive (may lose acked data)
    unclean_leader_election_enable: str = "false"
    # an idempotent producer idle this long is forgotten (its retries then store copies)
    producer_id_expiration_ms: int = DAY_MS

    KEYS = {
        "retention.ms": _Key("retention_ms", -1, _CENTURY_MS),
        "retention.bytes": _Key("retention_bytes", -1, 1 << 60),
        "segment.bytes": _Key("segment_bytes", 1024, 1 << 31),
        "segment.ms": _Key("segment_ms", 1, _CENTURY_MS),
        "max.message.bytes": _Key("max_message_bytes", 64, 32 * 1024 * 1024),
        "flush.messages": _Key("flush_messages", 0, 1 << 62),
        "flush.ms": _Key("flush_ms", 0, DAY_MS),
        "timestamp.type": _Key("timestamp_type", 0, choices=("LogAppendTime", "CreateTime")),
        "index.interval.bytes": _Key("index_interval_bytes", 64, 1 << 24),
        "min.insync.replicas": _Key("min_insync_replicas", 1, 1024),
        "replica.wait.max.requests": _Key("replica_wait_max_requests", 1, 1 << 20),
        "replica.wait.max.bytes": _Key("replica_wait_max_bytes", 1024, 1 << 40),
        "write.queue.max.bytes": _Key("write_queue_max_bytes", 1024, 1 << 40),
        "replica.lag.max.bytes": _Key("replica_lag_max_bytes", -1, 1 << 50),
        "cleanup.policy": _Key("cleanup_policy", 0, choices=("delete", "compact")),
        "delete.retention.ms": _Key("delete_retention_ms", 0, _CENTURY_MS),
        "min.cleanable.dirty.percent": _Key("min_cleanable_dirty_percent", 0, 100),
        "unclean.leader.election.enable": _Key("unclean_leader_election_enable", 0, choices=("false", "true")),
        "producer.id.expiration.ms": _Key("producer_id_expiration_ms", 1000, _CENTURY_MS),
    }

    @classmethod
    def key(cls, key: str) -> _Key:
        """The spec of a config key; ``InvalidConfig`` naming the known keys if there is none."""
        spec = cls.KEYS.get(key)
        if spec is None:
            raise InvalidConfig(f"unknown topic config {key!r}; known: {', '.join(sorted(cls.KEYS))}")
        return spec

    @classmethod
    def parse(cls, raw: dict[str, str], base: TopicConfig | None = None, *, stored: bool = False) -> TopicConfig:
        """Validate string settings over ``base`` (defaults). ``InvalidConfig`` on any bad one.

        A number is plain ASCII decimal digits, with a leading ``-`` for a negative one
        (``-1``: no limit, where a key allows it).  ``stored``: settings a broker stored
        earlier, validated then: numbers stored before the rule above was enforced may be
        spelled as ``int()`` takes them (``1_000``, ``+5``, other scripts' digits), and they
        are read as they were.
        """
        changes = {}
        for key, value in raw.items():
            spec = cls.key(key)
            if spec.choices:
                if value not in spec.choices:
                    raise InvalidConfig(f"{key} must be one of {', '.join(spec.choices)}, got {value!r}")
                changes[spec.attr] = value
                continue
            text = str(value)
            try:
                if not (stored or _INTEGER.fullmatch(text)):
                    raise ValueError(text)
                n = int(text.strip())
            except ValueError:
                raise InvalidConfig(f"{key} must be an integer, got {value!r}") from None
            if n < spec.minimum or (spec.maximum is not None and n > spec.maximum):
                hi = f" and at most {spec.maximum}" if spec.maximum is not None else ""
                raise InvalidConfig(f"{key} must be at least {spec.minimum}{hi}, got {n}")
            changes[spec.attr] = n
        return dataclasses.replace(base or cls(), **changes)

    def to_strings(self) -> dict[str, str]:
        return {key: str(getattr(self, spec.attr)) for key, spec in self.KEYS.items()}

    @property
    def flush_policy(self) -> str:
        """Human summary: ``always``, ``every N messages``, ``every T ms``, or both."""
        if self.flush_messages == 1:
            return "always"
        parts = []
        if self.flush_messages > 1:
            parts.append(f"every {self.flush_messages} messages")
        if self.flush_ms > 0:
            parts.append(f"every {self.flush_ms} ms")
        return " or ".join(parts) or "never (page cache only)"

    @property
    def log_config(self) -> LogConfig:
        return LogConfig(
            segment_bytes=self.segment_bytes,
            segment_ms=self.segment_ms,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            index_interval_bytes=self.index_interval_bytes,
        )


@dataclass(frozen=True)
class ServerConfig:
    """Broker settings (``sluice serve`` options)."""

    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    port: int = 7400
    # what metadata tells clients to connect to (default: the bound address), for a
    # broker reached through NAT, a proxy or a container's published port
    advertised_host: str | None = None
    advertised_port: int | None = None
    node_id: int = 0
    max_frame_bytes: int = 64 * 1024 * 1024
    max_connections: int = 1024
    max_in_flight_per_connection: int = 256
    max_in_flight_bytes_per_connection: int = 256 * 1024 * 1024
    max_partitions: int = 4096  # every partition holds open files: bounded by the fd limit
    io_threads: int = 4
    # per partition: the newest written bytes of its active segment kept in memory, so a
    # consumer at the end of the log is answered without a disk read (storage/tail.py); 0: off
    tail_cache_bytes: int = 1024 * 1024
    retention_check_ms: int = 30_000
    # how often the high watermarks are checkpointed (replication-offset-checkpoint)
    hw_checkpoint_ms: int = 5_000
    topic_defaults: dict[str, str] = field(default_factory=dict)
    # etcd://host:port[,host:port...][/cluster]: metadata in etcd (cluster/etcd.py); None:
    # in the data directory (cluster/embedded.py)
    cluster: str | None = None
    session_timeout_ms: int = 6000  # a broker's registration outlives its last renewal this long
    # a follower that has not caught up with the leader's log end for this long leaves the ISR
    replica_lag_time_max_ms: int = 10_000
    # replicas of a new topic when the request does not say; 0: min(3, live brokers)
    default_replication_factor: int = 0
    # how often the controller moves leadership back to preferred replicas; 0: never
    leader_rebalance_interval_ms: int = 30_000
    # partitions of the internal topic __groups (committed offsets) when it is created;
    # an existing __groups keeps its count (groups are placed by it)
    groups_partitions: int = 8
    # transactional messages (broker/transactions/): a half message unresolved this long
    # is checked back with a producer of its group, at most every interval, at most
    # max checks times before it is rolled back and copied to __txn_discarded
    txn_check_timeout_ms: int = 6_000
    txn_check_interval_ms: int = 60_000
    txn_max_checks: int = 15

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}")
        if self.advertised_port is not None and not 1 <= self.advertised_port <= 65535:
            raise ConfigError(f"advertised port must be 1-65535, got {self.advertised_port}")
        if self.advertised_host is not None and (
            _unspecified(self.advertised_host) or not _HOST.fullmatch(self.advertised_host)
        ):
            raise ConfigError(
                f"--advertise {self.advertised_host!r} is no address a client can connect to: give a host "
                "name or IP address of this machine"
            )
        if self.max_frame_bytes < 1024:
            raise ConfigError("max_frame_bytes must be at least 1024")
        limits = (self.max_connections, self.max_in_flight_per_connection,
                  self.max_in_flight_bytes_per_connection, self.io_threads, self.max_partitions,
                  self.hw_checkpoint_ms, self.replica_lag_time_max_ms)
        if min(limits) < 1:
            raise ConfigError("connection, in-flight, thread and checkpoint settings must be ≥ 1")
        try:
            TopicConfig.parse(self.topic_defaults)
        except InvalidConfig as exc:
            raise ConfigError(f"bad topic default: {exc.message}") from exc
        if not 1 <= self.groups_partitions <= MAX_PARTITIONS:
            raise ConfigError(f"groups partitions must be 1-{MAX_PARTITIONS}, got {self.groups_partitions}")
        if min(self.txn_check_timeout_ms, self.txn_check_interval_ms) < 1 or self.txn_max_checks < 0:
            raise ConfigError("transaction check timeout and interval must be ≥ 1 ms, max checks ≥ 0")
        if self.default_replication_factor < 0 or self.leader_rebalance_interval_ms < 0:
            raise ConfigError("default replication factor and leader rebalance interval must be ≥ 0")
        if self.tail_cache_bytes < 0:
            raise ConfigError(f"tail cache bytes must be ≥ 0, got {self.tail_cache_bytes}")
        if self.cluster is not None:
            parse_cluster_url(self.cluster)
            session_ttl(self.session_timeout_ms)
            if _unspecified(self.host) and self.advertised_host is None:
                raise ConfigError(
                    f"listening on every address ({self.host or 'all'}), a broker of a cluster needs "
                    "--advertise HOST[:PORT]: the other brokers and the clients connect to the "
                    "address it advertises"
                )
