"""The transaction APIs' structs (registered in messages.py, which re-exports them).

A transaction is a half message: a batch with the transactional attribute bit in its
target partition.  Its id is (topic, partition, offset) of that batch; its printable form
is ``topic/partition/offset`` (broker/transactions/, client/transaction.py,
protocol/transactions.py for its records).
"""

from __future__ import annotations

from sluice.protocol.structs import Response, Struct

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
