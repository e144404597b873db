"""The session of an ``EtcdStore`` (etcd.py): one lease, renewed, replaced once lost.

One lease per store, granted with a TTL of ``session_timeout_ms`` (whole seconds; etcd may
grant more, at least 1.5 × its election timeout) and renewed every third of it.  The
broker registration and the controller key are attached to it.  When no renewal succeeded
for a whole TTL (etcd unreachable, or the lease expired there) the session is lost:
``on_lost`` runs at once (the controller's term ends before etcd can elect another), and
as soon as etcd answers again a new lease is taken, ``on_new`` runs (the broker registers
again) and the old lease is revoked (so its keys go at once).

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sluice.cluster.etcd_client import EtcdClient
from sluice.errors import MetadataUnavailable

log = logging.getLogger("sluice.cluster")


@dataclass
class Session:
    lease: int
    ttl: float  # as granted, seconds
    expires: float  # monotonic time from which etcd may have let the lease expire
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    failing: bool = False  # the last renewal failed (logged once)


class SessionKeeper:
    """Keeps the store's session on ``etcd`` alive (module docstring); ``ttl`` in whole
    seconds.  ``on_lost()`` runs when a session is lost; ``on_new()`` is awaited once a
    lost one is replaced."""

    def __init__(
        self, etcd: EtcdClient, ttl: int, *,
        on_lost: Callable[[], None], on_new: Callable[[], Awaitable[None]],
    ) -> None:
        self._etcd = etcd
        self.ttl = ttl
        self._on_lost = on_lost
        self._on_new = on_new
        self.current: Session | None = None
        self._stale_leases: list[int] = []  # of lost sessions, to revoke once etcd answers
        self._leaving = False  # the broker is stopping: a lost session is not replaced

    async def start(self) -> None:
        """Take a session and keep it alive (in a task of the store)."""
        self.current = await self._new_session()
        self._etcd.spawn(self._keep_alive())

    def leaving(self) -> None:
        self._leaving = True

    async def close(self) -> None:
        """End the session: its lease is revoked if etcd answers (else it expires)."""
        if self.current is not None:
            self._stale_leases.append(self.current.lease)
            self.current.lost.set()
        await self._revoke_stale_leases()

    def live(self) -> Session:
        """The session, or ``MetadataUnavailable`` while there is none."""
        s = self.current
        if self._etcd.closed or s is None or s.lost.is_set():
            raise MetadataUnavailable(
                f"no session with {self._etcd.where()} (etcd unreachable, or the session expired: "
                "a new one is being made); retry"
            )
        return s

    async def _new_session(self) -> Session:
        sent = time.monotonic()
        lease = await self._etcd.call("grant a session lease", lambda c: c.lease(self.ttl))
        return Session(lease.id, float(lease.ttl), sent + lease.ttl)

    async def _keep_alive(self) -> None:
        """Renew the session every third of its TTL; replace it once lost (module docstring)."""
        retry = min(0.5, self.ttl / 6)
        next_try = time.monotonic()
        while True:
            try:
                next_try = await self._renew_or_replace(next_try, retry)
            except Exception:  # a bug: keep the session alive regardless
                log.exception("etcd session upkeep failed")
                next_try = time.monotonic() + retry

    async def _renew_or_replace(self, next_try: float, retry: float) -> float:
        """One step of ``_keep_alive``; returns when to try the next renewal."""
        s = self.current
        if s is None and self._leaving:
            await asyncio.sleep(retry)
            return next_try
        if s is None:
            try:
                s = await self._new_session()
            except MetadataUnavailable:
                await asyncio.sleep(retry)
                return next_try
            self.current = s
            log.warning("new etcd session with %s", self._etcd.where())
            await self._on_new()
            await self._revoke_stale_leases()
            return time.monotonic() + s.ttl / 3
        await asyncio.sleep(max(0.0, min(next_try, s.expires) - time.monotonic()))
        sent = time.monotonic()
        if sent >= s.expires:
            self._lose(s, f"not renewed for {s.ttl:g} s")
            return sent
        try:
            reply = await self._etcd.call(
                "renew the session lease", lambda c: c.refresh_lease(s.lease),
                timeout=min(self._etcd.request_timeout, s.expires - sent),
            )
        except MetadataUnavailable as exc:
            (log.debug if s.failing else log.warning)("%s", exc)
            s.failing = True
            return time.monotonic() + retry
        if reply is None or reply.TTL <= 0:
            self._lose(s, "the lease expired in etcd")
            return sent
        s.expires, s.failing = sent + s.ttl, False
        return sent + s.ttl / 3

    def _lose(self, s: Session, why: str) -> None:
        log.error("etcd session lost (%s): %s", why, self._etcd.where())
        s.lost.set()
        self.current = None
        self._stale_leases.append(s.lease)
        self._on_lost()

    async def _revoke_stale_leases(self) -> None:
        while self._stale_leases:
            lease = self._stale_leases[0]
            try:
                await self._etcd.call("revoke an old lease", lambda c, lease=lease: c.revoke_lease(lease))
            except MetadataUnavailable as exc:
                if "lease not found" not in str(exc):
                    return  # unreachable: it expires by itself, or is revoked with the next one
            self._stale_leases.pop(0)
