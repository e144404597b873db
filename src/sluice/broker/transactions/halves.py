"""Half messages: what they are in a partition's log, and reading them back.

A transactional message's half message is a batch in its target partition with the
transactional attribute bit (protocol/records.py bit 4), invisible to readers; its end is
one more batch in the same partition, written by the leader (protocol/transactions.py): a
commit is the visible copy of the half's records (commit bit, header ``sluice.txn.id`` on
its first record), a rollback a control batch naming the half, with a reason.  A half's id
is its place, ``topic/partition/offset``.  ``Half`` is the leader's view of an open one.

The scans run in worker threads over the log's immutable views: batch headers are read for
every batch, and of transactional, commit and control batches only the first record is
decoded (what bookkeeping needs is there).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.protocol import messages as m
from sluice.protocol import transactions as tx
from sluice.protocol.records import (
    TRANSACTIONAL_BIT,
    decode_batch,
    decode_first,
    iter_batches,
    parse_header,
)
from sluice.storage.log import OutOfRange

SCAN_BYTES = 4 * 1024 * 1024  # per read of a scan


@dataclass
class Half:
    offset: int
    timestamp: int  # ms: when the broker stored it (the batch's max timestamp when scanned)
    group: str
    checks: int = 0
    last_check: float = 0.0  # monotonic time of the last check sent
    deliver_at: int = 0  # ms: a delayed message's delivery time (group DELAY_GROUP); 0 otherwise
    count: int = 1  # messages in its batch

    @property
    def delayed(self) -> bool:
        return self.deliver_at > 0



def scan_log(plog, start: int, end: int, only: int | None = None) -> list[tuple]:
    """Worker thread: the transaction events of ``plog`` in ``[start, end)``, in log order.

    ``("half", offset, timestamp, group, deliver_at, count)`` for a half message, ``("end", half_offset,
    state, at)`` for a commit or rollback batch at ``at``.  Batch headers are read for
    every batch; of transactional, commit and control batches the first record is decoded.  With
    ``only``, events of that half only.
    """
    events: list[tuple] = []
    offset = max(start, plog.log_start_offset)
    while offset < end:
        data = plog.read(offset, SCAN_BYTES, end).data
        nxt = None
        for h, pos in iter_batches(data, check_crc=False):
            nxt = h.next_offset
            if nxt <= offset or not h.attributes & tx.TXN_BITS:
                continue
            first = decode_first(data, h, pos)  # what bookkeeping needs is in the first record
            recs = [first] if first is not None else []
            if h.attributes & TRANSACTIONAL_BIT:
                if only is None or h.base_offset == only:
                    group = tx.group_of(recs[0]) if recs else ""
                    at = tx.deliver_at_of(recs[0]) if group == tx.DELAY_GROUP else 0
                    events.append(("half", h.base_offset, h.max_timestamp, group, at, nxt - h.base_offset))
                continue
            half = tx.resolved_offset(h.attributes, recs)
            if half is not None and (only is None or half == only):
                state = m.TXN_ROLLED_BACK if h.attributes & tx.CONTROL_BIT else m.TXN_COMMITTED
                events.append(("end", half, state, h.base_offset))
        if nxt is None:
            break
        offset = nxt
    return events


def read_half_batch(plog, offset: int) -> bytes | None:
    """Worker thread: the batch of the half message at ``offset`` as stored (its CRC
    checked, its records not decoded); None if there is none."""
    try:
        data = plog.read(offset, 1, plog.log_end_offset).data
    except OutOfRange:
        return None
    for h, pos in iter_batches(data, check_crc=True):
        if h.base_offset == offset and h.attributes & TRANSACTIONAL_BIT:
            return data[pos : pos + h.size]
        if h.base_offset >= offset:
            break
    return None


def read_half(plog, offset: int) -> list:
    """Worker thread: the records of the half message at ``offset``; [] if there is none."""
    batch = read_half_batch(plog, offset)
    if batch is None:
        return []
    return decode_batch(batch, parse_header(batch), 0)
