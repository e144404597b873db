"""Which messages of a stored batch a delivery hands out, when its records must be read.

Delivery needs no record decoding (delivery.py sends batch bytes and offset ranges), but
for two settings: a tag filter (only messages whose ``sluice.tag`` header is one of the
subscription's tags are delivered, the others count as settled) and key-ordered mode (a
key's messages wait behind the one of it that is out: keys.py).  ``pick`` goes through
the decoded records of one batch and decides for each.

Event loop only (it holds no state: the key order is the caller's).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.broker.subscriptions.keys import KeyOrder
from sluice.protocol.ranges import RangeSet
from sluice.protocol.subscriptions import tag_of


def pick(
    records: Iterable, lo: int, hi: int, want: RangeSet, restored: RangeSet, limit: int,
    tags: set[str], keys: KeyOrder | None,
) -> tuple[RangeSet, int]:
    """The offsets of ``records`` (one batch, ``[lo, hi)`` unread) to deliver now, at most
    ``limit``, and the offset to read on from: ``hi``, or the first one to deliver past the
    limit.  ``want``: the unsettled offsets of the batch, not restored retries; on return
    it holds the chosen ones and those to settle unseen (filtered out by ``tags``, or
    compacted away): those held behind their keys and those past the limit are taken out
    of it.  ``restored``: retries read from a cursor record, which come as redeliveries
    only.  ``keys``: the key order in key-ordered mode (a restored retry parks its key
    again: the key's messages before it were settled, or it would not be first), else None."""
    chosen = RangeSet()
    chosen_n = 0
    stop = hi
    for r in records:
        o = r.offset
        if o < lo:
            continue
        if keys is not None and o in restored and not keys.busy(r.key):
            keys.take(r.key, o)
            continue
        if o not in want or (tags and tag_of(r.headers) not in tags):
            continue
        if keys is not None and keys.hold(r.key, o):
            want.remove(o, o + 1)
            continue
        if chosen_n == limit:
            stop = o
            want.remove(o, hi)
            break
        if keys is not None:
            keys.take(r.key, o)
        chosen.add(o, o + 1)
        chosen_n += 1
    return chosen, stop
