"""An idempotent producer's identity: the producer id and epoch its batches carry, got from
a broker (``INIT_PRODUCER_ID``) or given by the caller, and each partition's sequences under
it (client/sequences.py).

The sender (client/sender.py) asks ``sequences(tp)`` for what to stamp on a partition's
batches (None while no producer id is known: the partition waits, and ``need()`` asks for
one), ``renumber`` when a partition must continue under a new identity after a gap the
client left, and tells ``batch_ended`` how each batch ended.  A partition past the last
epoch drops the producer id, and the next one asked for continues it.

Concurrency: event loop only (the producer's); the one task it runs is ``task``, which
the producer cancels on close.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable

from sluice import errors
from sluice.client.accumulator import Batch
from sluice.client.cluster import Cluster
from sluice.client.sequences import MAX_EPOCH, PartitionSequences
from sluice.protocol import messages

log = logging.getLogger("sluice.client.producer")

TP = tuple[str, int]
IDENTITY_WARN_EVERY_S = 10.0  # "no producer id yet" warnings, at most one per this


def backoff_delay(base: float, maximum: float, attempt: int) -> float:
    """``base * 2**attempt`` capped at ``maximum``, with +-20 % jitter (the producer's
    retries: of a producer id here, of batches in the sender, of metadata in the producer)."""
    delay = min(base * (2 ** min(attempt, 30)), maximum)
    return delay * random.uniform(0.8, 1.2) if delay else 0.0


class ProducerIdentity:
    """The identity of one idempotent producer and its partitions' sequences (module
    docstring).  ``explicit``: the caller's ``(producer id, epoch)``, or None to ask a
    broker of ``cluster``, retrying retriable errors with backoff (``backoff`` to
    ``backoff_max`` seconds).  ``on_change()`` is told each time an answer (or a failure)
    came, so that the sender looks again."""

    def __init__(
        self,
        cluster: Cluster,
        explicit: tuple[int, int] | None,
        *,
        backoff: float,
        backoff_max: float,
        on_change: Callable[[], None],
    ) -> None:
        self._cluster = cluster
        self.explicit = explicit is not None
        self.producer_id, self.producer_epoch = explicit or (None, None)
        # the last failure to get an id (a non-retriable one fails the partitions waiting)
        self.error: errors.SluiceError | None = None
        self.partitions: dict[TP, PartitionSequences] = {}
        self._backoff, self._backoff_max = backoff, backoff_max
        self._on_change = on_change
        self._loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Ask for a producer id now (unless explicit): ready by the first send, usually."""
        self._loop = loop
        if not self.explicit:
            self.need()

    def need(self) -> None:
        """Ask a broker for a producer id, unless that is under way."""
        if self.task is None or self.task.done():
            self.task = self._loop.create_task(self._init_producer_id())

    async def _init_producer_id(self) -> None:
        """Ask any broker for a producer id (``INIT_PRODUCER_ID``), retrying retriable errors
        with backoff; a non-retriable one is kept in ``error`` (the queued batches fail with
        it)."""
        attempt = 0
        warned_at = -math.inf
        while True:
            try:
                response, _ = await self._cluster.request(messages.InitProducerIdRequest())
                if not 0 <= response.producer_id < 1 << 62 or not 0 <= response.producer_epoch <= MAX_EPOCH:
                    raise errors.UnknownServerError(
                        f"INIT_PRODUCER_ID answered id {response.producer_id} epoch {response.producer_epoch}"
                    )
                self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
                self.error = None
                return
            except errors.SluiceError as exc:
                self.error = exc
                if not exc.retriable:
                    return
                if time.monotonic() - warned_at >= IDENTITY_WARN_EVERY_S:
                    warned_at = time.monotonic()
                    log.warning(
                        "no producer id yet (sends wait for one, up to delivery_timeout_ms): %s; retrying", exc
                    )
            finally:
                self._on_change()
            await asyncio.sleep(backoff_delay(self._backoff, self._backoff_max, attempt))
            attempt += 1

    def sequences(self, tp: TP) -> PartitionSequences | None:
        """The partition's sequence state; None while no producer id is known yet."""
        st = self.partitions.get(tp)
        if st is None and self.producer_id is not None:
            st = self.partitions[tp] = PartitionSequences(self.producer_id, self.producer_epoch, self.explicit)
        return st

    def renumber(self, tp: TP, st: PartitionSequences, q: deque[Batch]) -> bool:
        """Continue ``tp`` under a new identity (nothing of it in flight); False while a
        fresh producer id is awaited."""
        if st.epoch < MAX_EPOCH:
            st.renumber(q)
        elif self.producer_id is not None and self.producer_id != st.producer_id:
            st.reset_identity(self.producer_id, self.producer_epoch, q)
        else:
            self.producer_id = None  # past the last epoch: a fresh id for this partition
            self.need()
            return False
        log.info("%s[%d]: sequence gap left by a failed batch; continuing as producer %d epoch %d "
                 "from sequence 0", tp[0], tp[1], st.producer_id, st.epoch)
        return True

    def batch_ended(self, b: Batch, exc: BaseException | None) -> None:
        """``b`` ended: acknowledged (``exc`` None) or failed."""
        if exc is not None and b.drain_no >= 0:
            st = self.partitions.get((b.topic, b.partition))
            if st is not None:
                st.failed(b)
