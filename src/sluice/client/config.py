"""The clients' settings as data: one frozen dataclass per client, validated once.

``ProducerConfig`` and ``ConsumerConfig`` hold every setting of ``Producer`` and
``Consumer`` (times in milliseconds, as the keyword arguments spell them) and raise
``ConfigError`` naming the setting when one is out of range; the clients take one (or the
same keyword arguments, which build one) and never check a setting again.  The command line
takes its defaults and choices from here (``ACKS``, ``ProducerConfig().acks`` …), so no
default is written twice.

What is not a setting stays a client argument: the bootstrap addresses and the
``connection_factory`` (a transport to inject, not data).  Settings in seconds for the
event loop's clocks are the ``*_s`` properties.

Pure data and checks: no I/O, nothing asyncio.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from sluice import errors
from sluice.client.sequences import MAX_IN_FLIGHT_BATCHES, check_identity
from sluice.protocol import messages, records
from sluice.protocol.compression import COMPRESSION_CODES
from sluice.protocol.subscriptions import SubscriptionConfig, check_config

__all__ = [
    "ACKS", "OFFSET_RESETS", "ConsumerConfig", "ProducerConfig", "SubscriberConfig", "TransactionProducerConfig",
    "position",
]

# acks setting -> its wire code
ACKS = {"none": messages.ACKS_NONE, "leader": messages.ACKS_LEADER, "all": messages.ACKS_ALL}
OFFSET_RESETS = ("earliest", "latest", "error")


def _number(name: str, value, minimum: float = 1) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum:
        raise errors.ConfigError(f"{name} must be a number >= {minimum}, got {value!r}")


def _options(cls, config, options: dict):
    """``config`` (or the defaults) with ``options`` (keyword arguments of a client) over it:
    one validated ``cls``.  ``TypeError`` for a keyword that is no setting."""
    if config is None:
        return cls(**options)
    if not isinstance(config, cls):
        raise errors.ConfigError(f"config must be a {cls.__name__}, got {type(config).__name__}")
    return dataclasses.replace(config, **options) if options else config


@dataclass(frozen=True)
class ProducerConfig:
    """Every ``Producer`` setting (client/producer.py's docstring says how the batching
    ones, ``batch_size``, ``linger_ms``, ``buffer_memory`` …, work together).

    ``acks``: ``"all"`` (the default, as Kafka's since 3.0): a send is acknowledged
    once every in-sync replica has it (the partition's high watermark passed it);
    ``"leader"``: once the leader appended it; ``"none"``: not at all.  With one broker
    ``"all"`` and ``"leader"`` answer at the same moment.

    ``metadata_max_age_ms``: how often metadata of the topics sent to is refreshed,
    which picks up new partitions and changed size limits.

    ``enable_idempotence``: on unless ``acks="none"`` (which cannot be idempotent: the
    producer would never hear of a gap).  Off, batches carry no producer id, a retry
    after a lost answer may store a batch twice, and a partition has one request in
    flight.  ``max_in_flight_per_partition``: with idempotence, how many of a
    partition's batches may be in flight at once (1 to 5, default 5); without, only 1.

    ``producer_id`` and ``producer_epoch`` (both or neither; implies idempotence): an
    identity the caller derives itself, ``producer_id`` in [2**62, 2**63) (brokers hand
    out ids below), ``producer_epoch`` in 0..32767.  A batch of an older epoch of that id
    than one a partition stored fails with ``ProducerFenced``, and so does every later
    send of this producer.  Such a producer never renumbers: after a batch of it failed
    for good, later sends to that partition fail with ``OutOfOrderSequence``.

    ``refused_partition_avoid_ms``: how long records without a key or partition avoid a
    partition that refused a send (too few in-sync replicas, no leader, a leader that
    does not answer; client/partitioning.py); 0: they never avoid one.

    ``enable_idempotence`` and ``max_in_flight_per_partition`` may be left None: their
    effective values are ``idempotent`` and ``in_flight_per_partition``.
    """

    acks: str = "all"
    batch_size: int = 262144
    linger_ms: float = 5
    buffer_memory: int = 64 * 1024 * 1024
    max_block_ms: float = 60000
    unknown_topic_wait_ms: float = 1000
    compression: str = "none"
    max_in_flight: int = 16
    retries: int | None = None
    retry_backoff_ms: float = 100
    retry_backoff_max_ms: float = 1000
    delivery_timeout_ms: float = 120000
    request_timeout_ms: float = 30000
    max_request_size: int = 16 * 1024 * 1024
    partitioner: Callable[[bytes | None, int], int] | None = None
    connect_timeout_ms: float = 10000
    metadata_max_age_ms: float = 30000
    enable_idempotence: bool | None = None
    max_in_flight_per_partition: int | None = None
    producer_id: int | None = None
    producer_epoch: int | None = None
    refused_partition_avoid_ms: float = 5000

    @classmethod
    def of(cls, config: ProducerConfig | None = None, **options) -> ProducerConfig:
        """``config`` (default: the defaults) with ``options`` over it, validated."""
        return _options(cls, config, options)

    def __post_init__(self) -> None:
        if self.acks not in ACKS:
            raise errors.ConfigError(f"acks must be one of {sorted(ACKS)}, got {self.acks!r}")
        if self.compression not in COMPRESSION_CODES:
            raise errors.ConfigError(
                f"compression must be one of {sorted(COMPRESSION_CODES)}, got {self.compression!r}"
            )
        _number("batch_size", self.batch_size, records.HEADER_SIZE + 1)
        _number("linger_ms", self.linger_ms, 0)
        _number("buffer_memory", self.buffer_memory, 1)
        _number("max_block_ms", self.max_block_ms, 0)
        _number("unknown_topic_wait_ms", self.unknown_topic_wait_ms, 0)
        _number("max_in_flight", self.max_in_flight, 1)
        if self.retries is not None:
            _number("retries", self.retries, 0)
        _number("retry_backoff_ms", self.retry_backoff_ms, 0)
        _number("retry_backoff_max_ms", self.retry_backoff_max_ms, 0)
        _number("delivery_timeout_ms", self.delivery_timeout_ms, 1)
        _number("request_timeout_ms", self.request_timeout_ms, 1)
        _number("max_request_size", self.max_request_size, records.HEADER_SIZE + 1)
        _number("connect_timeout_ms", self.connect_timeout_ms, 1)
        _number("metadata_max_age_ms", self.metadata_max_age_ms, 1)
        _number("refused_partition_avoid_ms", self.refused_partition_avoid_ms, 0)
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise errors.ConfigError("retry_backoff_max_ms must be >= retry_backoff_ms")
        if self.batch_size > self.buffer_memory:
            raise errors.ConfigError("batch_size must not exceed buffer_memory")
        if self.partitioner is not None and not callable(self.partitioner):
            raise errors.ConfigError("partitioner must be a callable (key, partitions) -> int")
        if (self.producer_id is None) != (self.producer_epoch is None):
            raise errors.ConfigError("producer_id and producer_epoch go together")
        if self.producer_id is not None:
            check_identity(self.producer_id, self.producer_epoch)
        if self.enable_idempotence is not None and not isinstance(self.enable_idempotence, bool):
            raise errors.ConfigError(f"enable_idempotence must be a bool, got {self.enable_idempotence!r}")
        idempotent = self.idempotent
        if idempotent and self.acks == "none":
            raise errors.ConfigError('enable_idempotence needs acks="leader" or "all", not "none"')
        if self.producer_id is not None and not idempotent:
            raise errors.ConfigError("producer_id needs enable_idempotence")
        top = MAX_IN_FLIGHT_BATCHES if idempotent else 1
        n = self.in_flight_per_partition
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= top:
            raise errors.ConfigError(
                f"max_in_flight_per_partition must be an int in 1..{top}"
                f"{'' if idempotent else ' without idempotence'}, got {n!r}"
            )

    @property
    def idempotent(self) -> bool:
        """``enable_idempotence``, which defaults to on unless ``acks="none"``."""
        return self.acks != "none" if self.enable_idempotence is None else self.enable_idempotence

    @property
    def in_flight_per_partition(self) -> int:
        """``max_in_flight_per_partition``, which defaults to 5 with idempotence, else 1."""
        if self.max_in_flight_per_partition is not None:
            return self.max_in_flight_per_partition
        return MAX_IN_FLIGHT_BATCHES if self.idempotent else 1

    @property
    def acks_code(self) -> int:
        return ACKS[self.acks]

    @property
    def codec(self) -> int:
        return COMPRESSION_CODES[self.compression]

    @property
    def identity(self) -> tuple[int, int] | None:
        """``(producer_id, producer_epoch)`` when given, else None."""
        return None if self.producer_id is None else (self.producer_id, self.producer_epoch)


@dataclass(frozen=True)
class ConsumerConfig:
    """Every ``Consumer`` setting (client/consumer.py's docstring says how fetching and
    commits work).

    ``metadata_max_age_ms``: how often metadata is refreshed, which picks up new
    partitions of subscribed topics.  ``retry_timeout_ms``: how long retriable errors
    (a broker restarting, a lost connection) are retried before they surface;
    ``unknown_topic_wait_ms``: how long an assigned partition that does not exist is
    asked about again before it is an error.
    """

    group: str | None = None
    auto_offset_reset: str = "earliest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: float = 5000
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 8 * 1024 * 1024
    check_crcs: bool = True
    request_timeout_ms: float = 30000
    connect_timeout_ms: float = 10000
    retry_timeout_ms: float = 60000
    metadata_max_age_ms: float = 30000
    unknown_topic_wait_ms: float = 1000

    @classmethod
    def of(cls, config: ConsumerConfig | None = None, **options) -> ConsumerConfig:
        """``config`` (default: the defaults) with ``options`` over it, validated."""
        return _options(cls, config, options)

    def __post_init__(self) -> None:
        if self.auto_offset_reset not in OFFSET_RESETS:
            raise errors.ConfigError(
                f"auto_offset_reset must be one of {OFFSET_RESETS}, got {self.auto_offset_reset!r}"
            )
        if self.group is not None and (not isinstance(self.group, str) or not self.group):
            raise errors.ConfigError("group must be a non-empty string or None")
        for name, low in (
            ("auto_commit_interval_ms", 1),
            ("fetch_max_wait_ms", 0),
            ("fetch_min_bytes", 0),
            ("fetch_max_bytes", 1),
            ("max_partition_fetch_bytes", 1),
            ("request_timeout_ms", 1),
            ("retry_timeout_ms", 0),
            ("metadata_max_age_ms", 1),
            ("unknown_topic_wait_ms", 0),
        ):
            _number(name, getattr(self, name), low)
        if self.request_timeout_ms <= self.fetch_max_wait_ms:
            raise errors.ConfigError("request_timeout_ms must exceed fetch_max_wait_ms")


def position(start: str | int) -> messages.Position:
    """``earliest`` / ``latest`` / an offset (int) / ``time:<ms since the epoch>``."""
    if isinstance(start, int):
        return messages.Position(kind="offset", value=start)
    if start in ("earliest", "latest"):
        return messages.Position(kind=start)
    if isinstance(start, str) and start.startswith("time:"):
        try:
            return messages.Position(kind="time", value=int(start[5:]))
        except ValueError:
            pass
    raise errors.ConfigError(f"start must be 'earliest', 'latest', an offset or 'time:<ms>', not {start!r}")


# SubscriberConfig's settings of the subscription itself, each over ``config``'s field
_SUBSCRIPTION_FIELDS = ("mode", "max_attempts", "ack_timeout_ms", "backoff_initial_ms", "backoff_max_ms", "tags")


@dataclass(frozen=True)
class SubscriberConfig:
    """Every ``Subscriber`` setting; client/subscriber.py's ``Subscriber`` says what each
    does.  ``config`` (a ``SubscriptionConfig``: the settings a subscription is created
    with) and the fields ``mode`` … ``tags`` (None: not given; each one given overrides
    ``config``'s) make ``subscription``, the settings asked for.
    """

    prefetch: int = 1000
    create: bool = True
    start: str | int = "earliest"
    config: SubscriptionConfig | None = None
    mode: str | None = None
    max_attempts: int | None = None
    ack_timeout_ms: int | None = None
    backoff_initial_ms: int | None = None
    backoff_max_ms: int | None = None
    tags: Sequence[str] | None = None
    ack_interval_ms: float = 5
    request_timeout_ms: float = 30000
    connect_timeout_ms: float = 10000
    unknown_topic_wait_ms: float = 1000

    @classmethod
    def of(cls, settings: SubscriberConfig | None = None, **options) -> SubscriberConfig:
        """``settings`` (default: the defaults) with ``options`` over it, validated."""
        return _options(cls, settings, options)

    def __post_init__(self) -> None:
        if self.prefetch < 1:
            raise errors.ConfigError("prefetch must be ≥ 1")
        try:
            check_config(self.subscription)
        except errors.InvalidSubscription as exc:
            raise errors.ConfigError(exc.message) from None
        position(self.start)

    @property
    def overrides(self) -> dict:
        """The subscription settings given one by one (``mode`` … ``tags``)."""
        given = {name: getattr(self, name) for name in _SUBSCRIPTION_FIELDS if getattr(self, name) is not None}
        if "tags" in given:
            given["tags"] = list(given["tags"])
        return given

    @property
    def subscription(self) -> SubscriptionConfig:
        """The subscription's settings asked for: ``config`` (or the defaults) with the
        ones given one by one over it."""
        overrides = self.overrides
        cfg = self.config or SubscriptionConfig()
        return msgspec.structs.replace(cfg, **overrides) if overrides else cfg

    @property
    def asked(self) -> tuple[str, ...]:
        """The names of the subscription settings asked for: all of ``config``'s when it
        is given, else those given one by one."""
        return SubscriptionConfig.__struct_fields__ if self.config is not None else tuple(self.overrides)


@dataclass(frozen=True)
class TransactionProducerConfig:
    """Every ``TransactionProducer`` setting (client/transaction.py): ``group``, the
    producer group the brokers check unresolved half messages back with;
    ``check_local_transaction``, the application's check (a callable, or None: this
    producer answers no check-backs); how long a request, a connection and retries of
    retriable errors may take; how often the producer registers with the brokers of its
    group's half messages."""

    group: str
    check_local_transaction: Callable | None = None
    request_timeout_ms: float = 30000
    connect_timeout_ms: float = 10000
    retry_timeout_ms: float = 30000
    register_interval_ms: float = 1000

    @classmethod
    def of(cls, config: TransactionProducerConfig | None = None, **options) -> TransactionProducerConfig:
        """``config`` with ``options`` over it (or ``options`` alone), validated."""
        return _options(cls, config, options)

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group:
            raise errors.ConfigError("group must be a non-empty string")
        if self.check_local_transaction is not None and not callable(self.check_local_transaction):
            raise errors.ConfigError("check_local_transaction must be callable")
        for name in ("request_timeout_ms", "connect_timeout_ms", "retry_timeout_ms", "register_interval_ms"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise errors.ConfigError(f"{name} must be a number > 0, got {value!r}")
