"""Regressions for broker robustness: admin races, bounded fetches, state files, limits."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

from sluice.client.sync import SyncAdmin, SyncProducer
from sluice.protocol import frames
from sluice.protocol import messages as m
from sluice.protocol import records as r


class Raw:
    """A minimal blocking protocol client for tests (one request at a time)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(frames.encode_client_handshake())
        self.reader = frames.FrameReader(handshake=True)
        self.corr = 0

    def call(self, req, attachments=()):
        api, ver = m.api_of(req)
        self.corr += 1
        self.sock.sendall(b"".join(frames.encode_frame(frames.REQUEST, api, ver, self.corr, m.encode(req), attachments)))
        while True:
            data = self.sock.recv(1 << 20)
            assert data, "broker closed the connection"
            for ev in self.reader.feed(data):
                if isinstance(ev, frames.Frame):
                    return m.decode(ev.header, m.types_for(api, ver)[1]), bytes(ev.attachments)

    def produce(self, topic: str, partition: int, values: list[bytes]):
        batch = r.build_batch(r.encode_keyless_records(values), len(values), 1, 1)
        req = m.ProduceRequest(partitions=[m.ProducePartition(topic=topic, partition=partition, size=len(batch))])
        return self.call(req, [batch])[0].partitions[0]

    def close(self) -> None:
        self.sock.close()


def test_concurrent_creates_of_one_name_keep_acknowledged_data(broker):
    results = []

    def create(partitions: int) -> None:
        c = Raw(broker.port)
        resp, _ = c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="race", partitions=partitions)]))
        results.append(resp.topics[0].error)
        c.close()

    threads = [threading.Thread(target=create, args=(n,)) for n in (200, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 6]  # one created it, the other got TOPIC_ALREADY_EXISTS
    c = Raw(broker.port)
    for p in range(10):
        assert c.produce("race", p, [b"kept"]).error == 0
    c.close()
    assert broker.stop() == 0
    broker.start()
    c = Raw(broker.port)
    desc, _ = c.call(m.DescribeTopicsRequest(names=["race"]))
    hws = [p.high_watermark for p in desc.topics[0].partitions]
    assert hws[:10] == [1] * 10
    c.close()


def test_deleted_topic_offsets_do_not_come_back(broker):
    c = Raw(broker.port)
    c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="gone", partitions=1)]))
    resp, _ = c.call(m.OffsetCommitRequest(group="g", offsets=[m.CommitOffset(topic="gone", partition=0, offset=5)]))
    assert resp.partitions[0].error == 0
    c.call(m.DeleteTopicsRequest(names=["gone"]))
    c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="gone", partitions=1)]))
    c.close()
    assert broker.stop() == 0
    broker.start()
    c = Raw(broker.port)
    resp, _ = c.call(m.OffsetFetchRequest(group="g", partitions=[m.TopicPartition(topic="gone", partition=0)]))
    assert resp.offsets[0].offset == -1
    c.close()


def test_fetch_is_bounded_and_refuses_duplicate_partitions(broker):
    c = Raw(broker.port)
    c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="big", partitions=2)]))
    for p in (0, 1):
        assert c.produce("big", p, [b"x" * 100_000] * 5).error == 0
    twice = [m.FetchPartition(topic="big", partition=0, offset=0)] * 2
    resp, _ = c.call(m.FetchRequest(partitions=twice, max_wait_ms=0))
    assert resp.error == 2 and "more than once" in resp.message
    both = [m.FetchPartition(topic="big", partition=p, offset=0, max_bytes=10**9) for p in (0, 1)]
    resp, data = c.call(m.FetchRequest(partitions=both, max_wait_ms=0, max_bytes=1))
    sizes = [p.size for p in resp.partitions]
    assert sizes[0] > 0 and sizes[1] == 0  # the first gets one whole batch, then the budget is spent
    assert len(r.decode_records(data, "big", 0)) == 5
    c.close()


def test_out_of_range_configs_and_impossible_batches_are_refused(broker):
    c = Raw(broker.port)
    resp, _ = c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="cfg", config={"flush.ms": "1" + "0" * 400})]))
    assert resp.topics[0].error == 9  # INVALID_CONFIG, not a dead writer
    c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="cnt", partitions=1)]))
    batch = bytearray(r.build_batch(r.encode_keyless_records([b"a"]), 1, 1, 1))
    # claim 2**31-1 records in a 70-byte batch, with a consistent header and CRC
    batch[23:27] = (2**31 - 2).to_bytes(4, "big")
    batch[57:61] = (2**31 - 1).to_bytes(4, "big")
    batch[17:21] = r.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    req = m.ProduceRequest(partitions=[m.ProducePartition(topic="cnt", partition=0, size=len(batch))])
    resp, _ = c.call(req, [bytes(batch)])
    assert resp.partitions[0].error == 21 and "cannot fit" in resp.partitions[0].message
    assert c.produce("cnt", 0, [b"fine"]).error == 0  # the writer is alive
    c.close()


def test_unreadable_topics_file_stops_the_broker_and_is_left_in_place(broker):
    c = Raw(broker.port)
    c.call(m.CreateTopicsRequest(topics=[m.NewTopic(name="keep", partitions=1)]))
    c.close()
    assert broker.stop() == 0
    meta = broker.data_dir / "meta" / "topics.json"
    meta.write_text('{"topics": [')
    res = subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "serve", "--data-dir", str(broker.data_dir), "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )
    assert res.returncode != 0
    assert "topics.json is unreadable" in res.stderr and "Traceback" not in res.stderr
    assert meta.read_text() == '{"topics": ['  # not moved aside: the operator decides
    assert (broker.data_dir / "logs" / "keep-0").is_dir()


def test_unreadable_old_group_file_is_kept_and_the_broker_starts(broker):
    assert broker.stop() == 0
    groups = broker.data_dir / "groups"
    groups.mkdir(exist_ok=True)
    (groups / "g.json").write_text(json.dumps([1, 2, 3]))  # valid JSON, wrong shape
    broker.start()
    assert (broker.data_dir / "groups.migrated" / "g.json").read_text() == "[1, 2, 3]"
    assert "unreadable" in broker.log()


def test_advertise_without_a_port_advertises_the_listening_port(broker_factory):
    broker = broker_factory(extra_args=["--advertise", "127.0.0.1"]).start()
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("adv")
    with SyncProducer(broker.bootstrap, retries=0, delivery_timeout_ms=5000) as producer:
        assert producer.send("adv", b"x").result(timeout=10).offset == 0
