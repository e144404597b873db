"""The durable state of subscriptions: where it is in a partition's log, and reading it back.

All durable broker state lives in partitions (DESIGN §0): a subscription's state on a
partition (settings, confirmed offset, acked ranges above it, pending redeliveries,
counters) is a control batch in that partition's own log (protocol/subscriptions.py),
written by its leader (``PartitionSubscriptions.write``, partition.py): one record per
subscription whose state changed, every ``FLUSH_S`` (the group commit of acks), and a
snapshot of every subscription in each new segment, so retention never deletes the last
state.  Replicating the partition replicates its subscriptions; a new leader reads them
back from its own log (``scan_states``: from the newest snapshot on), and nothing else is
kept anywhere.

The scans run in worker threads over the log's immutable views.
"""

from __future__ import annotations

from sluice.protocol import subscriptions as sub
from sluice.protocol.records import CONTROL_BIT, decode_batch, iter_batches

FLUSH_S = 0.01  # how often changed cursors are appended (group commit of acks)
SNAPSHOT_CHECK_S = 1.0  # how often a partition with subscriptions checks for a new segment
# A log this large that holds no snapshot gets one of no subscription when loaded, so that
# the next load does not read all of it again; a smaller one is read again (cheaper than a
# record every reader and every group's lag would see).
EMPTY_SNAPSHOT_BYTES = 64 * 1024 * 1024
SCAN_BYTES = 4 * 1024 * 1024


def cursor_batches(plog, start: int, stop: int, where: list[tuple[int, int]]) -> list[tuple[bool, list[sub.CursorState]]]:
    """Worker thread: the subscription batches of ``plog`` in ``[start, stop)``, in order;
    their (base offset, record count) are added to ``where``."""
    out = []
    offset = start
    while offset < stop:
        data = plog.read(offset, SCAN_BYTES, stop).data
        nxt = None
        for h, pos in iter_batches(data, check_crc=False):
            nxt = h.next_offset
            if nxt <= offset or not h.attributes & CONTROL_BIT:
                continue
            found = sub.read_cursor_records(decode_batch(data, h, pos))
            if found is not None:
                out.append(found)
                where.append((h.base_offset, h.records_count))
        if nxt is None:
            break
        offset = nxt
    return out


def scan_states(plog, end: int) -> tuple[dict[str, sub.CursorState], bool, list[tuple[int, int]], int]:
    """Worker thread: every subscription of the partition as of log offset ``end``: the
    newest snapshot and the records after it (segments are scanned newest first until
    one holds a snapshot; the whole log when none does).  Also whether a snapshot was
    found, where the subscription batches read are (base offset, record count), and the
    offset from which those are all of them (the start of the oldest segment read)."""
    later: list = []
    where: list[tuple[int, int]] = []
    bases = plog.view.bases
    for i in range(len(bases) - 1, -1, -1):
        start = max(bases[i], plog.log_start_offset)
        stop = min(bases[i + 1] if i + 1 < len(bases) else end, end)
        found = cursor_batches(plog, start, stop, where) if start < stop else []
        combined = found + later
        snaps = [k for k, (snap, _) in enumerate(found) if snap]
        if snaps:
            return sub.fold(combined[snaps[-1]:]), True, sorted(where), start
        later = combined
    return sub.fold(later), False, sorted(where), plog.log_start_offset
