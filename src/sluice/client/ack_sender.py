"""The settlements of a subscriber (client/subscriber.py) not sent yet, and sending them.

Settling a message is cheap: it notes the offset in the partition's ``Pending``
(client/settling.py).  ``AckSender`` sends what was noted every ``ack_interval_ms``, or at
once when a quarter of ``prefetch`` settlements are waiting (or a nack or touch came), as
offset ranges, one ACK request per broker connection.  A partition not served now keeps its
acks and nacks for its next session; touches and releases go with the deliveries they were
for.  A broker refusing a partition's acks ends that partition's session (``lost``).

What must not live here: which session a message belongs to, ordered delivery, or the
messages themselves (the subscriber).  Concurrency: event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sluice import errors
from sluice.client.settling import Pending, runs
from sluice.client.transport import Connection
from sluice.protocol import messages as m
from sluice.protocol.ranges import RangeSet

log = logging.getLogger("sluice.client.subscriber")


class AckSender:
    """Per partition, the settlements noted and not sent yet (``pending``)."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        served: dict[int, Connection],
        lost: Callable[[int, Connection], None],
        *,
        prefetch: int,
        ack_interval: float,
    ) -> None:
        """``served``: the subscriber's partition -> connection delivering it, read at each
        send (a live view: the subscriber changes it); ``lost(partition, conn)``: a broker
        refused the partition's acks; ``prefetch``: the subscriber's credit per connection
        (a quarter of it waiting makes a send happen now); ``ack_interval``: seconds between
        sends otherwise."""
        self.topic = topic
        self.subscription = subscription
        self._served = served
        self._lost = lost
        self._ack_interval = ack_interval
        # replaced (not cleared) by each send: read it through this object, never keep it
        self.pending: dict[int, Pending] = {}
        self.count = 0  # settlements noted since the last send
        self.flush_at = max(1, prefetch // 4)  # settlements that make a send happen now
        self.flush_now = asyncio.Event()
        self._requests: set[asyncio.Task] = set()

    def pending_for(self, partition: int) -> Pending:
        p = self.pending.get(partition)
        if p is None:
            p = self.pending[partition] = Pending()
        return p

    async def loop(self) -> None:
        """Send every ``ack_interval`` seconds, or as soon as ``flush_now`` is set.  Runs
        until cancelled (by ``Subscriber.close``)."""
        while True:
            try:
                async with asyncio.timeout(self._ack_interval):
                    await self.flush_now.wait()
            except TimeoutError:
                pass
            self.flush_now.clear()
            await self.flush(wait=False)

    async def flush(self, wait: bool) -> None:
        """Send what is pending; with ``wait``, wait for the answers to every send in flight."""
        if not self.pending:
            if wait and self._requests:
                await asyncio.gather(*list(self._requests), return_exceptions=True)
            return
        pending, self.pending = self.pending, {}
        self.count = 0
        by_conn: dict[Connection, list[m.AckPartition]] = {}
        for partition, p in pending.items():
            conn = self._served.get(partition)
            if conn is None or conn.closed:
                # not served now (a restart, a leader change): acked ones wait for the next
                # leader (which takes acks of what it has not delivered itself); nacks,
                # touches and releases concern deliveries that are gone with the connection
                # (the subscriber's ``_lost`` drops the nacks)
                if p.acks or p.nack_delays:
                    p.touches, p.releases = RangeSet(), RangeSet()
                    self.pending[partition] = p
                continue
            parts = by_conn.setdefault(conn, [])
            base = dict(acks=runs(p.acks), touches=p.touches.pairs(), releases=p.releases.pairs())
            nack_parts = p.nack_parts() if p.nack_delays else ()
            if not nack_parts:
                parts.append(m.AckPartition(partition=partition, **base))
                continue
            for delay, reason, nacks in nack_parts:  # the acks, touches and releases in the first
                parts.append(m.AckPartition(
                    partition=partition, nacks=nacks.pairs(), nack_delay_ms=delay, reason=reason, **base,
                ))
                base = {}
        for conn, parts in by_conn.items():
            req = m.AckRequest(topic=self.topic, subscription=self.subscription, partitions=parts)
            task = asyncio.ensure_future(self._send(conn, req))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
        if wait and self._requests:
            await asyncio.gather(*list(self._requests), return_exceptions=True)

    async def _send(self, conn: Connection, req: m.AckRequest) -> None:
        try:
            resp, _ = await conn.request(req)
        except errors.SluiceError as exc:  # lost: the broker delivers those messages again
            log.debug("acks to %s:%d lost: %s", conn.host, conn.port, exc)
            return
        for r in resp.partitions:
            if r.error:
                log.debug("acks of %s-%d refused: %s", self.topic, r.partition, r.message)
                self._lost(r.partition, conn)
