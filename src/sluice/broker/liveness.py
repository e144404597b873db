"""Peer liveness: a broker that notices another broker's process is gone ends that
broker's registration at once, instead of waiting for its session to lapse.

A session (cluster/etcd_session.py) ends ``session_timeout_ms`` after its broker stopped
renewing it: the only evidence a paused or cut-off broker leaves.  A broker whose process
died leaves better evidence, at once: its connections reset or close, and its port refuses new
ones (no process listens there any more).  So every broker of a cluster keeps one idle
connection to each other live broker (``PeerLiveness``); when it closes, the broker tries
the peer's registered address again: refused ``REFUSALS`` times in a row, ``CONFIRM_GAP_S``
apart, within ``CONFIRM_WINDOW_S``, it ends the peer's registration (``MetadataStore.end_registration``), and the controller
elects new leaders for the partitions it led as it would after a lapsed session.

Only a refused connection counts.  A connect that times out (a host down, a network
partition), a peer that accepts and then closes (a proxy cut off from it), or one that
accepts and never answers (SIGSTOP: the kernel still accepts for a stopped process) is no
evidence: those brokers are fenced by their sessions, as before.  A serving broker closes
its listener only when it stops, so a refusal after a working connection means that
process stopped listening; the registration ended is the one
read while that connection was open, the session of that very process (a broker restarted
meanwhile registered under a new session, which is left alone).  A port refused before any connection worked (a broker
still recovering its logs, not serving yet) is no evidence either.

Why this cannot give a partition a second leader that acknowledges: see "Fast failover" in
docs/design.md (the short of it: an election is a compare-and-swap in a new leader epoch,
and the old leader's ``acks=all`` needs fetches from its in-sync followers, who follow the
new leader once they see its epoch).

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging

from sluice.client.transport import Connection
from sluice.cluster.store import BrokerRegistration, MetadataStore
from sluice.errors import MetadataUnavailable, SluiceError

log = logging.getLogger("sluice.liveness")

REFUSALS = 2  # refused connects that confirm a peer's process is gone
CONFIRM_GAP_S = 0.1  # between them
CONFIRM_WINDOW_S = 1.0  # after a lost connection: how long its port is tried
CONNECT_TIMEOUT_S = 2.0
RETRY_S = 0.5  # after a connect that did not work, or a store that did not answer


async def refused(host: str, port: int) -> bool:
    """Whether a TCP connect to ``host:port`` is refused (nothing listens there); False
    for a connect that works, times out or fails otherwise."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            transport, _ = await loop.create_connection(asyncio.Protocol, host, port)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False
    transport.close()
    return False


class PeerLiveness:
    """One watcher task per other live broker (``update``); ``close`` stops them."""

    def __init__(self, store: MetadataStore, node_id: int) -> None:
        self.store = store
        self.node_id = node_id
        self._watchers: dict[int, tuple[BrokerRegistration, asyncio.Task]] = {}

    def update(self, live: dict[int, BrokerRegistration]) -> None:
        """The live brokers as the store has them now: watch each other one (again, when
        its address changed), stop watching those gone."""
        for node, (reg, task) in list(self._watchers.items()):
            if live.get(node) != reg:
                task.cancel()
                del self._watchers[node]
        loop = asyncio.get_running_loop()
        for node, reg in live.items():
            if node != self.node_id and node not in self._watchers:
                task = loop.create_task(self._watch(reg), name=f"liveness of broker {node}")
                task.add_done_callback(lambda t, node=node: self._ended(node, t))
                self._watchers[node] = (reg, task)

    def _ended(self, node: int, task: asyncio.Task) -> None:
        """A watcher that failed is logged and forgotten, so that the next ``update``
        starts it again (its peer's session still fences it meanwhile)."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("watching broker %d failed", node, exc_info=task.exception())
        if self._watchers.get(node, (None, None))[1] is task:
            del self._watchers[node]

    async def close(self) -> None:
        tasks = [task for _, task in self._watchers.values()]
        self._watchers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, reg: BrokerRegistration) -> None:
        while True:
            try:
                conn = await Connection.open(
                    reg.host, reg.port, connect_timeout=CONNECT_TIMEOUT_S, handshake_timeout=CONNECT_TIMEOUT_S
                )
            except SluiceError:  # not serving (yet): no evidence of anything
                await asyncio.sleep(RETRY_S)
                continue
            try:
                token = await self._token(reg, conn)
                log.debug("watching broker %d at %s:%d", reg.node_id, reg.host, reg.port)
                await conn.wait_closed()
            finally:
                conn.close()
            log.debug("connection to broker %d lost; is its port refused?", reg.node_id)
            if token is not None and await self._confirmed_gone(reg):
                await self._end(reg, token)
            await asyncio.sleep(RETRY_S)

    async def _token(self, reg: BrokerRegistration, conn: Connection) -> int | None:
        """The token of ``reg``'s registration, read while ``conn`` to it is open: the
        session of the very process connected to (a process that registers again, after
        its session lapsed, keeps the connection but not the token: then its session is
        what ends it).  None when the connection closed first."""
        while not conn.closed:
            try:
                token = await self.store.registration_token(reg.node_id)
            except MetadataUnavailable:
                token = None
            if token is not None and not conn.closed:
                return token
            closed = asyncio.ensure_future(conn.wait_closed())
            await asyncio.wait([closed], timeout=RETRY_S)  # the store is out, or not registered yet
            closed.cancel()
        return None

    async def _confirmed_gone(self, reg: BrokerRegistration) -> bool:
        """``REFUSALS`` refused connects in a row, ``CONFIRM_GAP_S`` apart, within
        ``CONFIRM_WINDOW_S`` of the loss.  A connect that works does not end the look at
        once: a process being killed closes its connections a moment before its listener,
        and that listener still accepts meanwhile."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CONFIRM_WINDOW_S
        in_a_row = 0
        while in_a_row < REFUSALS:
            if loop.time() > give_up:
                return False
            in_a_row = in_a_row + 1 if await refused(reg.host, reg.port) else 0
            if in_a_row < REFUSALS:
                await asyncio.sleep(CONFIRM_GAP_S)
        return True

    async def _end(self, reg: BrokerRegistration, token: int) -> None:
        try:
            if await self.store.end_registration(reg.node_id, token):
                log.warning(
                    "broker %d at %s:%d refuses connections (its process is gone): its registration "
                    "ends now, not after its session timeout", reg.node_id, reg.host, reg.port,
                )
        except MetadataUnavailable as exc:  # its session lapses in time anyway
            log.warning("cannot end the registration of broker %d: %s", reg.node_id, exc)
