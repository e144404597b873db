"""The election of the controller in etcd, for an ``EtcdStore`` (etcd.py).

The controller key (``/sluice/<cluster>/controller``, ``{"node_id"}``) is held by the
winner's session lease; its ``create_revision`` is the controller epoch.  A term ends
(``Leadership.lost``) when the key stops being this term's (removed, replaced), when the
session is lost (``session_lost``, before etcd can elect another), or on ``resign``.

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import aetcd
import msgspec

from sluice.cluster.etcd_client import EtcdClient
from sluice.cluster.etcd_session import Session, SessionKeeper
from sluice.cluster.store import Leadership
from sluice.errors import MetadataUnavailable

log = logging.getLogger("sluice.cluster")

CAMPAIGN_LOG_EVERY_S = 30.0  # "campaign for controller waits" (etcd out): at most one line per this


class _Controller(msgspec.Struct):
    node_id: int


class Election:
    """Campaigns for, holds and gives up the controller ``key`` on ``etcd``, under the
    session kept by ``sessions``."""

    def __init__(self, etcd: EtcdClient, sessions: SessionKeeper, key: bytes) -> None:
        self._etcd = etcd
        self._sessions = sessions
        self._key = key
        self._leadership: Leadership | None = None

    def session_lost(self) -> None:
        """The session holding the key is lost: the term ends now."""
        if self._leadership is not None:
            log.error("controller epoch %d ends with the session", self._leadership.epoch)
            self._leadership.lost.set()
            self._leadership = None

    async def campaign(self, node_id: int) -> Leadership:
        key, value = self._key, msgspec.json.encode(_Controller(node_id))
        said_at = -math.inf  # the wait is logged once per CAMPAIGN_LOG_EVERY_S, not every try
        while not self._etcd.closed:
            if self._leadership is not None and not self._leadership.lost.is_set():
                return self._leadership
            try:
                s = self._sessions.live()
                t = self._etcd.transactions
                ok, got = await self._etcd.txn(
                    "campaign for controller",
                    [t.create(key) == 0], [t.put(key, value, lease=s.lease)], [t.get(key)],
                )
                if ok:
                    return self._elected(node_id, got[0].response_put.header.revision, s)
                if got[0]:
                    await self._wait_for_vacancy(key, got[0][0][1], s)
            except MetadataUnavailable as exc:
                if time.monotonic() - said_at >= CAMPAIGN_LOG_EVERY_S:
                    said_at = time.monotonic()
                    log.info("campaign for controller waits: %s", exc)
                await asyncio.sleep(min(0.5, self._etcd.request_timeout))
        raise MetadataUnavailable("the metadata store is closed")

    def _elected(self, node_id: int, epoch: int, s: Session) -> Leadership:
        lead = Leadership(node_id, epoch)
        if s.lost.is_set() or s is not self._sessions.current:
            lead.lost.set()  # lost while the answer travelled
            return lead
        self._leadership = lead
        self._etcd.spawn(self._guard(lead))
        log.info("node %d is the controller (epoch %d)", node_id, epoch)
        return lead

    async def _wait_for_vacancy(self, key: bytes, holder, s: Session) -> None:
        """Return once the controller key held as ``holder`` is gone, or after a while (the
        caller tries again).  A key left by this store's own earlier term is removed."""
        if holder.lease == s.lease:
            t = self._etcd.transactions
            await self._etcd.txn("remove an old term", [t.create(key) == holder.create_revision], [t.delete(key)])
            return
        start = holder.mod_revision + 1
        watch = await self._etcd.call("watch the controller", lambda c: c.watch(key, start_revision=start))
        try:
            async with asyncio.timeout(s.ttl):
                async for event in watch:
                    if event.kind == "DELETE":
                        return
        except TimeoutError:
            return
        except aetcd.ClientError as exc:
            raise MetadataUnavailable(f"watch the controller: {self._etcd.where()}: {exc}") from exc
        finally:
            await self._etcd.cancel(watch)

    async def _guard(self, lead: Leadership) -> None:
        """Set ``lead.lost`` once the controller key stops being this term's."""
        key = self._key
        held = False  # the first change list holds the key if it is there
        async for diff in self._etcd.follow(key):
            for k, kv in diff:
                if k == key:
                    held = kv is not None and kv.create_revision == lead.epoch
            if not held or lead.lost.is_set():
                break
        if self._leadership is lead:
            self._leadership = None
        if not lead.lost.is_set():
            log.error("controller epoch %d ended: its key was removed or replaced", lead.epoch)
            lead.lost.set()

    async def controller(self) -> int | None:
        key = self._key
        got = await self._etcd.call("read the controller", lambda c: c.get(key))
        return None if got is None else self._etcd.decode(key, got.value, _Controller).node_id

    async def resign(self) -> None:
        lead = self._leadership
        if lead is None:
            return
        lead.lost.set()
        t = self._etcd.transactions
        key = self._key
        await self._etcd.txn("resign as controller", [t.create(key) == lead.epoch], [t.delete(key)])
        if self._leadership is lead:
            self._leadership = None
        log.info("node %d resigned as controller (epoch %d)", lead.node_id, lead.epoch)
