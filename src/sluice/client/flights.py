"""What the producer's sender has on its way: produce requests in flight and, per partition,
the counts and backoffs that decide when it may send again.

``Flight`` is one request; ``InFlight`` the bookkeeping that the request builder
(client/sender.py), the leader follower (client/leaders.py), the retries (client/retries.py)
and the answers (client/answers.py) share.  Nothing here sends or decides: it only counts.

Concurrency: the producer's loop only.
"""

from __future__ import annotations

import asyncio

from sluice.client.accumulator import Batch

TP = tuple[str, int]


class Flight:
    """One produce request on its way: its node, its batches by partition (a partition
    given up to a new leader leaves ``batches`` and ``flat``), when it was made."""

    __slots__ = ("node", "batches", "flat", "sent_at", "slow", "moved")

    def __init__(self, node: int, batches: dict[TP, list[Batch]], flat: list[Batch], sent_at: float) -> None:
        self.node, self.batches, self.flat, self.sent_at = node, batches, flat, sent_at
        self.slow = False  # its node was told to the cluster as failing (SLOW_REQUEST_S)
        self.moved = False  # some partition of it was given up


class InFlight:
    """The sender's requests and per-partition send state (module docstring).

    - ``flights``: requests made and not ended; ``requests``: their tasks.
    - ``batches``: batches in flight per partition; ``nodes``: requests in flight per node.
    - ``unwritten``: requests per node whose task writes them (a count that only close(),
      which cancels tasks that may not have started, can leave behind).
    - ``sent_to``: the node each partition's last request went to.
    - ``retry_at``: when a partition's backoff ends; ``failures``: its consecutive failed
      attempts.
    """

    __slots__ = ("flights", "requests", "batches", "nodes", "unwritten", "sent_to", "retry_at", "failures")

    def __init__(self) -> None:
        self.flights: set[Flight] = set()
        self.requests: set[asyncio.Task] = set()
        self.batches: dict[TP, int] = {}
        self.nodes: dict[int, int] = {}
        self.unwritten: dict[int, int] = {}
        self.sent_to: dict[TP, int] = {}
        self.retry_at: dict[TP, float] = {}
        self.failures: dict[TP, int] = {}
