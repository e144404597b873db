"""A producer's waiting line: the sends that cannot be buffered at once, per topic.

A send waits for the metadata of a topic not seen yet and for buffer memory.  A record over
its topic's size limit waits for the metadata to be asked again (at most once a second a
topic) before it is refused: ``max.message.bytes`` may have been raised since.  The sends of
one topic wait in one line, in send order, behind its first waiting send (a waiting topic
holds up no other); one task per line buffers them one after the other.  The producer
sends a record of a topic with a line into the line too, so that no record overtakes an
earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque

from sluice import errors
from sluice.client.arguments import clarified
from sluice.client.framing import tail_size

LIMIT_RECHECK_S = 1.0  # a topic's size limit is asked again at most this often


class WaitingLine:
    """The waiting sends of one ``Producer``, by topic.

    An item is ``(topic, value, key, headers, partition, timestamp_ms, sink, buffered)``:
    ``buffered`` (from ``send``) is told the sink when the record is buffered and the error
    when it cannot be; without it (``send_nowait``, ``submit``) the sink gets the error.
    ``lanes`` (topic -> its items) is read by the producer's compiled path, which takes no
    record of a topic in line; it is only ever changed in place.
    """

    def __init__(self, producer) -> None:
        self._producer = producer
        self.lanes: dict[str, deque[tuple]] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._limits_asked: dict[str, float] = {}  # topic -> monotonic time

    def limit_may_be_stale(self, topic: str) -> bool:
        """Whether ``topic``'s size limit was not asked again within ``LIMIT_RECHECK_S``."""
        return time.monotonic() - self._limits_asked.get(topic, -math.inf) >= LIMIT_RECHECK_S

    async def ask_limit(self, topic: str) -> None:
        """Refresh the metadata, so that ``topic``'s size limit is current (a failed refresh
        leaves it as it was)."""
        self._limits_asked[topic] = time.monotonic()
        cluster = self._producer._cluster
        with contextlib.suppress(errors.SluiceError):
            await cluster.refresh([*cluster.topics, topic])

    def add(self, item: tuple) -> None:
        """Queue a send that cannot be buffered at once in its topic's line."""
        topic = item[0]
        lane = self.lanes.get(topic)
        if lane is None:
            lane = self.lanes[topic] = deque()
            self._tasks[topic] = self._producer._loop.create_task(self._run(topic, lane), name="sluice-producer-lane")
        lane.append(item)

    async def _run(self, topic: str, lane: deque[tuple]) -> None:
        """Buffer the waiting sends one after the other, each waiting as long as it must."""
        try:
            while lane:
                topic, value, key, headers, partition, ts, sink, buffered = lane[0]
                if buffered is not None and buffered.cancelled():
                    lane.popleft()  # its sender gave up: buffer nothing
                    continue
                try:
                    await self._buffer(topic, value, key, headers, partition, ts, sink, buffered)
                except Exception as exc:
                    lane.popleft()
                    exc = clarified(exc, topic, value, key, headers, partition, ts)
                    if buffered is None:
                        self._producer.unbuffered(sink, exc)
                    elif not buffered.done():
                        buffered.set_exception(errors.unbuffered(exc))
                else:
                    lane.popleft()
                    if buffered is not None and not buffered.done():
                        buffered.set_result(sink)
        finally:
            if self._tasks.get(topic) is asyncio.current_task():
                del self._tasks[topic], self.lanes[topic]

    async def _buffer(self, topic, value, key, headers, partition, ts, sink, buffered) -> None:
        """Buffer one record of a line: wait for metadata and memory, then append."""
        p = self._producer
        appender = p._appender  # client/appender.py
        reserved = 0
        mem = p._memory
        try:
            while True:
                p._check_open()
                info = await p._usable_topic(topic, partition)
                if partition is not None and not 0 <= partition < info.partitions:
                    raise errors.unknown_partition(topic, partition, info.partitions)
                if not reserved:
                    try:
                        appender.fitting(topic, info, tail_size(key, value, headers))
                    except errors.MessageTooLarge:
                        if not self.limit_may_be_stale(topic):
                            raise
                        await self.ask_limit(topic)
                        continue
                    reserve = appender.reserve(key, value, headers)
                    await mem.acquire(reserve, p.max_block)
                    reserved = reserve
                    if p._closing:
                        raise errors.ClientClosed("producer closed while the send waited for memory")
                    if buffered is not None and buffered.cancelled():
                        return
                if appender.append(topic, value, key, headers, partition, ts, sink, reserved):
                    reserved = 0
                    return
        finally:
            if reserved:
                mem.release(reserved)

    def fail(self, exc: errors.ClientClosed) -> None:
        """Fail every send still waiting (on close) with a copy of ``exc``."""
        for task in self._tasks.values():
            task.cancel()
        lanes = list(self.lanes.values())
        self.lanes.clear()
        self._tasks = {}
        for lane in lanes:
            for *_, sink, buffered in lane:
                target = sink if buffered is None else buffered
                if not target.done():
                    target.set_exception(errors.unbuffered(type(exc)(*exc.args)))

    async def drained(self) -> None:
        """Return once every send waiting in line was buffered or failed."""
        while self._tasks:
            await asyncio.wait(list(self._tasks.values()))
