"""The SyncProducer's outbox (client/outbox.py, compiled in _coutbox.c): what it calls is
what it was given (``buffer_all``, ``schedule_hand_over``) or a public method of the
producer (``submit``, ``unbuffered``); fake broker, no timing assertions."""

from collections import deque

import pytest

from sluice.client import SyncProducer
from sluice.client.outbox import Outbox as PyOutbox
from sluice.client.record_future import FutureGroup, RecordFuture
from sluice.client.sync.producer import _MARGIN
from sluice.protocol import records

from .fakebroker import FakeBroker

compiled = pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")


def _outbox(kind, facade, scheduled: list, buffered_all: list):
    return kind(
        facade, SyncProducer.send, deque(), RecordFuture, FutureGroup(), _MARGIN,
        buffered_all.append, scheduled.append,
    )


@compiled
def test_the_compiled_send_calls_the_hand_over_and_buffer_all_it_was_given():
    broker = FakeBroker({"t": 1})
    with SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=0, batch_size=1024, buffer_memory=4096) as p:
        p.send("t", b"first", partition=0).result(timeout=10)  # the topic's route is known from now on
        client = p._ensure()[0]
        scheduled, buffered_all = [], []
        outbox = _outbox(records._C.Outbox, p, scheduled, buffered_all)
        outbox.bind(client)
        a = outbox.send("t", b"a", partition=0)
        b = outbox.send("t", b"b", partition=0)
        assert type(a) is RecordFuture and a.group is b.group and isinstance(a.group, FutureGroup)
        assert a._condition is a.group.condition  # as RecordFuture.__init__ makes it
        assert (scheduled, buffered_all) == ([client], [])  # one hand-over for both: it is pending
        assert [item[1] for item in outbox.items] == [b"a", b"b"] and outbox.handing
        c = outbox.send("t", b"c" * 3000, partition=0)
        assert (scheduled, buffered_all) == ([client], [])
        d = outbox.send("t", b"d" * 3000, partition=0)  # queued past buffer memory: buffer all first
        assert (scheduled, buffered_all) == ([client], [client])
        p._lt.call_soon(outbox.hand_over, client)
        p.flush()
        assert [f.result(timeout=10).offset for f in (a, b, c, d)] == [1, 2, 3, 4]
        assert not outbox.handing and not outbox.items
        outbox.unbind()
    assert [r.value for r in broker.records("t", 0)] == [b"first", b"a", b"b", b"c" * 3000, b"d" * 3000]


@pytest.mark.parametrize("kind", [records._C.Outbox if records._C else None, PyOutbox], ids=["C", "reference"])
def test_hand_over_reports_a_record_it_cannot_buffer_to_the_producers_unbuffered(kind):
    if kind is None:
        pytest.skip("the compiled codec is not built")
    broker = FakeBroker({"t": 1})
    with SyncProducer("fake:1", connection_factory=broker.factory, linger_ms=0) as p:
        p.send("t", b"first", partition=0).result(timeout=10)
        client = p._ensure()[0]
        told = []
        real = client.unbuffered
        client.unbuffered = lambda sink, exc: (told.append(exc), real(sink, exc))  # the public entry, watched
        outbox = _outbox(kind, p, [], [])
        outbox.bind(client)
        bad = RecordFuture(FutureGroup())
        outbox.items.append(("t", b"v", None, None, 7, None, bad))  # partition 7 of 1: refused at once
        p._lt.run(_on_loop(outbox.hand_over, client))
        with pytest.raises(Exception) as raised:
            bad.result(timeout=10)
        assert told == [raised.value]
        assert p._failed_immediately() is raised.value  # on_unbuffered: the next flush raises it
        outbox.unbind()


async def _on_loop(fn, *args):
    return fn(*args)
