"""Transactional messages on the broker (``TransactionManager``): the transaction state of
every partition led here, the producers registered for check-backs, and the APIs
END_TRANSACTION, REGISTER_PRODUCER and LIST_TRANSACTIONS.

Its collaborators are given to its constructor:

- ``topics``: the topics by name (broker/topics.py ``Topic``: ``internal``, ``count``,
  ``partitions`` — the replicas held here), the broker's live mapping, read only;
- ``led_partition(topic, index)``: the ``Partition`` if led here (``NotLeader``,
  ``UnknownTopic``, ``UnknownPartition`` otherwise);
- ``executor``: where log scans and reads run;
- ``check_timeout_ms``, ``check_interval_ms``, ``max_checks``: the check-back settings;
- ``create_topic`` and ``admin_lock``, ``stored_topics()``, ``groups_ready()``: what the
  audit topic's creation needs (audit.py);
- ``append``, ``new_producer_id()``, ``live_brokers()`` and ``node_id``: the broker's own
  writes, in-process or through the audit partition's leader (broker/internal_writes.py).

Concurrency: event loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

from sluice.broker.internal_writes import Append, InternalWrites, NewProducerId
from sluice.broker.leader_client import LeaderClient
from sluice.broker.peer import Peer
from sluice.broker.transactions.audit import AuditCopies
from sluice.broker.transactions.check_back import CheckBack
from sluice.broker.transactions.partition import PartitionTransactions
from sluice.errors import InvalidRequest, NotLeader, UnknownTransaction
from sluice.protocol import messages as m
from sluice.protocol.records import TRANSACTIONAL_BIT, batch_attributes


class TransactionManager:
    """Transaction state of every partition led here, check-back, and the three APIs."""

    def __init__(
        self,
        topics: Mapping[str, object],
        led_partition: Callable[[str, int], object],
        executor,
        *,
        check_timeout_ms: int,
        check_interval_ms: int,
        max_checks: int,
        create_topic: Callable[..., Awaitable[None]],
        admin_lock: asyncio.Lock,
        stored_topics: Callable[[], Awaitable[Mapping[str, object]]],
        groups_ready: Callable[[], bool],
        append: Append,
        new_producer_id: NewProducerId,
        live_brokers: Callable[[], Mapping[int, object]],
        node_id: int,
    ) -> None:
        self._topics = topics
        self._led_partition = led_partition
        self._executor = executor
        self.states: dict[tuple[str, int], PartitionTransactions] = {}
        self.producers: dict[str, list] = {}  # group -> live connections that registered it
        writes = InternalWrites(append, LeaderClient(live_brokers, node_id), new_producer_id)
        self._audit = AuditCopies(topics, create_topic, admin_lock, stored_topics, groups_ready, writes)
        self.check_back = CheckBack(
            self.led_states, self.producers, executor, self._audit,
            check_timeout_ms / 1000, check_interval_ms / 1000, max_checks,
        )

    # ------------------------------------------------------------------ state

    def state(self, part) -> PartitionTransactions | None:
        """The state of a partition led here (new after a change of leader epoch)."""
        if not part.is_leader:
            self.states.pop((part.topic, part.index), None)
            return None
        key = (part.topic, part.index)
        st = self.states.get(key)
        if st is None or st.part is not part or st.epoch != part.leader_epoch:
            st = self.states[key] = PartitionTransactions(part, self._executor)
        return st

    def track(self, part, spans, data, fut: asyncio.Future) -> None:
        """Produce path: note an append holding transactional batches (per-batch check)."""
        if any(batch_attributes(data, s.pos) & TRANSACTIONAL_BIT for s in spans):
            st = self.state(part)
            if st is not None:
                st.track(fut)

    def led(self, topics=None) -> Iterator:
        """The partitions led here of the ordinary topics (of ``topics`` only, if given)."""
        for name, topic in list(self._topics.items()):
            if topic.internal or (topics is not None and name not in topics):
                continue
            for part in list(topic.partitions.values()):
                if part.is_leader:
                    yield part

    def led_states(self) -> Iterator[PartitionTransactions]:
        """The states of the partitions led here, one at a time (lazily: leadership may
        move while a caller awaits between two)."""
        for part in self.led():
            st = self.state(part)
            if st is not None:
                yield st

    # ------------------------------------------------------------------ handlers

    async def end_transaction(self, req: m.EndTransactionRequest, _att, _peer: Peer):
        if req.offset < 0 or req.partition < 0:
            raise InvalidRequest(f"bad transaction id {req.topic}/{req.partition}/{req.offset}")
        part = self._led_partition(req.topic, req.partition)
        if self._topics[req.topic].internal:
            raise UnknownTransaction(f"topic {req.topic} is internal: it holds no transactions")
        st = self.state(part)
        if st is None:
            raise NotLeader(f"this broker does not lead {req.topic}-{req.partition}")
        state, at, already = await st.end(req.offset, req.commit, max(req.timeout_ms, 1) / 1000)
        return m.EndTransactionResponse(state=state, offset=at, already=already), ()

    async def register_producer(self, req: m.RegisterProducerRequest, _att, peer: Peer):
        if not req.group:
            raise InvalidRequest("a producer group must be a non-empty string")
        conn = peer
        if conn is None:
            raise InvalidRequest("REGISTER_PRODUCER needs a connection")
        conns = self.producers.setdefault(req.group, [])
        if conn not in conns:
            conns.append(conn)
            conn.on_close(lambda c=conn, g=req.group: self._unregister(g, c))
        return m.RegisterProducerResponse(), ()

    def _unregister(self, group: str, conn) -> None:
        conns = self.producers.get(group, [])
        if conn in conns:
            conns.remove(conn)
        if not conns:
            self.producers.pop(group, None)

    async def list_transactions(self, req: m.ListTransactionsRequest, _att, _peer: Peer):
        topics = None if req.topics is None else set(req.topics)
        now = _now_ms()
        out: list[m.TransactionInfo] = []
        for part in self.led(topics):
            st = self.state(part)
            if st is None:
                continue
            await st.catch_up()
            for h in sorted(st.open.values(), key=lambda h: h.offset):
                if h.delayed != req.delayed:
                    continue
                out.append(m.TransactionInfo(
                    topic=part.topic, partition=part.index, offset=h.offset, group=h.group,
                    timestamp=h.timestamp, checks=h.checks, age_ms=max(now - h.timestamp, 0),
                    deliver_at=h.deliver_at, count=h.count,
                ))
        return m.ListTransactionsResponse(transactions=out), ()

    def handlers(self) -> dict:
        return {
            m.Api.END_TRANSACTION: self.end_transaction,
            m.Api.REGISTER_PRODUCER: self.register_producer,
            m.Api.LIST_TRANSACTIONS: self.list_transactions,
        }

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """The check-back loop (a broker task: check_back.py)."""
        await self.check_back.run()

    async def close(self) -> None:
        """Stop discarding and close the client to the other brokers."""
        await self.check_back.close()
        await self._audit.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
