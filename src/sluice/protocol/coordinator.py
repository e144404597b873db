"""Which broker coordinates a consumer group: the leader of the group's ``__groups`` partition.

A group's committed offsets live in one partition of the internal topic ``__groups``,
chosen by a stable hash of the group's name; the broker that leads that partition is the
group's **coordinator** and the only one that answers its group APIs.  Clients and brokers
both compute the partition here, so they always agree.  Pure: no I/O.
"""

from __future__ import annotations

import zlib

GROUPS_TOPIC = "__groups"


def group_partition(group: str, partitions: int) -> int:
    """The partition of ``__groups`` (of ``partitions``) holding ``group``'s offsets.

    CRC-32 of the UTF-8 name, modulo the partition count: the same on every machine and
    in every Python process (unlike ``hash``).  ``ValueError`` when ``partitions < 1``.
    """
    if partitions < 1:
        raise ValueError(f"{GROUPS_TOPIC} has at least one partition, not {partitions}")
    return zlib.crc32(group.encode()) % partitions
