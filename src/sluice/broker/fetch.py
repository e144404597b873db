"""The fetch service: consumers' reads (FETCH, a long poll) and LIST_OFFSETS.

Consumers read only partitions led here, and only below the high watermark (what every
in-sync replica has).  Disk reads run in the partitions' reader threads
(broker/reading.py); this module only walks the request and waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.broker.peer import Peer
from sluice.broker.registry import TopicRegistry
from sluice.broker.results import error_fields
from sluice.broker.wait import until_woken
from sluice.errors import (
    BrokerError,
    InvalidRequest,
    OffsetNotAvailable,
)
from sluice.protocol import messages as m

FETCH_OVERHEAD = 1024 * 1024  # room in a response frame for its header


class FetchService:
    """FETCH and LIST_OFFSETS.  Event loop only.

    Collaborators: ``topics``, where partitions are looked up; ``max_frame_bytes``, the
    cap a response must fit in (``ServerConfig.max_frame_bytes``); ``draining``, true once
    the broker stops (long polls then answer at once with what they have)."""

    def __init__(self, topics: TopicRegistry, max_frame_bytes: int, draining: Callable[[], bool]) -> None:
        self.topics = topics
        self.max_frame_bytes = max_frame_bytes
        self.draining = draining

    def handlers(self) -> dict:
        return {m.Api.FETCH: self.fetch, m.Api.LIST_OFFSETS: self.list_offsets}

    async def fetch(self, req: m.FetchRequest, _att, _peer: Peer):
        """Long poll: answer once ``min_bytes`` are there or ``max_wait_ms`` has passed."""
        if len({(fp.topic, fp.partition) for fp in req.partitions}) != len(req.partitions):
            raise InvalidRequest("a fetch names a partition more than once")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(req.max_wait_ms, 0) / 1000
        while True:
            results, blobs, size = await self._fetch_once(req)
            remaining = deadline - loop.time()
            # an offset not available yet is waited for like data (the high watermark is
            # catching up), and answered as such when the wait ends
            failed = any(r.error and r.error != OffsetNotAvailable.code for r in results)
            if size >= req.min_bytes or remaining <= 0 or failed or self.draining():
                return m.FetchResponse(partitions=results), blobs
            parts = [self.topics.partition(fp.topic, fp.partition) for fp in req.partitions]
            await until_woken(
                [p.add_waiter for p in parts], [p.remove_waiter for p in parts], remaining
            )

    async def _fetch_once(self, req: m.FetchRequest):
        """One pass over the partitions, within the request's byte budget.

        The budget is ``max_bytes`` capped below the frame size; each partition reads at
        most its own ``max_bytes`` of what is left.  Only the first partition with data may
        go over (by at most one batch, itself capped by max.message.bytes) so a consumer
        always makes progress; partitions after the budget is spent get no data this time.
        """
        results, blobs, size = [], [], 0
        frame = self.max_frame_bytes
        budget = min(req.max_bytes, max(frame // 2, frame - FETCH_OVERHEAD))
        for fp in req.partitions:
            try:
                part = self.topics.led_partition(fp.topic, fp.partition)
                limit = min(fp.max_bytes, budget - size)
                if size and limit <= 0:
                    results.append(m.FetchPartitionResult(
                        topic=fp.topic, partition=fp.partition, high_watermark=part.high_watermark,
                        log_start_offset=part.log_start_offset,
                    ))
                    continue
                # consumers see what every in-sync replica has: below the high watermark
                res = await part.fetch(fp.offset, max(limit, 1), part.high_watermark)
            except BrokerError as exc:
                results.append(m.FetchPartitionResult(topic=fp.topic, partition=fp.partition, **error_fields(exc)))
                continue
            data = res.data
            results.append(
                m.FetchPartitionResult(
                    topic=fp.topic, partition=fp.partition, high_watermark=res.high_watermark,
                    log_start_offset=res.log_start_offset, size=len(data),
                )
            )
            if data:
                blobs.append(data)
            size += len(data)
        return results, blobs, size

    async def list_offsets(self, req: m.ListOffsetsRequest, _att, _peer: Peer):
        out = []
        for lp in req.partitions:
            try:
                part = self.topics.led_partition(lp.topic, lp.partition)
                ts = -1
                if lp.timestamp == m.EARLIEST:
                    offset = part.log_start_offset
                elif lp.timestamp == m.LATEST:
                    offset = part.high_watermark
                elif lp.timestamp < 0:
                    raise InvalidRequest(f"bad timestamp {lp.timestamp}: use -1, -2 or ms since the epoch")
                else:
                    found = await part.offset_for_time(lp.timestamp)
                    offset = part.high_watermark if found is None else found
                    ts = lp.timestamp if found is not None else -1
                out.append(m.ListOffsetsResult(topic=lp.topic, partition=lp.partition, offset=offset, timestamp=ts))
            except BrokerError as exc:
                out.append(m.ListOffsetsResult(topic=lp.topic, partition=lp.partition, **error_fields(exc)))
        return m.ListOffsetsResponse(partitions=out), ()
