"""The broker's own writes into partitions: dead letters and the audit copies of discarded
half messages.

A partition this broker leads is written in-process, through one narrow callable, the
``Append`` the broker hands over (its produce service's ``append``, broker/produce.py); a
partition another broker leads is written through a client to that broker
(leader_client.py).  Never through a client to this broker itself.

The ``Append`` contract: ``await append(topic, partition, data, acks_all)`` appends
``data`` — one or more whole record batches, as a produce request carries them, built by
the caller (their base offsets are set on append) — to ``topic``-``partition`` if this
broker leads it, and returns the base offset of the first batch once it is acknowledged:
with ``acks_all``, once every in-sync replica has it (the produce path's ``acks=all``).
It raises ``NotLeader`` when this broker does not lead the partition (no replica here, a
follower, a leader giving up), ``UnknownTopic`` / ``UnknownPartition``, and whatever an
append raises (``NotEnoughReplicas`` with nothing written; ``RequestTimedOut``,
``NotEnoughReplicasAfterAppend``, ``StorageError``: maybe stored).  The batches are the
broker's own: internal topics are writable; a batch above the target topic's
``max.message.bytes`` is refused as a produce's is (``MessageTooLarge``).

Event loop only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sluice.broker.leader_client import LeaderClient
from sluice.errors import NotLeader

Append = Callable[[str, int, bytearray, bool], Awaitable[int]]


class InternalWrites:
    """Writes batches of the broker's own to a partition's leader: this broker in-process
    (``append``), another through ``leaders``."""

    def __init__(self, append: Append, leaders: LeaderClient) -> None:
        self._append = append
        self._leaders = leaders

    async def write(self, topic: str, partition: int, data: bytearray, internal: bool = False) -> int:
        """Append ``data`` with ``acks=all`` at the partition's leader; returns the base
        offset.  ``internal``: an internal topic's (brokers only).  Raises as the append or
        the leader does; ``NotLeader`` while no broker leads the partition, or while the
        metadata name this broker and it does not lead it yet (try again)."""
        try:
            return await self._append(topic, partition, data, True)
        except NotLeader:
            pass  # another broker leads it (or none does right now): written there
        return await self._leaders.produce(topic, partition, data, internal=internal)

    async def close(self) -> None:
        await self._leaders.close()
