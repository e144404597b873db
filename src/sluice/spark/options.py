"""Options of the ``sluice`` Spark data source, parsed and checked once on the driver.

The read options follow Spark's Kafka source: ``bootstrap``; exactly one of ``topic``,
``topics`` (comma-separated) or ``topicPattern`` (a regular expression matching whole topic
names); ``startingOffsets`` / ``endingOffsets`` (``earliest``, ``latest`` or JSON such as
``{"orders": {"0": 42, "1": -2}}`` where -2 means earliest and -1 latest);
``startingTimestamp`` / ``endingTimestamp`` (ms since the epoch; they win over the offset
options); ``maxOffsetsPerTrigger``; ``minPartitions``; ``includeHeaders``;
``failOnDataLoss``.  Spark hands options over case-insensitively, so keys are compared in
lower case.  Any problem is a ``ConfigError`` naming the option.

Pure: no Spark, no network.  The parsed options are frozen dataclasses, picklable, and ride
along to the executors inside input partitions and writers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.errors import ConfigError

__all__ = ["EARLIEST", "LATEST", "ReadOptions", "WriteOptions", "OffsetSpec"]

EARLIEST = -2
LATEST = -1

# Canonical spellings, for messages (Spark hands keys over in any case).
_NAMES = {
    n.lower(): n
    for n in (
        "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
        "maxOffsetsPerTrigger", "minPartitions", "includeHeaders", "failOnDataLoss",
        "topicPattern", "lingerMs", "batchSize",
    )
}  # fmt: skip


def _n(name: str) -> str:
    return _NAMES.get(name, name)


# Options Spark itself may add to those the user gave.
_SPARK_OWN = {"path", "checkpointlocation", "queryname"}

# What a read is positioned by, at one end of the range: "earliest" / "latest" for every
# partition, {topic: {partition: offset}} (offsets may be EARLIEST / LATEST), or a time.
OffsetSpec = str | dict[str, dict[int, int]] | int


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    topics: tuple[str, ...] = ()  # fixed topics (``topic`` or ``topics``)
    pattern: str | None = None  # or a pattern (``topicPattern``)
    starting: OffsetSpec | None = None  # None: the mode's default
    ending: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = _lower(options)
        _reject_unknown(
            opts,
            {
                "bootstrap", "topic", "topics", "topicpattern", "startingoffsets",
                "endingoffsets", "startingtimestamp", "endingtimestamp",
                "maxoffsetspertrigger", "minpartitions", "includeheaders", "failondataloss",
            },
        )  # fmt: skip
        chosen = [k for k in ("topic", "topics", "topicpattern") if k in opts]
        if len(chosen) != 1:
            raise ConfigError("give exactly one of the options topic, topics, topicPattern")
        topics: tuple[str, ...] = ()
        pattern = None
        if "topicpattern" in opts:
            pattern = opts["topicpattern"]
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"topicPattern is not a regular expression: {exc}") from None
        else:
            raw = opts.get("topic") if "topic" in opts else opts["topics"]
            names = [t.strip() for t in raw.split(",")] if "topics" in opts else [raw.strip()]
            if not all(names):
                raise ConfigError(f"empty topic name in {raw!r}")
            topics = tuple(dict.fromkeys(names))
        starting = _offsets(opts, "startingoffsets", allow_earliest=True)
        if "startingtimestamp" in opts:
            starting = _timestamp(opts, "startingtimestamp")
        ending = _offsets(opts, "endingoffsets", allow_earliest=False) or "latest"
        if "endingtimestamp" in opts:
            ending = _timestamp(opts, "endingtimestamp")
        return cls(
            bootstrap=_bootstrap(opts),
            topics=topics,
            pattern=pattern,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=_positive_int(opts, "maxoffsetspertrigger"),
            min_partitions=_positive_int(opts, "minpartitions"),
            include_headers=_bool(opts, "includeheaders", False),
            fail_on_data_loss=_bool(opts, "failondataloss", True),
        )

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one this read covers."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics


@dataclass(frozen=True)
class WriteOptions:
    """``bootstrap``; ``topic``, the topic of every row (else each row's ``topic`` column);
    ``exactlyOnce`` (default true: see spark/sink.py); and the producer settings ``acks``,
    ``compression``, ``lingerMs`` (at-least-once only), ``batchSize``."""

    bootstrap: str
    topic: str | None = None
    acks: str = "all"
    compression: str = "none"
    linger_ms: int = 5
    batch_size: int = 262144
    exactly_once: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = _lower(options)
        _reject_unknown(opts, {"bootstrap", "topic", "acks", "compression", "lingerms", "batchsize", "exactlyonce"})
        topic = opts.get("topic")
        if topic is not None and not topic.strip():
            raise ConfigError("topic must not be empty")
        parsed = cls(
            bootstrap=_bootstrap(opts),
            topic=topic.strip() if topic else None,
            acks=opts.get("acks", "all"),
            compression=opts.get("compression", "none"),
            linger_ms=_int(opts, "lingerms", 5, minimum=0),
            batch_size=_int(opts, "batchsize", 262144, minimum=1),
            exactly_once=_bool(opts, "exactlyonce", True),
        )
        from sluice.client.producer import Producer

        Producer(parsed.bootstrap, **parsed.producer_config())  # checks the settings; no I/O
        return parsed

    def producer_config(self) -> dict:
        return {
            "acks": self.acks,
            "compression": self.compression,
            "linger_ms": self.linger_ms,
            "batch_size": self.batch_size,
        }


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _reject_unknown(opts: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(set(opts) - known - _SPARK_OWN)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} for format 'sluice'")


def _bootstrap(opts: Mapping[str, str]) -> str:
    value = opts.get("bootstrap", "").strip()
    if not value:
        raise ConfigError("option bootstrap (host:port[,host:port...]) is required")
    return value


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    if name not in opts:
        return default
    try:
        value = int(opts[name])
    except ValueError:
        raise ConfigError(f"{_n(name)} must be an integer, got {opts[name]!r}") from None
    if value < minimum:
        raise ConfigError(f"{_n(name)} must be >= {minimum}, got {value}")
    return value


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    return _int(opts, name, 0, 1) if name in opts else None


def _timestamp(opts: Mapping[str, str], name: str) -> int:
    return _int(opts, name, 0, 0)


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    value = opts.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{_n(name)} must be true or false, got {value!r}")


def _offsets(opts: Mapping[str, str], name: str, allow_earliest: bool) -> OffsetSpec | None:
    raw = opts.get(name)
    if raw is None:
        return None
    word = raw.strip().lower()
    if word == "latest" or (word == "earliest" and allow_earliest):
        return word
    try:
        spec = json.loads(raw)
    except ValueError:
        allowed = "earliest, latest" if allow_earliest else "latest"
        raise ConfigError(f"{_n(name)} must be {allowed} or JSON per partition, got {raw!r}") from None
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise ConfigError(f'{_n(name)} JSON must look like {{"topic": {{"0": 42}}}}, got {raw!r}')
    out: dict[str, dict[int, int]] = {}
    for topic, parts in spec.items():
        out[topic] = {}
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise ConfigError(f"{_n(name)}: partition {p!r} of {topic!r} is not a number") from None
            low = EARLIEST if allow_earliest else LATEST
            if not isinstance(off, int) or isinstance(off, bool) or off < low:
                raise ConfigError(f"{_n(name)}: bad offset {off!r} for {topic}/{partition}")
            out[topic][partition] = off
    return out
