"""The subscription APIs: SUBSCRIBE, ACK, CREATE / DELETE / SEEK / DESCRIBE_SUBSCRIPTIONS.

Each handler takes the decoded request and the frame's attachments and returns the
response and its attachments; per-partition failures go into the response.  They reach
the partitions through the ``SubscriptionManager`` (manager.py), which loads them on first
use.  SUBSCRIBE ties a ``Session`` (session.py) to the connection the request came on:
deliveries are pushed on it, and its partitions redeliver what it held when it closes.

Concurrency: event loop only.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sluice.broker.peer import Peer
from sluice.broker.subscriptions.partition import PartitionSubscriptions
from sluice.broker.subscriptions.session import Session
from sluice.errors import BrokerError, NotLeader, SubscriptionAlreadyExists
from sluice.protocol import messages as m
from sluice.protocol import subscriptions as sub

if TYPE_CHECKING:
    from sluice.broker.subscriptions.manager import SubscriptionManager


class SubscriptionHandlers:
    """The handlers of the subscription APIs, over ``manager``; the sessions of the
    connections that subscribed."""

    def __init__(self, manager: SubscriptionManager) -> None:
        self._manager = manager
        self._sessions: dict[tuple[int, str, str], Session] = {}

    def table(self) -> dict:
        """API key -> handler."""
        return {
            m.Api.SUBSCRIBE: self.subscribe,
            m.Api.ACK: self.ack,
            m.Api.CREATE_SUBSCRIPTION: self.create,
            m.Api.DELETE_SUBSCRIPTION: self.delete,
            m.Api.SEEK_SUBSCRIPTION: self.seek,
            m.Api.DESCRIBE_SUBSCRIPTIONS: self.describe,
        }

    async def _each(
        self, topic: str, partitions: list[int], fn, stranded: bool = False,
    ) -> list[m.SubscriptionPartitionResult]:
        """``fn(ps)`` for each partition: its result (None: a bare success); per-partition
        errors in the results.  ``stranded``: see ``partition``."""
        self._manager.topic(topic)

        async def one(p: int) -> m.SubscriptionPartitionResult:
            try:
                got = await fn(await self._manager.partition(topic, p, stranded))
            except BrokerError as exc:
                return m.SubscriptionPartitionResult(partition=p, error=exc.code, message=exc.message)
            return got if got is not None else m.SubscriptionPartitionResult(partition=p)

        return list(await asyncio.gather(*(one(p) for p in partitions)))

    async def subscribe(self, req: m.SubscribeRequest, _att, peer: Peer):
        sub.check_name(req.subscription)
        create = sub.check_config(req.create) if req.create is not None else None
        conn = peer
        key = (id(conn), req.topic, req.subscription)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session(conn, req.topic, req.subscription, req.prefetch)
            conn.on_close(lambda: self._session_closed(key))
        session.prefetch = max(1, req.prefetch)
        check = _Once(lambda: self._manager.check_new(req.topic, req.subscription, create))

        async def attach(ps: PartitionSubscriptions):
            sp = ps.subs.get(req.subscription)
            created = False
            if sp is None:
                if create is None:
                    ps.get(req.subscription)  # raises UnknownSubscription
                await check()
                try:
                    sp = await ps.create(req.subscription, create, req.start)
                    created = True
                except SubscriptionAlreadyExists:
                    sp = ps.get(req.subscription)
            if session.closed:
                raise NotLeader("the connection closed")
            sp.attach(session)
            return m.SubscriptionPartitionResult(partition=ps.part.index, config=sp.config, created=created)

        results = await self._each(req.topic, req.partitions, attach)
        return m.SubscribeResponse(partitions=results), ()

    def _session_closed(self, key) -> None:
        session = self._sessions.pop(key, None)
        if session is None:
            return
        session.closed = True
        for sp in list(session.parts.values()):
            sp.detach(session)
        session.parts.clear()

    async def ack(self, req: m.AckRequest, _att, _peer: Peer):
        results = []
        for ap in req.partitions:
            try:
                self._manager.loaded(req.topic, ap.partition).get(req.subscription).settle(ap)
            except BrokerError as exc:
                results.append(m.SubscriptionPartitionResult(partition=ap.partition, error=exc.code, message=exc.message))
                continue
            results.append(m.SubscriptionPartitionResult(partition=ap.partition))
        return m.AckResponse(partitions=results), ()

    async def create(self, req: m.CreateSubscriptionRequest, _att, _peer: Peer):
        sub.check_name(req.subscription)
        config = sub.check_config(req.config)
        check = _Once(lambda: self._manager.check_new(req.topic, req.subscription, config))

        async def create(ps: PartitionSubscriptions):
            if req.subscription not in ps.subs:
                await check()
            try:
                sp = await ps.create(req.subscription, config, req.start)
            except SubscriptionAlreadyExists:
                if not req.if_not_exists:
                    raise
                sp = ps.get(req.subscription)
            return m.SubscriptionPartitionResult(partition=ps.part.index, config=sp.config)

        return m.CreateSubscriptionResponse(partitions=await self._each(req.topic, req.partitions, create)), ()

    async def delete(self, req: m.DeleteSubscriptionRequest, _att, _peer: Peer):
        sub.check_name(req.subscription)

        async def delete(ps: PartitionSubscriptions):
            await ps.delete(req.subscription)

        results = await self._each(req.topic, req.partitions, delete, stranded=True)
        return m.DeleteSubscriptionResponse(partitions=results), ()

    async def seek(self, req: m.SeekSubscriptionRequest, _att, _peer: Peer):
        sub.check_name(req.subscription)

        async def seek(ps: PartitionSubscriptions):
            offset = await ps.seek(req.subscription, req.position)
            return m.SubscriptionPartitionResult(partition=ps.part.index, offset=offset)

        return m.SeekSubscriptionResponse(partitions=await self._each(req.topic, req.partitions, seek)), ()

    async def describe(self, req: m.DescribeSubscriptionsRequest, _att, _peer: Peer):
        if req.subscription is not None:
            sub.check_name(req.subscription)
        if req.subscription is None and self._manager.refusal(req.topic) is not None:
            # a topic that cannot have subscriptions has none to list (its log is not
            # scanned for any stranded there: name one to describe or delete it)
            return m.DescribeSubscriptionsResponse(subscriptions=[]), ()
        out: list[m.SubscriptionPartitionInfo] = []
        for p in req.partitions:
            try:
                ps = await self._manager.partition(req.topic, p, stranded=True)
                sps = [ps.get(req.subscription)] if req.subscription is not None else list(ps.subs.values())
                await ps.cover(sps)
                out.extend(sp.info() for sp in sps)  # at once: complete as cover left them
            except BrokerError as exc:
                out.append(m.SubscriptionPartitionInfo(
                    subscription=req.subscription or "", partition=p, error=exc.code, message=exc.message,
                ))
        return m.DescribeSubscriptionsResponse(subscriptions=out), ()


class _Once:
    """``await once()`` runs ``make()`` the first time only; every caller gets its outcome
    (a request's partitions share one check)."""

    def __init__(self, make) -> None:
        self._make = make
        self._task: asyncio.Future | None = None

    async def __call__(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._make())
        await asyncio.shield(self._task)
