"""``sluice topic describe``'s partition rows and JSON shape."""

from __future__ import annotations

from sluice.cli import output, topic
from sluice.protocol import messages as m


def desc() -> m.TopicDescription:
    return m.TopicDescription(
        name="orders",
        replication_factor=3,
        partitions=[
            m.PartitionDescription(partition=0, leader=2, replicas=[2, 3, 1], isr=[2, 1], leader_epoch=5,
                                   log_start_offset=10, high_watermark=40, log_end_offset=42,
                                   size_bytes=4096, segments=2),
            # answered by a broker that does not lead it: no log state; offline too
            m.PartitionDescription(partition=1, leader=-1, replicas=[3], isr=[], leader_epoch=1,
                                   log_start_offset=-1, high_watermark=-1, log_end_offset=-1,
                                   size_bytes=-1, segments=-1),
        ],
    )


def test_rows_show_replication_then_log_state():
    assert topic.PARTITION_COLUMNS == ["partition", "leader", "replicas", "isr", "epoch", "log start",
                                       "high watermark", "log end", "bytes", "segments"]
    assert topic.partition_rows(desc()) == [
        [0, 2, "2,3,1", "2,1", 5, 10, 40, 42, 4096, 2],
        [1, -1, "3", "-", 1, "-", "-", "-", "-", "-"],
    ]


def test_json_has_every_field_even_those_the_wire_omits():
    [p0, p1] = output.plain(desc())["partitions"]
    assert p0 == {"partition": 0, "leader": 2, "replicas": [2, 3, 1], "isr": [2, 1], "leader_epoch": 5,
                  "log_start_offset": 10, "high_watermark": 40, "log_end_offset": 42, "size_bytes": 4096,
                  "segments": 2}
    assert (p1["isr"], p1["leader"]) == ([], -1)
    shown = output.plain(m.TopicDescription(name="t"))
    assert (shown["replication_factor"], shown["internal"], shown["partitions"]) == (1, False, [])
