"""The blocking facades over the fake broker: iteration positions and close from threads."""

import threading
import time

import pytest

from sluice import errors
from sluice.client import SyncConsumer, SyncProducer

from .fakebroker import FakeBroker


def fill(broker, topic, n):
    with SyncProducer("fake:1", connection_factory=broker.factory) as p:
        p.send_many(topic, [b"m%d" % i for i in range(n)], partition=0).result(5)


def consumer(broker, **kw):
    kw.setdefault("fetch_max_wait_ms", 10)
    return SyncConsumer("fake:1", connection_factory=broker.factory, **kw)


def test_iteration_positions_stop_at_the_last_record_yielded():
    """B2: break + commit after 3 records commits 3, and the rest is read next."""
    broker = FakeBroker({"t": 1})
    fill(broker, "t", 10)
    c = consumer(broker, group="g", enable_auto_commit=False)
    try:
        c.assign([("t", 0)])
        seen = []
        for rec in c:
            seen.append(rec.offset)
            assert c.position(("t", 0)) == rec.offset + 1  # in the loop body already
            if len(seen) == 3:
                break
        assert seen == [0, 1, 2]
        assert c.position(("t", 0)) == 3
        c.commit()
        assert c.committed(("t", 0)) == 3
        assert [r.offset for r in c.getmany(timeout_ms=500)] == list(range(3, 10))
    finally:
        c.close()
    assert broker.committed[("g", "t", 0)] == 3


def test_seek_inside_the_loop_drops_records_fetched_before_it():
    broker = FakeBroker({"t": 1})
    fill(broker, "t", 10)
    with consumer(broker) as c:
        c.assign([("t", 0)])
        seen = []
        for rec in c:
            seen.append(rec.offset)
            if rec.offset == 2:
                c.seek("t", 0, 8)
            if len(seen) == 5:
                break
        assert seen == [0, 1, 2, 8, 9]


def test_close_from_another_thread_fails_blocked_calls():
    """B8: blocked getmany / iteration end at close instead of hanging."""
    broker = FakeBroker({"t": 1})
    for target in ("getmany", "iterate"):
        c = consumer(broker)
        c.assign([("t", 0)])
        state = {}

        def run(c=c, target=target, state=state):
            try:
                if target == "getmany":
                    c.getmany(timeout_ms=30_000)
                    state["r"] = "returned"
                else:
                    for _ in c:
                        pass
                    state["r"] = "ended"
            except errors.ClientClosed:
                state["r"] = "closed"

        th = threading.Thread(target=run, daemon=True)
        th.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        c.close()
        th.join(5)
        assert not th.is_alive()
        assert time.monotonic() - t0 < 3
        assert state["r"] == ("closed" if target == "getmany" else "ended")


def test_closed_facade_raises_instead_of_reopening():
    """B8: a closed facade never creates a new client behind the caller's back."""
    broker = FakeBroker({"t": 1})
    p = SyncProducer("fake:1", connection_factory=broker.factory)
    p.send("t", b"x").result(5)
    p.close()
    with pytest.raises(errors.ClientClosed):
        p.send("t", b"y")
    assert p._client is None
    p.close()  # still idempotent
    c = consumer(broker)
    c.close()  # closed before first use
    with pytest.raises(errors.ClientClosed):
        c.getmany()
    assert [r.value for r in broker.records("t", 0)] == [b"x"]


def test_send_each_gives_one_outcome_per_message_in_order():
    """A refused message gets its error; the others are sent and acknowledged."""
    broker = FakeBroker({"t": 2}, max_message_bytes=1024)
    with SyncProducer("fake:1", connection_factory=broker.factory) as p:
        outcomes = p.send_each([
            ("t", b"a", b"k", [("h", b"1")], None),
            ("t", b"x" * 5000, None, None, 0),
            ("t", b"b", None, None, 1),
            ("t", b"c", None, None, 7),
        ])
        assert isinstance(outcomes[1], errors.MessageTooLarge)
        assert isinstance(outcomes[3], errors.UnknownPartition)
        first, third = outcomes[0].result(5), outcomes[2].result(5)
    assert third.partition == 1
    assert [(r.key, r.value) for r in broker.records("t", first.partition)][first.offset] == (b"k", b"a")
    assert sorted(r.value for p in (0, 1) for r in broker.records("t", p)) == [b"a", b"b"]


def test_sync_producer_takes_the_idempotence_settings():
    broker = FakeBroker({"t": 1})
    with pytest.raises(errors.ConfigError, match="producer_id"):
        SyncProducer("fake:1", connection_factory=broker.factory, producer_id=5, producer_epoch=0).flush()
    with SyncProducer("fake:1", connection_factory=broker.factory, producer_id=(1 << 62) + 9,
                      producer_epoch=4, max_in_flight_per_partition=2) as p:
        assert p.send("t", b"v").result(5).offset == 0
        assert p.send_many("t", [b"a", b"b"]).result(5) == (0, 1)
    from sluice.protocol import records

    (blob1, blob2) = broker.logs[("t", 0)]
    hs = [h for blob in (blob1, blob2) for h, _ in records.iter_batches(blob)]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in hs] == [
        ((1 << 62) + 9, 4, 0), ((1 << 62) + 9, 4, 1)
    ]


@pytest.mark.parametrize(
    ("kw", "error", "needle"),
    [({"compression": "rar"}, errors.ConfigError, "compression"), ({"acks": 5}, errors.ConfigError, "acks"),
     ({"lingerms": 5}, TypeError, "lingerms")],
)
def test_a_bad_setting_fails_when_the_facade_is_made_not_at_its_first_call(kw, error, needle):
    """The client is made on first use, in its loop thread; its settings are checked at once."""
    with pytest.raises(error, match=needle):
        SyncProducer("127.0.0.1:1", **kw)
    with pytest.raises(errors.ConfigError, match="bootstrap must be"):
        SyncProducer(7610)
    with pytest.raises(errors.ConfigError, match="bootstrap must be"):
        SyncConsumer([b"127.0.0.1:1"])
