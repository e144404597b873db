"""The subscription APIs' structs (registered in messages.py, which re-exports them).

A subscription is served by the leader of each of its topic's partitions: requests name
the partitions, and a client sends each partition's part to its leader
(protocol/subscriptions.py has the state and its records, broker/subscriptions/ the
server side).  Offset ranges are half-open [start, end) pairs.
"""

from __future__ import annotations

from sluice.protocol.structs import Response, Struct
from sluice.protocol.subscriptions import SubscriptionConfig

Pairs = list[tuple[int, int]]


class Position(Struct):
    """Where a cursor starts or is moved to: ``earliest``, ``latest``, ``offset`` (``value``
    an offset, clamped to the log) or ``time`` (``value`` ms since the epoch: the first
    message stored at or after it)."""

    kind: str = "earliest"
    value: int = 0


class SubscriptionPartitionResult(Struct):
    partition: int
    error: int = 0
    message: str = ""
    config: SubscriptionConfig | None = None  # as the partition has it (SUBSCRIBE)
    offset: int = -1  # where the cursor is now (SEEK: the position asked for, within the log)
    created: bool = False  # SUBSCRIBE: the subscription was missing and was created now


class SubscribeRequest(Struct):
    """Attach this connection as a consumer of ``subscription`` on ``partitions``: the
    leader pushes DELIVER frames while fewer than ``prefetch`` delivered messages are
    unsettled (not acked, nacked or released) on the connection.  With ``create``, a
    partition without the subscription creates it from ``start``.  The connection leaving
    hands its unsettled messages back for redelivery at once."""

    topic: str
    subscription: str
    partitions: list[int]
    prefetch: int = 1000
    create: SubscriptionConfig | None = None
    start: Position = Position()


class SubscribeResponse(Response):
    partitions: list[SubscriptionPartitionResult] = []


class AckPartition(Struct):
    """What a consumer settles on one partition.  ``acks``: done with.  ``nacks``: failed;
    redelivered after ``nack_delay_ms`` (-1: the subscription's backoff).  ``touches``:
    still working, the ack deadline starts again.  ``releases``: handed back unprocessed
    (a consumer shutting down): redelivered at once, the attempt not counted, and to other
    consumers only (the releasing connection is given nothing more of the subscription).
    An ack counts for any stored offset (a new leader takes the acks of what the old one
    delivered); nacks, touches and releases only for what this leader delivered and is
    not settled.  Offsets settled already are ignored."""

    partition: int
    acks: Pairs = []
    nacks: Pairs = []
    nack_delay_ms: int = -1
    touches: Pairs = []
    releases: Pairs = []
    reason: str = ""  # why the nacks failed (kept in a dead letter's headers)


class AckRequest(Struct):
    topic: str
    subscription: str
    partitions: list[AckPartition]


class AckResponse(Response):
    partitions: list[SubscriptionPartitionResult] = []


class CreateSubscriptionRequest(Struct):
    topic: str
    subscription: str
    partitions: list[int]
    config: SubscriptionConfig = SubscriptionConfig()
    start: Position = Position()
    if_not_exists: bool = False


class CreateSubscriptionResponse(Response):
    partitions: list[SubscriptionPartitionResult] = []


class DeleteSubscriptionRequest(Struct):
    topic: str
    subscription: str
    partitions: list[int]


class DeleteSubscriptionResponse(Response):
    partitions: list[SubscriptionPartitionResult] = []


class SeekSubscriptionRequest(Struct):
    """Move the cursor: everything from ``position`` on is delivered again (or skipped,
    moving forward); acked ranges, retries and what is in flight are forgotten."""

    topic: str
    subscription: str
    partitions: list[int]
    position: Position


class SeekSubscriptionResponse(Response):
    partitions: list[SubscriptionPartitionResult] = []


class DescribeSubscriptionsRequest(Struct):
    topic: str
    partitions: list[int]
    subscription: str | None = None  # None: every subscription of the partitions


class SubscriptionPartitionInfo(Struct):
    subscription: str
    partition: int
    error: int = 0
    message: str = ""
    config: SubscriptionConfig | None = None
    confirmed: int = 0  # every offset below is settled
    next_read: int = 0  # the first offset not delivered yet
    high_watermark: int = 0
    backlog: int = 0  # messages below the high watermark not settled yet (estimate)
    acked_ranges: int = 0  # ranges of acked offsets above ``confirmed``
    in_flight: int = 0  # messages delivered, awaiting their ack
    retrying: int = 0  # messages waiting for their redelivery
    waiting: int = 0  # key-ordered: messages held behind an earlier one of their key
    dead_lettered: int = 0
    expired: int = 0  # deleted by retention before they were acked
    consumers: int = 0
    stalled: str = ""  # why no new message is read, if none is ("ack state full")


class DescribeSubscriptionsResponse(Response):
    subscriptions: list[SubscriptionPartitionInfo] = []


class Delivery(Struct):
    """One stored batch, in the frame's attachments in order: ``want`` are the offsets of
    it delivered now (the others were settled, or are not this delivery's)."""

    base_offset: int
    size: int
    attempt: int
    want: Pairs


class Deliver(Struct):
    """Messages for a consumer of ``subscription`` (server push with attachments)."""

    topic: str
    subscription: str
    partition: int
    deliveries: list[Delivery]
    ack_deadline_ms: int = 0  # ms since the epoch


class SubscriptionEnded(Struct):
    """The leader stops delivering this partition to the connection (``error``: why, e.g.
    NOT_LEADER after a leader change, UNKNOWN_SUBSCRIPTION after a deletion); the client
    subscribes again where the metadata says."""

    topic: str
    subscription: str
    partition: int
    error: int = 0
    message: str = ""
