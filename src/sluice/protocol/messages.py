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
the meaning of an existing version.  The subscription, replication and
transaction APIs' structs are in subscription_messages.py, replication_messages.py and
transaction_messages.py (re-exported here); the ``Struct`` / ``Response`` bases in
structs.py.
"""

from __future__ import annotations

from enum import IntEnum

import msgspec

from sluice.errors import InvalidRequest, UnsupportedVersion
from sluice.protocol.replication_messages import (  # noqa: F401 - re-exported: m.ReplicaFetchRequest etc.
    ElectionResult,
    ElectLeadersRequest,
    ElectLeadersResponse,
    EpochEndOffset,
    EpochQuery,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    ReplicaFetchPartition,
    ReplicaFetchPartitionV2,
    ReplicaFetchRequest,
    ReplicaFetchRequestV2,
    ReplicaFetchResponse,
    ReplicaFetchResponseV2,
    ReplicaFetchResult,
    ReplicaFetchResultV2,
    ReplicaMove,
)
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
from sluice.protocol.transaction_messages import (  # noqa: F401 - re-exported: m.EndTransactionRequest etc.
    TXN_COMMITTED,
    TXN_ROLLED_BACK,
    CheckTransaction,
    EndTransactionRequest,
    EndTransactionResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    RegisterProducerRequest,
    RegisterProducerResponse,
    TransactionInfo,
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


# --------------------------------------------------------------------------- producer ids


class InitProducerIdRequest(Struct):
    pass


class InitProducerIdResponse(Response):
    """A producer id no other producer of the cluster was or will be given, epoch 0."""

    producer_id: int = -1
    producer_epoch: int = -1


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
