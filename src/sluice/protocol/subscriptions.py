"""Subscriptions on the wire and in the log: names, settings, cursor records, dead letters.

Sans-I/O, shared by the broker (broker/subscriptions/) and the client
(client/subscriber.py).

A subscription is a named, durable cursor over one topic.  Its state on a partition —
settings, the confirmed offset (everything below it is acked), the acked ranges above it
and its counters — is kept **in that partition's own log**, as control batches the
partition's leader appends (attribute bit 5, never shown to readers, like a transaction's
rollback marker).  Replicating the partition replicates its subscriptions; a new leader
rebuilds them by reading its log.  Each record is a whole state but for its pending
redeliveries, so the last record of a subscription wins for everything else (``fold``):

=====================  ==================================================================
record key             value
=====================  ==================================================================
``sluice.sub:<name>``  msgpack ``CursorState`` (``deleted`` set: the subscription is gone)
``sluice.sub.snap``    empty; first in a batch that holds the state of *every*
                       subscription of the partition (a snapshot): reading the log from
                       the newest snapshot on gives the whole state
=====================  ==================================================================

Pending redeliveries (retries: offset ranges, the deliveries so far, when due) are
journaled: a record with ``full`` set (a snapshot's, a creation's, a seek's) holds all of
them; the others only those scheduled since the record before, which override earlier
entries for the same offsets.  Entries for offsets settled since are dropped by whoever
reads them (``fold`` keeps them; the cursor tells).  So every pending retry is on disk,
and the log does not rewrite them all each time an ack is written down.

The leader writes a snapshot into each new segment, so retention, which never deletes
the newest segment, never deletes the last state of a subscription, and a load reads
only from the newest snapshot on.

A dead letter is a copy of the message in the ordinary topic ``<topic>.<subscription>.dlq``
with the ``DLQ_*`` headers below; re-driving copies it back without them — only the copies
whose headers name the subscription, since two pairs can join into one name (``col`` +
``x.y``, ``col.x`` + ``y``; ``dlq_sharers``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

import msgspec

from sluice.errors import InvalidSubscription
from sluice.protocol.ranges import RangeSet
from sluice.protocol.records import CONTROL_BIT, Record, build_batch, encode_record

STATE_PREFIX = b"sluice.sub:"
SNAPSHOT_KEY = b"sluice.sub.snap"

DLQ_SUFFIX = ".dlq"
DLQ_TOPIC = "sluice.dlq.topic"
DLQ_PARTITION = "sluice.dlq.partition"
DLQ_OFFSET = "sluice.dlq.offset"
DLQ_SUBSCRIPTION = "sluice.dlq.subscription"
DLQ_ATTEMPTS = "sluice.dlq.attempts"
DLQ_REASON = "sluice.dlq.reason"
DLQ_HEADERS = frozenset({DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET, DLQ_SUBSCRIPTION, DLQ_ATTEMPTS, DLQ_REASON})

MODES = ("unordered", "ordered", "key-ordered")
Mode = Literal["unordered", "ordered", "key-ordered"]
TAG_HEADER = "sluice.tag"  # a message's tag, for subscriptions' tag filters
MAX_TAGS = 100
MAX_TAG_CHARS = 100

_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")  # fullmatch: "$" would let a final newline in
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_MS = 24 * 3600 * 1000
MAX_TOPIC_NAME = 249  # config.check_topic_name's limit, which dead-letter topics obey too


class SubscriptionConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How a subscription delivers.

    ``mode``: ``unordered`` (any number of a partition's messages in flight at once),
    ``ordered`` (a partition's next message only after the previous one is acked: one
    delivery in flight per partition, redelivered in place when it fails) or
    ``key-ordered`` (one message per key in flight: a key's next message only after the
    previous one is settled; a failing message holds back only its own key while it
    backs off, and after ``max_attempts`` it is dead-lettered and its key goes on).
    ``tags``: deliver only messages whose ``sluice.tag`` header is one of these (none:
    every message); the others count as acked.
    ``max_attempts``: deliveries of a message before it is dead-lettered (0: never).
    ``ack_timeout_ms``: how long a delivery may stay unacked before it is redelivered.
    Backoff: the n-th redelivery after a failure (nack without a delay, or a timeout) waits
    ``min(backoff_initial_ms * backoff_multiplier ** (n - 1), backoff_max_ms)``.
    """

    mode: Mode = "unordered"
    max_attempts: int = 0
    ack_timeout_ms: int = 30_000
    backoff_initial_ms: int = 1_000
    backoff_multiplier: float = 2.0
    backoff_max_ms: int = 60_000
    tags: list[str] = []

    def backoff_ms(self, attempt: int) -> int:
        """The wait before redelivering a message whose delivery ``attempt`` failed."""
        if attempt < 1:
            return 0
        try:
            wait = self.backoff_initial_ms * self.backoff_multiplier ** (attempt - 1)
        except OverflowError:
            return self.backoff_max_ms
        return int(min(wait, self.backoff_max_ms))


def check_config(config: SubscriptionConfig) -> SubscriptionConfig:
    """``config`` if every setting is in range; ``InvalidSubscription`` saying which is not."""
    if config.mode not in MODES:
        raise InvalidSubscription(f"mode must be one of {', '.join(MODES)}, not {config.mode!r}")
    if not 0 <= config.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidSubscription(f"max_attempts must be 0-{MAX_ATTEMPTS_LIMIT} (0: never dead-letter)")
    for name in ("ack_timeout_ms", "backoff_max_ms"):
        if not 1 <= getattr(config, name) <= MAX_TIMEOUT_MS:
            raise InvalidSubscription(f"{name} must be 1-{MAX_TIMEOUT_MS}")
    if not 0 <= config.backoff_initial_ms <= MAX_TIMEOUT_MS:
        raise InvalidSubscription(f"backoff_initial_ms must be 0-{MAX_TIMEOUT_MS}")
    if not 1.0 <= config.backoff_multiplier <= 100.0:
        raise InvalidSubscription("backoff_multiplier must be 1-100")
    if config.backoff_initial_ms > config.backoff_max_ms:
        raise InvalidSubscription(
            f"backoff_initial_ms ({config.backoff_initial_ms}) is above backoff_max_ms "
            f"({config.backoff_max_ms}): the first wait would be cut to the longest"
        )
    if len(config.tags) > MAX_TAGS or not all(map(tag_ok, config.tags)):
        raise InvalidSubscription(f"tags: at most {MAX_TAGS}, each 1-{MAX_TAG_CHARS} characters")
    return config


def config_differences(
    asked: SubscriptionConfig, existing: Iterable[SubscriptionConfig], only: Iterable[str] | None = None,
) -> str:
    """The settings of ``asked`` (those named in ``only``, when given) that an ``existing``
    config (a subscription's, one per partition) has otherwise, as ``name X (asked Y)``,
    comma-separated; "" when none differ.  Settings are fixed at creation: this says which
    a creation that found the subscription did not apply."""
    names = asked.__struct_fields__ if only is None else [n for n in asked.__struct_fields__ if n in set(only)]
    out = []
    for name in names:
        want = getattr(asked, name)
        have = sorted({_shown(getattr(c, name)) for c in existing if getattr(c, name) != want})
        if have:
            out.append(f"{name} {' / '.join(have)} (asked {_shown(want)})")
    return ", ".join(out)


def _shown(value) -> str:
    return (",".join(value) or "none") if isinstance(value, list) else str(value)


def tag_of(headers) -> str | None:
    """A record's tag (its ``sluice.tag`` header as text), or None."""
    for k, v in headers:
        if k == TAG_HEADER and v is not None:
            return v.decode(errors="replace")
    return None


def tag_ok(tag) -> bool:
    """A tag a subscription may filter on, and a message may carry: 1-100 characters."""
    return isinstance(tag, str) and 1 <= len(tag) <= MAX_TAG_CHARS


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidSubscription(f"invalid subscription name {name!r}: use 1-100 characters from A-Z a-z 0-9 . _ -")
    return name


def dlq_topic(topic: str, subscription: str) -> str:
    """The dead-letter topic of ``subscription`` of ``topic``: ``<topic>.<subscription>.dlq``."""
    return f"{topic}.{subscription}{DLQ_SUFFIX}"


def check_dlq_topic(topic: str, subscription: str) -> str:
    """The dead-letter topic name of a new subscription; ``InvalidSubscription`` if it
    would be longer than a topic name may be (dead letters could never be written)."""
    name = dlq_topic(topic, subscription)
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidSubscription(
            f"subscription {subscription!r} of topic {topic!r}: its dead-letter topic name would be "
            f"{len(name)} characters, too long (at most {MAX_TOPIC_NAME}); use a shorter subscription name"
        )
    return name


def dlq_sharers(topic: str, subscription: str) -> list[tuple[str, str]]:
    """The other (topic, subscription) pairs whose dead-letter topic is that of
    ``subscription`` of ``topic``: the same ``<topic>.<subscription>`` split at another
    dot (``col`` + ``x.y`` and ``col.x`` + ``y``), with a legal subscription name."""
    joined = f"{topic}.{subscription}"
    return [
        (joined[:i], joined[i + 1:]) for i, ch in enumerate(joined)
        if ch == "." and i not in (0, len(topic)) and _NAME.fullmatch(joined[i + 1:])
    ]


class CursorState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The durable state of one subscription on one partition (one log record)."""

    name: str
    config: SubscriptionConfig = SubscriptionConfig()
    confirmed: int = 0  # every offset below is acked (or was skipped: hidden, or expired)
    acked: list[tuple[int, int]] = []  # acked ranges [start, end) above ``confirmed``
    # pending redeliveries: (start, end, deliveries so far, due ms since the epoch) — all
    # of them with ``full``, else those scheduled since the subscription's record before
    retries: list[tuple[int, int, int, int]] = []
    full: bool = True
    dead_lettered: int = 0  # messages copied to the dead-letter topic, ever
    expired: int = 0  # messages retention deleted before they were acked, ever
    created_ms: int = 0
    deleted: bool = False


_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(CursorState)


def cursor_batch(states: Iterable[CursorState], now_ms: int, snapshot: bool = False) -> bytes:
    """The control batch recording ``states`` (every subscription's, with ``snapshot``)."""
    bodies = []
    if snapshot:
        bodies.append((SNAPSHOT_KEY, b""))
    bodies.extend((STATE_PREFIX + s.name.encode(), _encoder.encode(s)) for s in states)
    body = b"".join(encode_record(i, 0, k, v, []) for i, (k, v) in enumerate(bodies))
    return build_batch(body, len(bodies), now_ms, now_ms, flags=CONTROL_BIT)


def read_cursor_records(records: list[Record]) -> tuple[bool, list[CursorState]] | None:
    """(is a snapshot, states) of a control batch's records; None if the batch is not a
    subscription batch (a transaction's rollback marker, say).  Undecodable states are
    skipped."""
    if not records or records[0].key is None:
        return None
    first = records[0].key
    if first != SNAPSHOT_KEY and not first.startswith(STATE_PREFIX):
        return None
    states = []
    for r in records:
        if r.key is not None and r.key.startswith(STATE_PREFIX) and r.value is not None:
            try:
                states.append(_state_decoder.decode(r.value))
            except msgspec.DecodeError:
                continue
    return first == SNAPSHOT_KEY, states


def fold(batches: Iterable[tuple[bool, list[CursorState]]]) -> dict[str, CursorState]:
    """Every subscription's state after the subscription batches ``batches`` (``(is a
    snapshot, states)`` in log order, as ``read_cursor_records`` returns them): the last
    record of each, with ``retries`` the journal folded — a ``full`` record starts it
    again, later entries override earlier ones for the same offsets — and ``full`` set.
    A snapshot forgets the subscriptions it does not hold; a ``deleted`` record, its own."""
    states: dict[str, CursorState] = {}
    journals: dict[str, list[list[tuple[int, int, int, int]]]] = {}
    for snapshot, found in batches:
        if snapshot:
            states, journals = {}, {}
        for s in found:
            if s.deleted:
                states.pop(s.name, None)
                journals.pop(s.name, None)
                continue
            states[s.name] = s
            if s.full or s.name not in journals:
                journals[s.name] = [s.retries]
            elif s.retries:
                journals[s.name].append(s.retries)
    return {
        name: msgspec.structs.replace(s, retries=_newest_first(journals[name]), full=True)
        for name, s in states.items()
    }


def _newest_first(chunks: list[list[tuple[int, int, int, int]]]) -> list[tuple[int, int, int, int]]:
    """The journal's entries with those overridden by later ones cut out, soonest due first."""
    covered = RangeSet()
    out = []
    for chunk in reversed(chunks):
        for a, b, attempt, due in reversed(chunk):
            out.extend((x, y, attempt, due) for x, y in covered.missing(a, b))
            covered.add(a, b)
    out.sort(key=lambda e: (e[3], e[0]))
    return out
