"""Administration of the cluster as a whole: its status (brokers, controller, partitions
under-replicated or offline, each broker probed) and moving replicas and leaders
(``rebalance``, ``elect_leaders``).

What must not live here: per-topic requests (client/admin/topics.py); the status's own
shape and rendering (client/status.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from sluice import errors
from sluice.client.admin.routing import Routing
from sluice.client.status import ClusterStatus
from sluice.client.transport import Connection, ConnectionFactory
from sluice.protocol import messages
from sluice.protocol.messages import ElectionResult, ReplicaMove

PROBE_TIMEOUT_MS = 1000  # cluster_status: a live broker that does not answer within this is shown so


@dataclass(frozen=True)
class Rebalance:
    """What ``Admin.rebalance`` changed: replicas replaced or moving (``moves``, each with
    ``error`` 0; ``pending`` for moves onto brokers holding fewer, done in two phases) or
    not (an error), then leaders moved or not (``elections``), by topic and partition."""

    moves: list[ReplicaMove]
    elections: list[ElectionResult]


class ClusterAdmin:
    """Status and placement of a cluster's brokers and replicas.  Concurrency: event loop
    only."""

    def __init__(self, routing: Routing, factory: ConnectionFactory | None) -> None:
        """``routing``: sends the requests; ``factory``: opens the probes' connections
        (None: plain ``Connection.open``)."""
        self._routing = routing
        self._factory = factory

    async def status(self, probe_timeout_ms: float = PROBE_TIMEOUT_MS) -> ClusterStatus:
        """The live brokers, the controller, and the under-replicated and offline
        partitions of every topic, from one metadata request (see ``client.status``); then
        each broker listed as alive is asked directly, on a connection of its own, within
        ``probe_timeout_ms`` (0: not asked): one that died or is paused stays listed until
        its registration lapses, and is shown as not answering (``BrokerStatus.no_answer``)."""
        resp = await self._routing.request(messages.MetadataRequest(topics=None))
        status = ClusterStatus.from_metadata(resp)
        if probe_timeout_ms <= 0 or not resp.brokers:
            return status
        timeout = probe_timeout_ms / 1000
        reasons = await asyncio.gather(*(self._probe(b.host, b.port, timeout) for b in resp.brokers))
        return status.with_probes({b.node_id: why for b, why in zip(resp.brokers, reasons, strict=True) if why})

    async def _probe(self, host: str, port: int, timeout: float) -> str:
        """Why the broker at ``host:port`` did not answer a metadata request (for no topic)
        on a new connection within ``timeout`` seconds, connecting included; ``""`` when it
        did."""
        conn = None
        try:
            async with asyncio.timeout(timeout):
                if self._factory is not None:
                    conn = await self._factory(host, port)
                else:
                    conn = await Connection.open(host, port, connect_timeout=timeout, handshake_timeout=timeout)
                await conn.request(messages.MetadataRequest(topics=[]), timeout=timeout)
        except TimeoutError:
            return f"no answer within {timeout:g} s"
        except errors.SluiceError as exc:
            return str(exc)
        finally:
            if conn is not None:
                conn.close()
        return ""

    async def rebalance(self, topics: Iterable[str] | None = None, *, reassign: bool = True) -> Rebalance:
        """With ``reassign``, first replace the replicas of brokers that are not alive in
        every partition of ``topics`` (None: all topics) that has a live leader: each by
        the least loaded live broker not yet holding the partition (the new replica copies
        it from the leader and joins the ISR once caught up; the dead broker drops its copy
        when it comes back).  Then, where live brokers hold uneven numbers of replicas (a
        broker joined), record moves that even them out (``pending`` moves: the new
        replica is added, the old one dropped by the controller once the new one is in
        sync).  Then give partitions without a live leader one, and move leadership back
        to preferred replicas (see ``Admin.elect_leaders``).

        A broker older than replica reassignment ignores ``reassign``: ``moves`` is then
        empty.  Raises ``UnsupportedVersion`` when the broker does not serve leader
        election at all.
        """
        req = messages.ElectLeadersRequest(
            topics=None if topics is None else sorted(set(topics)), reassign=reassign
        )
        try:
            resp = await self._routing.request(req)
        except errors.UnsupportedVersion as exc:
            raise errors.UnsupportedVersion(
                f"the broker does not support leader election (ELECT_LEADERS): upgrade the "
                f"brokers ({exc.message})"
            ) from exc
        return Rebalance(
            moves=sorted(resp.moves, key=lambda r: (r.topic, r.partition)),
            elections=sorted(resp.partitions, key=lambda r: (r.topic, r.partition)),
        )
