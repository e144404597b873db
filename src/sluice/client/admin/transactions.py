"""Administration of unresolved transactions and pending delayed messages: list them
across the cluster, end one by its id.

What must not live here: producing transactional messages (client/transaction.py, whose
``end_transaction`` does the ending).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice import errors
from sluice.client.cluster import Cluster
from sluice.protocol import messages


async def list_transactions(
    cluster: Cluster, topics: Iterable[str] | None = None, delayed: bool = False
) -> list[messages.TransactionInfo]:
    """Unresolved half messages, oldest first: each broker answers for the partitions
    it leads, so every broker of the cluster is asked.  ``delayed=True``: the pending
    delayed messages instead (one entry per stored batch, ``count`` messages due at
    ``deliver_at``), soonest due first; ``end_transaction`` on one's id delivers it
    now (commit) or cancels it (rollback)."""
    resp = await cluster.refresh(None if topics is None else list(topics))
    for t in resp.topics if topics is not None else ():
        errors.raise_for_code(t.error, t.message or t.name)
    request = messages.ListTransactionsRequest(topics=None if topics is None else list(topics), delayed=delayed)
    out: list[messages.TransactionInfo] = []
    for node in sorted(cluster.brokers):
        conn = await cluster.connection(node)
        response, _ = await conn.request(request, (), cluster.request_timeout)
        out += response.transactions
    seen, unique = set(), []
    for t in sorted(out, key=lambda t: (t.deliver_at, t.timestamp, t.topic, t.partition, t.offset)):
        if (t.topic, t.partition, t.offset) not in seen:  # a leader moving while asked
            seen.add((t.topic, t.partition, t.offset))
            unique.append(t)
    return unique


async def end_transaction(cluster: Cluster, txn_id: str, commit: bool, retry_timeout_ms: float = 10_000):
    """Commit or roll back the half message ``topic/partition/offset`` at its leader (see
    ``TransactionProducer.end_transaction``); ``ConfigError`` for a malformed id."""
    from sluice.client.transaction import end_transaction, parse_id

    try:
        topic, partition, offset = parse_id(txn_id)
    except ValueError as exc:
        raise errors.ConfigError(str(exc)) from None
    return await end_transaction(
        cluster, topic, partition, offset, commit, retry_timeout_ms / 1000, cluster.request_timeout
    )
