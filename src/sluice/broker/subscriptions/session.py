"""One connection's subscription to a topic (``Session``): the partitions delivering to it
(``SubscriptionPartition``, delivery.py) and its credit.  Event loop only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.errors import BrokerError
from sluice.protocol import messages as m

if TYPE_CHECKING:
    from sluice.broker.subscriptions.delivery import SubscriptionPartition


class Session:
    """One connection's subscription to a topic: gets deliveries while it has credit."""

    def __init__(self, conn, topic: str, name: str, prefetch: int) -> None:
        self.conn = conn
        self.topic = topic
        self.name = name
        self.prefetch = max(1, prefetch)
        self.outstanding = 0  # delivered messages not settled yet
        self.parts: dict[int, SubscriptionPartition] = {}
        self.closed = False
        self.draining = False  # it released messages: shutting down, given nothing more

    @property
    def ready(self) -> bool:
        return (
            not self.closed and not self.draining and self.outstanding < self.prefetch and self.conn.writable
        )

    def credit_freed(self, n: int) -> None:
        was_full = self.outstanding >= self.prefetch
        self.outstanding -= n
        if was_full and self.outstanding < self.prefetch:
            for sp in self.parts.values():
                sp.wake()

    def end(self, partition: int, exc: BrokerError | None) -> None:
        """The partition stops delivering to this session; tell the client why."""
        self.parts.pop(partition, None)
        if exc is not None and not self.closed:
            self.conn.push(m.Push.SUBSCRIPTION_ENDED, 1, m.SubscriptionEnded(
                topic=self.topic, subscription=self.name, partition=partition, error=exc.code, message=exc.message,
            ))
