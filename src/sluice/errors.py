"""The whole Sluice exception tree, and the stable name and code of every error.

::

    SluiceError                          SLUICE_ERROR          local 1000  base of everything Sluice raises
    ├── ConfigError                      CONFIG_ERROR          local 1001  bad local settings (client or server config)
    │   ├── UsageError                   USAGE_ERROR           local 1002  bad command-line arguments (exit status 2)
    │   ├── DataDirInUse                 DATA_DIR_IN_USE       local 1014  another broker holds the data directory's lock
    │   ├── NodeIdInUse                  NODE_ID_IN_USE        local 1015  another live broker is registered with this node id
    │   └── ClusterIdMismatch            CLUSTER_ID_MISMATCH   local 1017  the metadata store holds another cluster than the data directory
    ├── ProtocolError                    PROTOCOL_ERROR        local 1003  bytes that do not follow the wire protocol
    │   ├── FrameTooLarge                FRAME_TOO_LARGE       local 1004  a length prefix above the frame cap
    │   └── CorruptRecord                CORRUPT_RECORD        local 1005  a record batch failing its header or CRC check
    ├── ConnectionClosed                 CONNECTION_CLOSED     local 1006  retriable: the peer closed or broke the connection
    │   ├── BrokerUnreachable            BROKER_UNREACHABLE    local 1007  retriable: no TCP connection to any broker
    │   └── HandshakeTimeout             HANDSHAKE_TIMEOUT     local 1008  retriable: connected, but no Sluice handshake came back
    ├── ClientError                      CLIENT_ERROR          local 1009  local to the client, never sent on the wire
    │   ├── ClientClosed                 CLIENT_CLOSED         local 1010  the producer / consumer was closed by you
    │   ├── BufferExhausted              BUFFER_EXHAUSTED      local 1011  retriable: no buffer memory within max_block_ms
    │   ├── DataLoss                     DATA_LOSS             local 1012  records a read planned to return are gone
    │   ├── DeliveryTimeout              DELIVERY_TIMEOUT      local 1013  retriable: a send was not acknowledged within delivery_timeout_ms
    │   └── AlreadySettled               ALREADY_SETTLED       local 1016  a subscription message was acked or nacked before
    └── BrokerError                      an error code answered by a broker (has .code)
        ├── UnknownServerError           code 1   a bug on the broker; the message says what
        ├── InvalidRequest               code 2   a well-framed request with bad content
        ├── UnsupportedVersion           code 3   unknown API key or version
        ├── UnknownTopic                 code 4   retriable: the topic may be being created
        ├── UnknownPartition             code 5
        ├── TopicAlreadyExists           code 6
        ├── InvalidTopicName             code 7
        ├── InvalidPartitions            code 8
        ├── InvalidConfig                code 9
        ├── MessageTooLarge              code 10
        ├── OffsetOutOfRange             code 11
        ├── RequestTimedOut              code 12  retriable
        ├── StorageError                 code 13  retriable: I/O failure on the broker
        │   ├── DiskFull                 code 14  retriable: no space left; retry after space is freed
        │   └── ReadOnlyStorage          code 15  retriable: the data directory is not writable
        ├── TooManyConnections           code 16  retriable
        ├── BrokerShuttingDown           code 17  retriable
        ├── InvalidGroup                 code 18
        ├── NotLeader                    code 19  retriable: metadata is stale
        │   └── LeadershipLost           code 31  retriable: appended as leader, but leadership
        │                                         moved before the write was acknowledged: it
        │                                         may survive on the new leader or be cut
        ├── TopicBeingDeleted            code 20  retriable
        ├── InvalidRecord                code 21  a record batch failed its checks (CRC, layout)
        ├── UnknownGroup                 code 22  no committed offsets are kept for that group
        ├── MetadataUnavailable          code 23  retriable: the metadata store (etcd) did not answer
        ├── NotEnoughReplicas            code 24  retriable: acks=all while the ISR is below
        │                                         min.insync.replicas; nothing was written
        ├── BrokerBusy                   code 25  retriable: the partition's write queue or its
        │                                         acks=all waits are full; nothing was written
        ├── OffsetNotAvailable           code 26  retriable: the offset is in the log but above
        │                                         the high watermark (a new leader catching up)
        ├── FencedLeaderEpoch            code 27  the request's leader epoch is older than the
        │                                         partition's: the sender follows a deposed leader
        ├── UnknownLeaderEpoch           code 28  retriable: the request's leader epoch is newer
        │                                         than this broker knows (it catches up soon)
        ├── InvalidReplicationFactor     code 29  more replicas asked than brokers are alive
        ├── NotCoordinator               code 30  retriable: another broker coordinates that group
        ├── OutOfOrderSequence           code 32  an idempotent producer's sequence gap; nothing
        │                                         was written (the producer starts a new epoch)
        ├── ProducerFenced               code 33  a newer epoch of the producer id wrote already
        ├── TransactionEnded             code 34  the half message was ended the other way
        │                                         already (commit after rollback or the reverse)
        ├── UnknownTransaction           code 35  no half message at that transaction id
        ├── UnknownSubscription          code 36  the topic's partition has no subscription of
        │                                         that name (never created, or deleted)
        ├── SubscriptionAlreadyExists    code 37
        ├── InvalidSubscription          code 38  a bad subscription name or setting
        ├── EligibleLeadersNotAvailable  code 39  retriable: a partition without a live leader
        │                                         has no replica it may elect (none alive, or
        │                                         none in sync and unclean election is off)
        └── NotEnoughReplicasAfterAppend code 40  retriable: an acks=all write was appended,
                                                  but the ISR had shrunk below
                                                  min.insync.replicas when the high watermark
                                                  passed it: may have been stored

Every class has a stable ``name`` and ``code``; ``describe(exc)`` gives the one line
``NAME (code): message`` that the command line prints.  Two ranges that never overlap:

- **wire codes** (1-999) are what brokers answer; ``0`` means no error.  A wire code is
  never reused for another meaning.
- **local codes** (1000 and up) belong to errors raised in the client, the command line or
  the server process itself; they are never sent on the wire, and ``error_for_code`` does
  not map them (an unknown wire code is an ``UnknownServerError``).

Layers translate foreign exceptions (``OSError``, ``msgspec.DecodeError``) into this tree
with ``raise ... from exc`` at their boundary.

**Outcome of a failed send.**  Every error that fails a producer's send carries
``maybe_stored``: ``False`` only when no attempt to write the records can have been
stored (never sent, or every attempt refused by the broker with an error whose
``appended_nothing`` is true); ``True`` when the fate of any attempt is unknown (a request
timed out or its connection broke after it was written, or the broker answered
``REQUEST_TIMED_OUT``).  The message says the same, but for an error that kept a record
from being buffered at all (the call raised, or the future of ``send`` / ``send_nowait``
failed before anything was sent): ``maybe_stored`` is ``False`` and the message is the
error's own.  Errors not about a send leave it ``None``.
"""

from __future__ import annotations

import errno

NONE = 0
LOCAL_CODES_START = 1000  # local codes: 1000 and up, never on the wire

_LOCAL_BY_CODE: dict[int, type[SluiceError]] = {}


def _local(code: int, name: str, retriable: bool = False):
    """Give a class that never crosses the wire its stable local code and name."""

    def register(cls):
        assert code >= LOCAL_CODES_START and code not in _LOCAL_BY_CODE, code
        cls.code, cls.name, cls.retriable = code, name, retriable
        _LOCAL_BY_CODE[code] = cls
        return cls

    return register


@_local(1000, "SLUICE_ERROR")
class SluiceError(Exception):
    """Base of every error Sluice raises.  ``name`` and ``code`` identify the class."""

    retriable: bool = False
    name: str
    code: int
    # On an error that failed a send: may the records have been stored? (module docstring)
    maybe_stored: bool | None = None


@_local(1001, "CONFIG_ERROR")
class ConfigError(SluiceError, ValueError):
    """A local setting is invalid (raised before anything is sent)."""


@_local(1002, "USAGE_ERROR")
class UsageError(ConfigError):
    """The command line was given arguments it cannot use (``sluice`` exits with 2)."""


@_local(1014, "DATA_DIR_IN_USE")
class DataDirInUse(ConfigError):
    """The data directory is locked by another running broker."""


@_local(1015, "NODE_ID_IN_USE")
class NodeIdInUse(ConfigError):
    """Another live broker of the cluster is registered with this broker's node id."""


@_local(1017, "CLUSTER_ID_MISMATCH")
class ClusterIdMismatch(ConfigError):
    """The metadata store does not hold the cluster the data directory's replicas belong
    to (etcd wiped or replaced, another cluster's prefix, a single-node directory started
    in a cluster or the other way round).  The broker refuses to start, or stops, and
    touches none of its data."""


@_local(1003, "PROTOCOL_ERROR")
class ProtocolError(SluiceError):
    """Bytes that do not follow the Sluice wire protocol. The connection must be closed."""


@_local(1004, "FRAME_TOO_LARGE")
class FrameTooLarge(ProtocolError):
    """A frame's length prefix is above the cap; nothing of that size was allocated."""


@_local(1005, "CORRUPT_RECORD")
class CorruptRecord(ProtocolError):
    """A record batch whose header, length or CRC-32C does not check out."""


@_local(1006, "CONNECTION_CLOSED", retriable=True)
class ConnectionClosed(SluiceError):
    """The connection was closed or broken by the peer."""


@_local(1007, "BROKER_UNREACHABLE", retriable=True)
class BrokerUnreachable(ConnectionClosed):
    """No broker could be reached: every TCP connect was refused, failed or timed out."""


@_local(1008, "HANDSHAKE_TIMEOUT", retriable=True)
class HandshakeTimeout(ConnectionClosed):
    """A peer accepted the TCP connection but did not answer the Sluice handshake in
    time: most likely not a Sluice broker (or one too busy to answer)."""


@_local(1009, "CLIENT_ERROR")
class ClientError(SluiceError):
    """An error local to the client; never sent on the wire."""


@_local(1010, "CLIENT_CLOSED")
class ClientClosed(ClientError):
    """The client object was closed by its owner."""


@_local(1011, "BUFFER_EXHAUSTED", retriable=True)
class BufferExhausted(ClientError):
    """The producer's buffer memory stayed full for longer than ``max_block_ms``."""


@_local(1012, "DATA_LOSS")
class DataLoss(ClientError):
    """Records a read was planned to return are gone: deleted by retention, or the topic
    was deleted (and maybe created again) since."""


@_local(1013, "DELIVERY_TIMEOUT", retriable=True)
class DeliveryTimeout(ClientError):
    """A send was not acknowledged within ``delivery_timeout_ms`` (retries included)."""


@_local(1016, "ALREADY_SETTLED")
class AlreadySettled(ClientError):
    """A subscription message was acked or nacked a second time: the first settlement
    stands, the second is refused (it would contradict or repeat the first)."""


class BrokerError(SluiceError):
    """An error answered by a broker. ``code`` is its wire code."""

    code: int = -1
    name: str = "BROKER_ERROR"
    # True when answering with this code guarantees the request appended nothing (the
    # broker refused before writing, or cut a failed write back); False where the write
    # may still have happened (a timeout, a bug).
    appended_nothing: bool = True

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name

    def __str__(self) -> str:
        return f"{self.name} ({self.code}): {self.message}"


_BY_CODE: dict[int, type[BrokerError]] = {}


def _code(code: int, name: str, retriable: bool = False, appended_nothing: bool = True):
    def register(cls: type[BrokerError]) -> type[BrokerError]:
        assert 0 < code < LOCAL_CODES_START and code not in _BY_CODE, code
        cls.code, cls.name, cls.retriable = code, name, retriable
        cls.appended_nothing = appended_nothing
        _BY_CODE[code] = cls
        return cls

    return register


@_code(1, "UNKNOWN_SERVER_ERROR", appended_nothing=False)
class UnknownServerError(BrokerError):
    pass


@_code(2, "INVALID_REQUEST")
class InvalidRequest(BrokerError):
    pass


@_code(3, "UNSUPPORTED_VERSION")
class UnsupportedVersion(BrokerError):
    pass


@_code(4, "UNKNOWN_TOPIC", retriable=True)
class UnknownTopic(BrokerError):
    pass


@_code(5, "UNKNOWN_PARTITION")
class UnknownPartition(BrokerError):
    pass


@_code(6, "TOPIC_ALREADY_EXISTS")
class TopicAlreadyExists(BrokerError):
    pass


@_code(7, "INVALID_TOPIC_NAME")
class InvalidTopicName(BrokerError):
    pass


@_code(8, "INVALID_PARTITIONS")
class InvalidPartitions(BrokerError):
    pass


@_code(9, "INVALID_CONFIG")
class InvalidConfig(BrokerError):
    pass


@_code(10, "MESSAGE_TOO_LARGE")
class MessageTooLarge(BrokerError):
    pass


@_code(11, "OFFSET_OUT_OF_RANGE")
class OffsetOutOfRange(BrokerError):
    pass


@_code(12, "REQUEST_TIMED_OUT", retriable=True, appended_nothing=False)
class RequestTimedOut(BrokerError):
    pass


@_code(13, "STORAGE_ERROR", retriable=True)
class StorageError(BrokerError):
    pass


@_code(14, "DISK_FULL", retriable=True)
class DiskFull(StorageError):
    pass


@_code(15, "READ_ONLY_STORAGE", retriable=True)
class ReadOnlyStorage(StorageError):
    pass


@_code(16, "TOO_MANY_CONNECTIONS", retriable=True)
class TooManyConnections(BrokerError):
    pass


@_code(17, "BROKER_SHUTTING_DOWN", retriable=True)
class BrokerShuttingDown(BrokerError):
    pass


@_code(18, "INVALID_GROUP")
class InvalidGroup(BrokerError):
    pass


@_code(19, "NOT_LEADER", retriable=True)
class NotLeader(BrokerError):
    pass


@_code(31, "LEADERSHIP_LOST", retriable=True, appended_nothing=False)
class LeadershipLost(NotLeader):
    """The write was appended while this broker led the partition, but it stopped leading
    before the high watermark passed the write: the new leader may have it (it was
    replicated in time) or not (it will be truncated here).  May have been stored."""


@_code(20, "TOPIC_BEING_DELETED", retriable=True)
class TopicBeingDeleted(BrokerError):
    pass


@_code(21, "INVALID_RECORD")
class InvalidRecord(BrokerError):
    pass


@_code(22, "UNKNOWN_GROUP")
class UnknownGroup(BrokerError):
    pass


@_code(23, "METADATA_UNAVAILABLE", retriable=True)
class MetadataUnavailable(BrokerError):
    """The cluster metadata store did not answer in time; a change it was asked for may or
    may not have been made (read it back)."""


@_code(24, "NOT_ENOUGH_REPLICAS", retriable=True)
class NotEnoughReplicas(BrokerError):
    """An ``acks=all`` write refused at once: fewer in-sync replicas than the topic's
    ``min.insync.replicas``.  Fail fast instead of waiting for replicas (DESIGN §7)."""


@_code(25, "BROKER_BUSY", retriable=True)
class BrokerBusy(BrokerError):
    """A write refused at once because the partition holds as many pending writes or
    ``acks=all`` waits as it may (``write.queue.max.bytes``, ``replica.wait.max.*``)."""


@_code(26, "OFFSET_NOT_AVAILABLE", retriable=True)
class OffsetNotAvailable(BrokerError):
    """A fetch at an offset the partition has but may not show yet: above its high
    watermark.  Retry the same offset later; it is not out of range."""


@_code(27, "FENCED_LEADER_EPOCH")
class FencedLeaderEpoch(BrokerError):
    """A replica request carried a leader epoch older than this broker's for the partition:
    the sender still follows a deposed leader and must refresh its partition state."""


@_code(28, "UNKNOWN_LEADER_EPOCH", retriable=True)
class UnknownLeaderEpoch(BrokerError):
    """A replica request carried a leader epoch newer than this broker's: this broker has
    not yet seen the partition state that the sender acts on.  Retry shortly."""


@_code(29, "INVALID_REPLICATION_FACTOR")
class InvalidReplicationFactor(BrokerError):
    """A replication factor below 1, or above the number of live brokers."""


@_code(30, "NOT_COORDINATOR", retriable=True)
class NotCoordinator(BrokerError):
    """This broker does not coordinate the group (it does not lead the group's partition of
    ``__groups``); refresh metadata and ask the leader of that partition."""


@_code(32, "OUT_OF_ORDER_SEQUENCE")
class OutOfOrderSequence(BrokerError):
    """An idempotent producer's batch whose sequence number does not follow the last one
    the partition stored for that producer and epoch (a gap: batches were lost in
    between), or overlaps a stored batch without matching it.  Nothing was written; the
    producer starts a new epoch and resends from sequence 0."""


@_code(33, "PRODUCER_FENCED")
class ProducerFenced(BrokerError):
    """A batch from an epoch of an idempotent producer older than one the partition
    already stored: a newer instance with the same producer id has taken over."""


@_code(34, "TRANSACTION_ENDED")
class TransactionEnded(BrokerError):
    """A commit of a half message that was rolled back (or discarded after its checks), or
    a rollback of one that was committed.  Ending it again the same way succeeds."""


@_code(35, "UNKNOWN_TRANSACTION")
class UnknownTransaction(BrokerError):
    """The transaction id names no half message of that partition: a wrong offset, an
    ordinary message, or a half message that retention already deleted."""


@_code(36, "UNKNOWN_SUBSCRIPTION")
class UnknownSubscription(BrokerError):
    """No subscription of that name on the partition: never created, or deleted."""


@_code(37, "SUBSCRIPTION_ALREADY_EXISTS")
class SubscriptionAlreadyExists(BrokerError):
    pass


@_code(38, "INVALID_SUBSCRIPTION")
class InvalidSubscription(BrokerError):
    """A subscription name or setting out of its range; the message says which."""


@_code(39, "ELIGIBLE_LEADERS_NOT_AVAILABLE", retriable=True)
class EligibleLeadersNotAvailable(BrokerError):
    """A leader election found no replica it may elect for a partition without a live
    leader: none is alive, or none in sync while the topic does not allow unclean
    elections; the message says which."""


@_code(40, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", retriable=True, appended_nothing=False)
class NotEnoughReplicasAfterAppend(BrokerError):
    """An ``acks=all`` write that was appended, but when the high watermark passed it the
    ISR had fewer members than ``min.insync.replicas`` (it shrank while the write waited):
    it is not acknowledged, since fewer copies than promised may hold it.  The write may
    have been stored (it is in the leader's log, and may survive); an idempotent producer
    retries it safely, and the retry is answered as a duplicate once the ISR is big enough
    again (Kafka's ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``)."""


def error_for_code(code: int, message: str = "") -> BrokerError:
    """The exception for a wire error code; an unknown code maps to ``UnknownServerError``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return UnknownServerError(f"unknown error code {code}: {message}")
    return cls(message)


def raise_for_code(code: int, message: str = "") -> None:
    """Raise the exception for ``code`` unless it is ``NONE``."""
    if code != NONE:
        raise error_for_code(code, message)


def unknown_partition(topic: str, partition: int, count: int) -> UnknownPartition:
    """The one wording of "partition ``partition`` of ``topic`` does not exist" (it has
    ``count``), wherever it is found out: broker, metadata store, client or CLI."""
    have = "partition 0 only" if count == 1 else f"partitions 0-{count - 1}"
    return UnknownPartition(f"topic {topic!r} has {have}, not {partition}")


def unknown_topic_after(topic: str, waited_s: float) -> UnknownTopic:
    """``UnknownTopic`` once ``topic`` was asked about for ``unknown_topic_wait_ms`` (a
    topic may be being created) and still does not exist: producer, sender, subscriber."""
    return UnknownTopic(f"topic {topic!r} does not exist (waited {waited_s * 1000:g} ms: unknown_topic_wait_ms)")


def send_failure(exc: BaseException, maybe_stored: bool) -> SluiceError:
    """A fresh copy of ``exc`` for the records of one failed batch, saying whether they may
    have been stored (``maybe_stored``, and the end of the message).

    Each batch gets its own copy because batches failed by one error can differ in what
    earlier attempts did.  A foreign exception (a bug) becomes a ``ClientError`` whose
    ``__cause__`` is the original.
    """
    note = "may have been stored" if maybe_stored else "not stored"
    if isinstance(exc, SluiceError):
        out = annotated(exc, f"[{note}]")
    else:
        out = ClientError(f"send failed unexpectedly: {exc!r} [{note}]")
        out.__cause__ = exc
    out.maybe_stored = maybe_stored
    return out


def unbuffered(exc: BaseException) -> BaseException:
    """``exc``, which kept a record from being buffered, marked ``maybe_stored = False``
    (a foreign exception, a caller's bug such as a value that is not bytes, is left as it is)."""
    if isinstance(exc, SluiceError) and exc.maybe_stored is None:
        exc.maybe_stored = False
    return exc


def annotated(exc: SluiceError, note: str) -> SluiceError:
    """A fresh exception of ``exc``'s class and code whose message ends with ``note``."""
    if isinstance(exc, BrokerError):
        out: SluiceError = error_for_code(exc.code, f"{exc.message} {note}")
    else:
        out = type(exc)(f"{exc} {note}")
    out.__cause__ = exc.__cause__
    return out


def all_codes() -> dict[int, type[BrokerError]]:
    """Every registered wire code and its class (for docs and tests)."""
    return dict(_BY_CODE)


def local_codes() -> dict[int, type[SluiceError]]:
    """Every local code (1000 and up, never on the wire) and its class."""
    return dict(_LOCAL_BY_CODE)


def describe(exc: SluiceError) -> str:
    """``NAME (code): message``: the one line the command line prints for ``exc``."""
    if isinstance(exc, BrokerError):
        return str(exc)
    return f"{exc.name} ({exc.code}): {str(exc) or exc.name}"


def storage_error_from_os(exc: OSError, what: str) -> StorageError:
    """Translate an ``OSError`` from the data directory into a wire error."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"{what}: no space left on device")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyStorage(f"{what}: {exc.strerror}")
    return StorageError(f"{what}: {exc.strerror or exc}")
