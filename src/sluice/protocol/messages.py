"""One frozen struct per request and response, versioned, encoded as msgpack.

The frame header (see frames.py) carries the API key and version; this module maps them to
the struct types, encodes and decodes headers, and knows nothing of sockets.  Record data
never goes through msgpack: it travels as frame attachments whose sizes the header lists
(``ProducePartition.size``, ``FetchPartitionResult.size``), so the broker can slice client
batches without copying and serve fetches straight from file bytes.

Every response carries ``error`` (a wire code from errors.py, 0 = none) and ``message``; a
request-level failure (unknown API, undecodable header) answers with just those two.
Per-partition results carry their own ``error`` / ``message``.

Adding a version: define the new structs, add them to ``APIS[api][version]``; never change
the meaning of an existing version.  The subscription APIs' structs are in
subscription_messages.py (re-exported here); the ``Struct`` / ``Response`` bases in
structs.py.
"""

from __future__ import annotations

from enum import IntEnum

import msgspec

from sluice.errors import InvalidRequest, UnsupportedVersion
from sluice.protocol.structs import Response, Struct  # noqa: F401 - the base of every struct
from sluice.protocol.subscription_messages import (  # noqa: F401 - re-exported: m.SubscribeRequest etc.
    AckPartition,
    AckRequest,
    AckResponse,
    CreateSubscriptionRequest,
    CreateSubscriptionResponse,
    DeleteSubscriptionRequest,
    DeleteSubscriptionResponse,
    Deliver,
    Delivery,
    DescribeSubscriptionsRequest,
    DescribeSubscriptionsResponse,
    Position,
    SeekSubscriptionRequest,
    SeekSubscriptionResponse,
    SubscribeRequest,
    SubscribeResponse,
    SubscriptionEnded,
    SubscriptionPartitionInfo,
    SubscriptionPartitionResult,
)


class Api(IntEnum):
    API_VERSIONS = 0
    METADATA = 1
    CREATE_TOPICS = 2
    DELETE_TOPICS = 3
    DESCRIBE_TOPICS = 4
    PRODUCE = 5
    FETCH = 6
    LIST_OFFSETS = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    LIST_GROUPS = 10
    DESCRIBE_GROUPS = 11
    DELETE_GROUPS = 12
    ALTER_TOPIC_CONFIGS = 13
    CREATE_PARTITIONS = 14
    REPLICA_FETCH = 15
    OFFSETS_FOR_LEADER_EPOCH = 16
    ELECT_LEADERS = 17
    INIT_PRODUCER_ID = 18
    END_TRANSACTION = 19
    REGISTER_PRODUCER = 20
    LIST_TRANSACTIONS = 21
    SUBSCRIBE = 22
    ACK = 23
    CREATE_SUBSCRIPTION = 24
    DELETE_SUBSCRIPTION = 25
    DESCRIBE_SUBSCRIPTIONS = 26
    SEEK_SUBSCRIPTION = 27


class Push(IntEnum):
    """Keys of server pushes (frames.PUSH, correlation 0): their own space, apart from Api."""

    CHECK_TRANSACTION = 1
    DELIVER = 2
    SUBSCRIPTION_ENDED = 3


# --------------------------------------------------------------------------- api versions


class ApiVersionsRequest(Struct):
    pass


class ApiVersionRange(Struct):
    api: int
    min_version: int
    max_version: int


class ApiVersionsResponse(Response):
    apis: list[ApiVersionRange] = []


# --------------------------------------------------------------------------- metadata


class MetadataRequest(Struct):
    topics: list[str] | None = None  # None: every topic


class BrokerInfo(Struct):
    node_id: int
    host: str
    port: int


class PartitionMetadata(Struct):
    partition: int
    leader: int  # -1: no leader now (offline)
    replicas: list[int] = []  # preferred leader first
    isr: list[int] = []
    error: int = 0
    leader_epoch: int = 0


class TopicMetadata(Struct):
    name: str
    error: int = 0
    message: str = ""
    partitions: list[PartitionMetadata] = []
    max_message_bytes: int = 0
    internal: bool = False
    # the replication factor the topic is meant to have (0: not said, an older broker): an
    # internal topic created while brokers were down has fewer replicas until they return
    replication_factor: int = 0


class MetadataResponse(Response):
    brokers: list[BrokerInfo] = []  # the live ones
    controller_id: int = -1
    topics: list[TopicMetadata] = []
    # set while the answering broker cannot reach the metadata store: why, and that the
    # brokers, leaders and ISRs above are as it last saw them (controller_id is then -1)
    store_error: str = ""


# --------------------------------------------------------------------------- topic admin


class NewTopic(Struct):
    name: str
    partitions: int = 1
    config: dict[str, str] = {}
    replication_factor: int = 0  # 0: the broker's default (sluice serve --replication-factor)


class CreateTopicsRequest(Struct):
    topics: list[NewTopic]
    validate_only: bool = False


class TopicResult(Struct):
    name: str
    error: int = 0
    message: str = ""


class CreateTopicsResponse(Response):
    topics: list[TopicResult] = []


class DeleteTopicsRequest(Struct):
    names: list[str]


class DeleteTopicsResponse(Response):
    topics: list[TopicResult] = []


class DescribeTopicsRequest(Struct):
    names: list[str] | None = None  # None: every topic


class PartitionDescription(Struct):
    """One partition as its leader sees it (offsets, size) and as the metadata store has
    it (leader, replicas, ISR, epoch).  Offsets and sizes are -1 when the answering broker
    does not hold the partition."""

    partition: int
    leader: int = -1
    log_start_offset: int = 0
    high_watermark: int = 0
    size_bytes: int = 0
    segments: int = 0
    replicas: list[int] = []
    isr: list[int] = []
    leader_epoch: int = 0
    log_end_offset: int = 0


class TopicDescription(Struct):
    name: str
    error: int = 0
    message: str = ""
    config: dict[str, str] = {}
    partitions: list[PartitionDescription] = []
    replication_factor: int = 1
    internal: bool = False


class DescribeTopicsResponse(Response):
    topics: list[TopicDescription] = []


class TopicConfigChange(Struct):
    name: str
    config: dict[str, str] = {}  # overrides to set (added or replaced)
    delete: list[str] = []  # overrides to drop: back to the broker's default


class AlterTopicConfigsRequest(Struct):
    topics: list[TopicConfigChange]
    validate_only: bool = False


class AlterTopicConfigsResponse(Response):
    topics: list[TopicResult] = []


class PartitionsIncrease(Struct):
    name: str
    total: int  # the partition count wanted, above the current one


class CreatePartitionsRequest(Struct):
    topics: list[PartitionsIncrease]
    validate_only: bool = False


class CreatePartitionsResponse(Response):
    topics: list[TopicResult] = []


# --------------------------------------------------------------------------- produce

ACKS_NONE, ACKS_LEADER, ACKS_ALL = 0, 1, -1


class ProducePartition(Struct):
    topic: str
    partition: int
    size: int  # bytes of record batches in the attachments, in list order


class ProduceRequest(Struct):
    partitions: list[ProducePartition]
    acks: int = ACKS_LEADER
    timeout_ms: int = 30_000
    # a broker writing to an internal topic another broker leads (an audit copy of a
    # discarded transaction); clients leave it false, and internal topics refuse them
    internal: bool = False


class ProducePartitionResult(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1


class ProduceResponse(Response):
    partitions: list[ProducePartitionResult] = []


class ProduceRequestV2(ProduceRequest):
    """Version 2: the same request, answered with each batch's base offset, so that an
    idempotent request mixing duplicates of stored batches and new ones can be answered."""


class ProducePartitionResultV2(ProducePartitionResult):
    # the base offset of each batch, in request order; -1 for a duplicate of a batch stored
    # too long ago for its offset to be remembered (see storage/producers.py)
    batch_offsets: list[int] = []


class ProduceResponseV2(Response):
    partitions: list[ProducePartitionResultV2] = []


# --------------------------------------------------------------------------- fetch


class FetchPartition(Struct):
    topic: str
    partition: int
    offset: int
    max_bytes: int = 1024 * 1024


class FetchRequest(Struct):
    partitions: list[FetchPartition]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 * 1024 * 1024


class FetchPartitionResult(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    high_watermark: int = -1
    log_start_offset: int = -1
    size: int = 0  # bytes of record batches in the attachments, in list order


class FetchResponse(Response):
    partitions: list[FetchPartitionResult] = []


# --------------------------------------------------------------------------- offsets

EARLIEST, LATEST = -2, -1


class ListOffsetsPartition(Struct):
    topic: str
    partition: int
    timestamp: int  # LATEST (-1), EARLIEST (-2), or ms since the epoch


class ListOffsetsRequest(Struct):
    partitions: list[ListOffsetsPartition]


class ListOffsetsResult(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    offset: int = -1
    timestamp: int = -1


class ListOffsetsResponse(Response):
    partitions: list[ListOffsetsResult] = []


class CommitOffset(Struct):
    topic: str
    partition: int
    offset: int
    metadata: str = ""


class OffsetCommitRequest(Struct):
    group: str
    offsets: list[CommitOffset]


class PartitionError(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""


class OffsetCommitResponse(Response):
    partitions: list[PartitionError] = []


class TopicPartition(Struct):
    topic: str
    partition: int


class OffsetFetchRequest(Struct):
    group: str
    partitions: list[TopicPartition] | None = None  # None: every committed partition


class FetchedOffset(Struct):
    topic: str
    partition: int
    offset: int = -1  # -1: nothing committed
    metadata: str = ""
    error: int = 0


class OffsetFetchResponse(Response):
    offsets: list[FetchedOffset] = []


# --------------------------------------------------------------------------- groups
#
# A group is the committed offsets kept under its name (there is no membership protocol):
# it exists from its first commit until it is deleted.


class ListGroupsRequest(Struct):
    pass


class GroupListing(Struct):
    name: str
    topics: list[str] = []  # topics with a committed offset
    partitions: int = 0  # partitions with a committed offset
    lag: int = 0  # summed over those partitions whose lag is known
    last_commit_ms: int = -1  # broker time of the group's latest commit; -1: unknown
    lag_unknown: int = 0  # committed partitions left out of lag: no reachable leader now (admin client)


class ListGroupsResponse(Response):
    groups: list[GroupListing] = []


class DescribeGroupsRequest(Struct):
    names: list[str]


class GroupPartition(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    committed_offset: int = -1  # -1: none (a partition of a topic the group committed to)
    metadata: str = ""
    log_start_offset: int = -1  # -1 (and high_watermark): unknown, e.g. no leader now
    high_watermark: int = -1
    lag: int = -1  # high_watermark - committed_offset, at least 0; -1: nothing committed or no log end known
    commit_time_ms: int = -1  # broker time of the last commit of this partition; -1: unknown
    committed_by: str = ""  # client address (host:port) of that commit's connection


class GroupDescription(Struct):
    name: str
    error: int = 0
    message: str = ""
    partitions: list[GroupPartition] = []


class DescribeGroupsResponse(Response):
    groups: list[GroupDescription] = []


class DeleteGroupsRequest(Struct):
    names: list[str]


class GroupResult(Struct):
    name: str
    error: int = 0
    message: str = ""


class DeleteGroupsResponse(Response):
    groups: list[GroupResult] = []


# --------------------------------------------------------------------------- replication
# Broker to broker: a follower pulls from its leader; never sent by clients.


class ReplicaFetchPartition(Struct):
    topic: str
    partition: int
    leader_epoch: int  # the follower's view: the leader refuses an older or newer one
    offset: int  # the follower's log end: everything below it is acknowledged as copied
    max_bytes: int = 1024 * 1024
    storage_error: str = ""  # the follower cannot write this partition: leave the ISR now


class ReplicaFetchRequest(Struct):
    replica_id: int
    partitions: list[ReplicaFetchPartition]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 * 1024 * 1024


class ReplicaFetchResult(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    size: int = 0  # bytes of record batches in the attachments, in list order


class ReplicaFetchResponse(Response):
    partitions: list[ReplicaFetchResult] = []


class ReplicaFetchPartitionV2(ReplicaFetchPartition):
    """Version 2 (Kafka's KIP-320): the follower also says the leader epoch of the last
    batch in its log, so the leader checks that the follower's log below ``offset`` is its
    own before counting it as copied."""

    last_fetched_epoch: int = -1  # -1: an empty log (nothing to check)


class ReplicaFetchRequestV2(ReplicaFetchRequest):
    partitions: list[ReplicaFetchPartitionV2]


class ReplicaFetchResultV2(ReplicaFetchResult):
    """``diverging``: the follower's log does not end in its last epoch where the leader's
    log has that epoch, so what it holds below ``offset`` is not all the leader's.
    ``diverging_epoch`` is the largest epoch the leader has at or below the follower's and
    ``diverging_end_offset`` where it ends in the leader's log (-1, -1: the leader knows
    none of its epochs).  The follower cuts its log there and fetches again; no data comes
    with it, and the leader has not counted the fetch as copied."""

    diverging: bool = False
    diverging_epoch: int = -1
    diverging_end_offset: int = -1


class ReplicaFetchResponseV2(ReplicaFetchResponse):
    partitions: list[ReplicaFetchResultV2] = []


class EpochQuery(Struct):
    topic: str
    partition: int
    current_leader_epoch: int  # the asker's view of the partition's epoch (fencing)
    leader_epoch: int  # the epoch whose end offset is asked for


class OffsetsForLeaderEpochRequest(Struct):
    replica_id: int
    partitions: list[EpochQuery]


class EpochEndOffset(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    leader_epoch: int = -1  # the largest epoch <= the asked one that the leader has
    end_offset: int = -1  # where that epoch ends in the leader's log


class OffsetsForLeaderEpochResponse(Response):
    partitions: list[EpochEndOffset] = []


class ElectLeadersRequest(Struct):
    """Give each partition without a live leader one where a replica is eligible (the
    others are answered ``ELIGIBLE_LEADERS_NOT_AVAILABLE``), then move leadership back to
    each partition's preferred replica (the first of its replicas) where it is alive and in
    sync; None: every partition.

    ``reassign`` (added later; older brokers ignore it): first replace the replicas of
    brokers that are not alive by live ones (the least loaded), in partitions that have
    a live leader; then record moves that even out the replica load of the live brokers
    (brokers that joined), done in two phases (``ReplicaMove.pending``)."""

    topics: list[str] | None = None
    reassign: bool = False


class ReplicaMove(Struct):
    """A partition whose replicas changed from ``old`` to ``new`` (same order), or could
    not (``error``).

    ``pending`` (added later): a move in two phases, recorded: the replicas of ``new``
    not in ``old`` were added, those of ``old`` not in ``new`` leave once the others
    are in sync (the controller completes it)."""

    topic: str
    partition: int
    old: list[int] = []
    new: list[int] = []
    error: int = 0
    message: str = ""
    pending: bool = False


class ElectionResult(Struct):
    topic: str
    partition: int
    leader: int
    error: int = 0
    message: str = ""


class ElectLeadersResponse(Response):
    partitions: list[ElectionResult] = []  # the partitions whose leader changed or could not
    moves: list[ReplicaMove] = []  # with ``reassign``: the replicas replaced, or that could not be


# --------------------------------------------------------------------------- producer ids


class InitProducerIdRequest(Struct):
    pass


class InitProducerIdResponse(Response):
    """A producer id no other producer of the cluster was or will be given, epoch 0."""

    producer_id: int = -1
    producer_epoch: int = -1


# --------------------------------------------------------------------------- transactions
# A transaction is a half message: a batch with the transactional attribute bit in its
# target partition.  Its id is (topic, partition, offset) of that batch; its printable form
# is ``topic/partition/offset`` (broker/transactions/, client/transaction.py).

TXN_COMMITTED, TXN_ROLLED_BACK = "committed", "rolled_back"


class EndTransactionRequest(Struct):
    """Commit or roll back the half message at ``offset``; sent to the partition's leader."""

    topic: str
    partition: int
    offset: int
    commit: bool
    from_check: bool = False  # the answer to a check-back (CHECK_TRANSACTION push)
    timeout_ms: int = 30_000


class EndTransactionResponse(Response):
    state: str = ""  # TXN_COMMITTED or TXN_ROLLED_BACK
    # committed: offset of the visible copy; rolled back: offset of the rollback marker
    offset: int = -1
    already: bool = False  # it was ended this way before this request


class RegisterProducerRequest(Struct):
    """This connection belongs to a live producer of ``group``: the broker may push
    CHECK_TRANSACTION frames on it for that group's unresolved half messages."""

    group: str


class RegisterProducerResponse(Response):
    pass


class ListTransactionsRequest(Struct):
    topics: list[str] | None = None  # None: every topic
    delayed: bool = False  # True: the pending delayed messages instead of the transactions


class TransactionInfo(Struct):
    topic: str
    partition: int
    offset: int
    group: str = ""
    timestamp: int = -1  # ms, of the half message
    checks: int = 0  # check-backs sent by the current leader
    age_ms: int = 0
    deliver_at: int = 0  # ms: a delayed message's delivery time; 0 for a transaction
    count: int = 0  # messages in the half message's batch


class ListTransactionsResponse(Response):
    """The unresolved half messages of the partitions this broker leads."""

    transactions: list[TransactionInfo] = []


class CheckTransaction(Struct):
    """Pushed by a partition's leader to a producer of ``group``: is the local transaction
    of this half message committed?  The producer answers with END_TRANSACTION
    (``from_check``), or not at all when it does not know yet."""

    topic: str
    partition: int
    offset: int
    group: str
    timestamp: int = -1
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = []
    checks: int = 0  # this is check number ``checks``


# Server pushes: key -> version -> struct (frames.PUSH, correlation 0).
PUSHES: dict[Push, dict[int, type[Struct]]] = {
    Push.CHECK_TRANSACTION: {1: CheckTransaction},
    Push.DELIVER: {1: Deliver},
    Push.SUBSCRIPTION_ENDED: {1: SubscriptionEnded},
}


# --------------------------------------------------------------------------- registry

APIS: dict[Api, dict[int, tuple[type[Struct], type[Response]]]] = {
    Api.API_VERSIONS: {1: (ApiVersionsRequest, ApiVersionsResponse)},
    Api.METADATA: {1: (MetadataRequest, MetadataResponse)},
    Api.CREATE_TOPICS: {1: (CreateTopicsRequest, CreateTopicsResponse)},
    Api.DELETE_TOPICS: {1: (DeleteTopicsRequest, DeleteTopicsResponse)},
    Api.DESCRIBE_TOPICS: {1: (DescribeTopicsRequest, DescribeTopicsResponse)},
    Api.PRODUCE: {1: (ProduceRequest, ProduceResponse), 2: (ProduceRequestV2, ProduceResponseV2)},
    Api.FETCH: {1: (FetchRequest, FetchResponse)},
    Api.LIST_OFFSETS: {1: (ListOffsetsRequest, ListOffsetsResponse)},
    Api.OFFSET_COMMIT: {1: (OffsetCommitRequest, OffsetCommitResponse)},
    Api.OFFSET_FETCH: {1: (OffsetFetchRequest, OffsetFetchResponse)},
    Api.LIST_GROUPS: {1: (ListGroupsRequest, ListGroupsResponse)},
    Api.DESCRIBE_GROUPS: {1: (DescribeGroupsRequest, DescribeGroupsResponse)},
    Api.DELETE_GROUPS: {1: (DeleteGroupsRequest, DeleteGroupsResponse)},
    Api.ALTER_TOPIC_CONFIGS: {1: (AlterTopicConfigsRequest, AlterTopicConfigsResponse)},
    Api.CREATE_PARTITIONS: {1: (CreatePartitionsRequest, CreatePartitionsResponse)},
    Api.REPLICA_FETCH: {
        1: (ReplicaFetchRequest, ReplicaFetchResponse), 2: (ReplicaFetchRequestV2, ReplicaFetchResponseV2),
    },
    Api.OFFSETS_FOR_LEADER_EPOCH: {1: (OffsetsForLeaderEpochRequest, OffsetsForLeaderEpochResponse)},
    Api.ELECT_LEADERS: {1: (ElectLeadersRequest, ElectLeadersResponse)},
    Api.INIT_PRODUCER_ID: {1: (InitProducerIdRequest, InitProducerIdResponse)},
    Api.END_TRANSACTION: {1: (EndTransactionRequest, EndTransactionResponse)},
    Api.REGISTER_PRODUCER: {1: (RegisterProducerRequest, RegisterProducerResponse)},
    Api.LIST_TRANSACTIONS: {1: (ListTransactionsRequest, ListTransactionsResponse)},
    Api.SUBSCRIBE: {1: (SubscribeRequest, SubscribeResponse)},
    Api.ACK: {1: (AckRequest, AckResponse)},
    Api.CREATE_SUBSCRIPTION: {1: (CreateSubscriptionRequest, CreateSubscriptionResponse)},
    Api.DELETE_SUBSCRIPTION: {1: (DeleteSubscriptionRequest, DeleteSubscriptionResponse)},
    Api.DESCRIBE_SUBSCRIPTIONS: {1: (DescribeSubscriptionsRequest, DescribeSubscriptionsResponse)},
    Api.SEEK_SUBSCRIPTION: {1: (SeekSubscriptionRequest, SeekSubscriptionResponse)},
}

_REQUEST_API: dict[type, tuple[Api, int]] = {
    req: (api, version) for api, versions in APIS.items() for version, (req, _) in versions.items()
}

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type, msgspec.msgpack.Decoder] = {}


def api_of(request: Struct) -> tuple[Api, int]:
    """(API key, version) of a request struct."""
    return _REQUEST_API[type(request)]


def types_for(api: int, version: int) -> tuple[type[Struct], type[Response]]:
    """The request and response types of an API version; ``UnsupportedVersion`` if unknown."""
    try:
        versions = APIS[Api(api)]
    except ValueError:
        raise UnsupportedVersion(f"unknown API key {api}") from None
    try:
        return versions[version]
    except KeyError:
        raise UnsupportedVersion(
            f"{Api(api).name} version {version} is not supported (supported: {sorted(versions)})"
        ) from None


def encode(message: Struct) -> bytes:
    return _encoder.encode(message)


def decode(data, cls: type[Struct]):
    """Decode a header into ``cls``; ``InvalidRequest`` on anything that does not fit."""
    dec = _decoders.get(cls)
    if dec is None:
        dec = _decoders[cls] = msgspec.msgpack.Decoder(cls)
    try:
        return dec.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"cannot decode {cls.__name__}: {exc}") from exc


def supported_versions() -> list[ApiVersionRange]:
    return [
        ApiVersionRange(api=int(api), min_version=min(v), max_version=max(v))
        for api, v in APIS.items()
    ]
