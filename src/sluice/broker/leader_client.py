"""A client of this broker's to the leaders of partitions that other brokers lead.

The broker writes records of its own (dead letters, the audit copies of discarded half
messages: internal_writes.py) and asks whether a topic has subscriptions anywhere in the
cluster (``SubscriptionManager.names``).  What this broker leads it does in-process; only
a partition another broker leads is asked of that broker, over the ordinary protocol.

The client is made on first use, bootstrapped from the live brokers other than this one,
and it never sends a request to this broker: a partition whose leader, as the metadata
say, is this broker (a leadership moving) is refused with ``NotLeader``, for the caller to
try again (in-process, once this broker leads it).  With no other live broker every call
is refused so.

Event loop only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sluice.client.cluster import Cluster
from sluice.errors import ConnectionClosed, NotLeader, raise_for_code
from sluice.protocol import messages as m

REQUEST_TIMEOUT_S = 30.0


class LeaderClient:
    """Requests to the broker leading a partition, when that is another broker.

    ``live_brokers()``: the live brokers by node id, as the metadata store has them
    (``BrokerRegistration``: ``host``, ``port``); ``node_id``: this broker's."""

    def __init__(
        self, live_brokers: Callable[[], Mapping[int, object]], node_id: int, request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._live_brokers = live_brokers
        self._node_id = node_id
        self._timeout = request_timeout
        self._cluster: Cluster | None = None

    def _client(self) -> Cluster:
        if self._cluster is None:
            addresses = [f"{b.host}:{b.port}" for n, b in self._live_brokers().items() if n != self._node_id]
            if not addresses:
                raise NotLeader("no other live broker known to ask")
            self._cluster = Cluster(addresses, request_timeout=self._timeout)
        return self._cluster

    async def _leader(self, topic: str, partition: int):
        """The connection to the leader of ``topic``-``partition``, another broker."""
        cluster = self._client()
        leader = cluster.leader(topic, partition)
        if leader < 0:
            await cluster.refresh([topic])
            leader = cluster.leader(topic, partition)
        if leader < 0:
            raise NotLeader(f"{topic}-{partition} has no leader now")
        if leader == self._node_id:
            cluster.mark_stale(topic)
            raise NotLeader(f"{topic}-{partition} is led by this broker now")
        return await cluster.connection(leader)

    async def _request(self, topic: str, partition: int, req, attachments=(), timeout: float | None = None):
        try:
            conn = await self._leader(topic, partition)
            resp, _ = await conn.request(req, attachments, timeout or self._timeout)
        except (NotLeader, ConnectionClosed):
            if self._cluster is not None:  # asked again next time
                self._cluster.mark_stale(topic)
            raise
        return resp

    async def produce(self, topic: str, partition: int, data: bytes | bytearray, internal: bool = False) -> int:
        """Append ``data`` (whole record batches) to ``topic``-``partition`` at its leader,
        ``acks=all``; returns the base offset.  ``internal``: the produce is flagged as a
        broker's (it may write the internal topics brokers produce to, topics.py
        ``PRODUCED_INTERNAL``).  Raises what the leader answered (``NotLeader`` when it
        moved, after which the metadata are asked again)."""
        req = m.ProduceRequest(
            partitions=[m.ProducePartition(topic=topic, partition=partition, size=len(data))],
            acks=m.ACKS_ALL, timeout_ms=int(self._timeout * 1000), internal=internal,
        )
        resp = await self._request(topic, partition, req, (bytes(data),), self._timeout + 5)
        result = resp.partitions[0]
        if result.error:
            self._client().mark_stale(topic)
            raise_for_code(result.error, result.message)
        return result.base_offset

    async def subscription_names(self, topic: str, partition: int) -> set[str]:
        """The subscriptions of ``topic``-``partition``, asked of its leader (errors of the
        partition raised as the leader answered them)."""
        req = m.DescribeSubscriptionsRequest(topic=topic, partitions=[partition], subscription=None)
        resp = await self._request(topic, partition, req)
        for info in resp.subscriptions:
            if info.error:
                if info.error == NotLeader.code:
                    self._client().mark_stale(topic)
                raise_for_code(info.error, info.message)
        return {info.subscription for info in resp.subscriptions}

    async def close(self) -> None:
        if self._cluster is not None:
            await self._cluster.close()
            self._cluster = None
