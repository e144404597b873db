"""This broker's view of its cluster: which brokers are alive, which one controls, whether
the metadata store answers and is still this cluster's, and whether this broker is leaving.

``ClusterView`` is read by every service that places or moves replicas (topics,
replication) and by the metadata answers; its follow loops (run by the broker, broker.py)
keep it as the store has it.  Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sluice.broker.liveness import PeerLiveness
from sluice.broker.wait import wait_event
from sluice.cluster.store import BrokerRegistration, MetadataStore
from sluice.errors import ClusterIdMismatch, MetadataUnavailable

log = logging.getLogger("sluice.broker")

CONTROLLER_POLL_S = 1.0
STORE_RETRY_S = 0.5  # asking whether the store is still this cluster's, while it does not answer
STORE_CHECK_S = 5.0  # ... and asking again while it does


class ClusterView:
    """Who is alive and who controls, as the store has them; whether the store is ours.

    Collaborators: ``store``, the metadata store; ``clustered``, whether the broker runs
    in a cluster (etcd) rather than alone; ``liveness``, told of every change of the live
    brokers (None alone).  ``controller_changed`` is set by the controller's campaign
    (cluster/controller.py) and by every change of the live brokers: it wakes the lookup
    of the controller."""

    def __init__(self, store: MetadataStore, clustered: bool, liveness: PeerLiveness | None) -> None:
        self.metadata = store
        self.clustered = clustered
        self.liveness = liveness
        self.live_brokers: dict[int, BrokerRegistration] = {}  # by node id, as the store has them
        self.controller_id = -1
        # the last time (monotonic) the metadata store answered, and why it does not now;
        # None: it does
        self.store_unreachable: tuple[float, str] | None = None
        self.cluster_id: str | None = None  # the store's, as the data directory records it
        # shutdown began: fetches answer at once, no new leaderships, no new topics
        self.draining = False
        # called (once) with why the broker must stop (the server stops, then raises it);
        # a broker alone stays up, fenced: it deletes nothing the store no longer lists
        self.on_fatal: Callable[[BaseException], None] = lambda exc: None
        self.controller_changed = asyncio.Event()
        self._fenced: ClusterIdMismatch | None = None

    async def store_is_ours(self, wait: bool = True) -> bool:
        """Whether the metadata store still holds this broker's cluster; asked before data
        is deleted because the store no longer lists it, and before what a wiped store
        would hand out again (producer ids, internal topics; storage/identity.py).  Waits
        while the store does not answer (``wait=False``: raises ``MetadataUnavailable``).
        On a mismatch (its metadata were wiped or replaced) it stops the broker through
        ``on_fatal`` and returns False: nothing may be deleted or created."""
        while self._fenced is None:
            try:
                await self.metadata.claim_cluster_id(self.cluster_id)
                return True
            except MetadataUnavailable:
                if not wait:
                    raise
                await asyncio.sleep(STORE_RETRY_S)
            except ClusterIdMismatch as exc:
                self._fenced = exc
                log.critical("%s; the broker stops, and keeps every replica it holds", exc)
                self.on_fatal(exc)
        return False

    async def check_store_identity(self) -> None:
        """Every ``STORE_CHECK_S``, ``store_is_ours`` (a cluster only): a broker whose etcd
        came back empty stops even if no deletion reaches it, instead of serving a store
        that no longer lists its replicas."""
        while self.clustered and await self.store_is_ours():
            await asyncio.sleep(STORE_CHECK_S)

    async def follow_brokers(self) -> None:
        """Keep ``live_brokers`` as the store has them."""
        while True:
            try:
                async for regs in self.metadata.watch_brokers():
                    self.live_brokers = {b.node_id: b for b in regs}
                    self.controller_changed.set()
                    if self.liveness is not None:
                        self.liveness.update(self.live_brokers)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following brokers failed; starting over")
                await asyncio.sleep(0.5)

    async def follow_controller(self) -> None:
        """Keep ``controller_id`` as the store has it: looked up when brokers change and
        every ``CONTROLLER_POLL_S`` (an election need not change the brokers).  A lookup
        that fails sets ``store_unreachable`` (metadata answers say so), with the time of
        the last answer, until one succeeds."""
        answered_at = time.monotonic()
        while True:
            await wait_event(self.controller_changed, CONTROLLER_POLL_S)
            self.controller_changed.clear()
            try:
                controller = await self.metadata.controller()
            except MetadataUnavailable as exc:
                if self.store_unreachable is None:
                    log.warning("the metadata store does not answer: %s", exc.message)
                self.store_unreachable = (answered_at, exc.message)
                continue
            answered_at = time.monotonic()
            if self.store_unreachable is not None:
                log.warning("the metadata store answers again")
                self.store_unreachable = None
                if self.clustered and not await self.store_is_ours():  # an etcd back empty?
                    return
            self.controller_id = -1 if controller is None else controller
