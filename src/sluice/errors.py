"""The whole Sluice exception tree, and the wire code of every remote error.

::

    SluiceError                          base of everything Sluice raises
    ├── ConfigError                      bad local settings (client or server config)
    │   └── DataDirInUse                 another broker holds the data directory's lock
    ├── ProtocolError                    bytes that do not follow the wire protocol
    │   ├── FrameTooLarge                a length prefix above the frame cap
    │   └── CorruptRecord                a record batch failing its header or CRC check
    ├── ConnectionClosed                 the peer closed or broke the connection (retriable)
    ├── ClientError                      local to the client, never sent on the wire
    │   ├── ClientClosed                 the producer / consumer was closed by you
    │   ├── BufferExhausted              no buffer memory within max_block_ms
    │   └── DeliveryTimeout              a send was not acknowledged within delivery_timeout_ms
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
        ├── TopicBeingDeleted            code 20  retriable
        ├── InvalidRecord                code 21  a record batch failed its checks (CRC, layout)
        ├── UnknownGroup                 code 22  no committed offsets are kept for that group
        ├── NotEnoughReplicas            code 23  retriable: acks=all while the ISR is below
        │                                         min.insync.replicas; nothing was written
        ├── BrokerBusy                   code 24  retriable: the partition's write queue or its
        │                                         acks=all waits are full; nothing was written
        └── OffsetNotAvailable           code 25  retriable: the offset is in the log but above
                                                  the high watermark (a new leader catching up)

Codes are stable: a code is never reused for another meaning.  ``0`` means no error.
Layers translate foreign exceptions (``OSError``, ``msgspec.DecodeError``) into this tree
with ``raise ... from exc`` at their boundary.

**Outcome of a failed send.**  Every error that fails a producer's send carries
``maybe_stored``: ``False`` only when no attempt to write the records can have been
stored (never sent, or every attempt refused by the broker with an error whose
``appended_nothing`` is true); ``True`` when the fate of any attempt is unknown (a request
timed out or its connection broke after it was written, or the broker answered
``REQUEST_TIMED_OUT``).  The message says the same.  Errors not about a send leave it
``None``.
"""

from __future__ import annotations

import errno

NONE = 0


class SluiceError(Exception):
    """Base of every error Sluice raises."""

    retriable: bool = False
    # On an error that failed a send: may the records have been stored? (module docstring)
    maybe_stored: bool | None = None


class ConfigError(SluiceError, ValueError):
    """A local setting is invalid (raised before anything is sent)."""


class DataDirInUse(ConfigError):
    """The data directory is locked by another running broker."""


class ProtocolError(SluiceError):
    """Bytes that do not follow the Sluice wire protocol. The connection must be closed."""


class FrameTooLarge(ProtocolError):
    """A frame's length prefix is above the cap; nothing of that size was allocated."""


class CorruptRecord(ProtocolError):
    """A record batch whose header, length or CRC-32C does not check out."""


class ConnectionClosed(SluiceError):
    """The connection was closed or broken by the peer."""

    retriable = True


class ClientError(SluiceError):
    """An error local to the client; never sent on the wire."""


class ClientClosed(ClientError):
    """The client object was closed by its owner."""


class BufferExhausted(ClientError):
    """The producer's buffer memory stayed full for longer than ``max_block_ms``."""

    retriable = True


class DataLoss(ClientError):
    """Records a read was planned to return are gone: deleted by retention, or the topic
    was deleted (and maybe created again) since."""


class DeliveryTimeout(ClientError):
    """A send was not acknowledged within ``delivery_timeout_ms`` (retries included)."""

    retriable = True


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
        cls.code, cls.name, cls.retriable = code, name, retriable
        cls.appended_nothing = appended_nothing
        assert code not in _BY_CODE, code
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


@_code(20, "TOPIC_BEING_DELETED", retriable=True)
class TopicBeingDeleted(BrokerError):
    pass


@_code(21, "INVALID_RECORD")
class InvalidRecord(BrokerError):
    pass


@_code(22, "UNKNOWN_GROUP")
class UnknownGroup(BrokerError):
    pass


@_code(23, "NOT_ENOUGH_REPLICAS", retriable=True)
class NotEnoughReplicas(BrokerError):
    """An ``acks=all`` write refused at once: fewer in-sync replicas than the topic's
    ``min.insync.replicas``.  Fail fast instead of waiting for replicas (DESIGN §7)."""


@_code(24, "BROKER_BUSY", retriable=True)
class BrokerBusy(BrokerError):
    """A write refused at once because the partition holds as many pending writes or
    ``acks=all`` waits as it may (``write.queue.max.bytes``, ``replica.wait.max.*``)."""


@_code(25, "OFFSET_NOT_AVAILABLE", retriable=True)
class OffsetNotAvailable(BrokerError):
    """A fetch at an offset the partition has but may not show yet: above its high
    watermark.  Retry the same offset later; it is not out of range."""


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


def storage_error_from_os(exc: OSError, what: str) -> StorageError:
    """Translate an ``OSError`` from the data directory into a wire error."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"{what}: no space left on device")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyStorage(f"{what}: {exc.strerror}")
    return StorageError(f"{what}: {exc.strerror or exc}")
