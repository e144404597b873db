"""A message delivered through a subscription (client/subscriber.py), and settling it.

A ``Message`` is a ``Record``'s fields plus the delivery's (attempt, ack deadline), with
the subscriber and session it came in.  ``ack`` / ``nack`` / ``touch`` may be called from
any thread: they note the settlement on the subscriber's loop (``Subscriber._ack`` and
friends), which sends it later (client/ack_sender.py).  A message is settled once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING

import msgspec

from sluice import errors
from sluice.client.settling import nack_delay
from sluice.protocol.subscriptions import tag_of

if TYPE_CHECKING:
    from sluice.client.subscriber import Subscriber

__all__ = ["Message"]

_SETTLING = threading.Lock()


class Message(msgspec.Struct, gc=False):
    """One delivered message.  Settle it once: ``ack()`` or ``nack()``; ``touch()`` while
    working on it past its ack deadline (see ``keep_alive``).

    Built by the record decoder itself (``decode_records(..., factory=Message)``): the
    fields up to ``headers`` are a ``Record``'s, then the delivery's.  Not tracked by the
    garbage collector: the subscriber drops the messages it holds when a partition is lost
    or it closes, which ends the only cycle (subscriber → message → subscriber).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    attempt: int
    deadline: float  # monotonic time the broker redelivers it unless touched
    _sub: Subscriber
    _session: object  # the session it came in (None: none): a nack counts only in that one
    settled: bool = False

    def __repr__(self) -> str:
        return f"<Message {self.topic}-{self.partition}@{self.offset} attempt={self.attempt}>"

    @property
    def tag(self) -> str | None:
        """The message's tag (header ``sluice.tag``), which subscriptions can filter on."""
        return tag_of(self.headers)

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def ack(self) -> None:
        """Done with: never delivered again to this subscription.  Any thread.  Raises
        ``AlreadySettled`` if it was acked or nacked before."""
        self._settle("ack")
        sub = self._sub
        if threading.get_ident() == sub._thread:
            sub._ack(self)
        else:
            sub._on_loop(sub._ack, self)

    def nack(self, delay_ms: int | None = None, reason: str = "") -> None:
        """Failed: redelivered after ``delay_ms`` (None: the subscription's backoff), an
        int of 0 to 30 days in ms: else ``TypeError`` or ``ConfigError``, and the message
        stays unsettled.  Any thread.  Raises ``AlreadySettled`` if it was acked or nacked
        before."""
        delay = nack_delay(delay_ms)
        self._settle("nack")
        self._sub._on_loop(self._sub._nack, self, delay, reason)

    def _settle(self, how: str) -> None:
        with _SETTLING:  # ack and nack may race from two threads: one of them settles
            if self.settled:
                raise errors.AlreadySettled(f"cannot {how} {self!r}: it was acked or nacked already")
            self.settled = True

    def touch(self) -> None:
        """Still working on it: its ack deadline starts again.  Any thread."""
        if not self.settled:
            self._sub._on_loop(self._sub._touch, self)

    @contextlib.asynccontextmanager
    async def keep_alive(self):
        """``async with message.keep_alive(): ...`` touches the message every third of its
        ack timeout while the block runs (a long handler keeps its message)."""
        interval = self._sub._ack_timeout_s(self.partition) / 3

        async def touching():
            while True:
                await asyncio.sleep(interval)
                self.touch()

        task = asyncio.ensure_future(touching())
        try:
            yield self
        finally:
            task.cancel()
