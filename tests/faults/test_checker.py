"""The history checker on made-up histories: each promise it checks, kept and broken."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from checker import History, check_reads

from sluice.errors import DeliveryTimeout, NotEnoughReplicas, send_failure


def rec(partition: int, offset: int, value: bytes):
    return SimpleNamespace(partition=partition, offset=offset, value=value)


def acked(h: History, producer: str, seq: int, partition: int, offset: int) -> bytes:
    v = h.value(producer, seq)
    h.ack(v, SimpleNamespace(partition=partition, offset=offset))
    return v


def test_a_kept_history_passes_and_is_counted():
    h = History()
    a, b = acked(h, "p0", 0, 0, 0), acked(h, "p0", 1, 0, 1)
    report = h.check({0: [rec(0, 0, a), rec(0, 1, b)]})
    assert (report.sent, report.acked, report.stored, report.duplicates) == (2, 2, 2, 0)


def test_an_acknowledged_record_lost_moved_or_stored_twice_fails():
    h = History()
    a, b = acked(h, "p0", 0, 0, 0), acked(h, "p0", 1, 0, 1)
    with pytest.raises(AssertionError, match="is not there"):
        h.check({0: [rec(0, 0, a)]})
    with pytest.raises(AssertionError, match="is not there"):
        h.check({0: [rec(0, 0, b), rec(0, 1, a)]})
    with pytest.raises(AssertionError, match="stored 2 times"):
        h.check({0: [rec(0, 0, a), rec(0, 1, b), rec(0, 2, a)]})


def test_an_acknowledgement_without_its_offset_needs_exactly_one_copy_in_its_partition():
    h = History()
    a = acked(h, "p0", 0, 1, -1)  # a duplicate answered without its place
    h.check({1: [rec(1, 0, a)]})
    for logs in ({1: []}, {1: [rec(1, 0, a), rec(1, 1, a)]}, {0: [rec(0, 0, a)], 1: []}):
        with pytest.raises(AssertionError, match="offset unknown"):
            h.check(logs)


def test_not_stored_means_not_stored_and_maybe_means_at_most_once():
    h = History()
    no, maybe = h.value("p0", 0), h.value("p0", 1)
    h.fail(no, send_failure(NotEnoughReplicas("ISR 1 < 2"), maybe_stored=False))
    h.fail(maybe, send_failure(DeliveryTimeout("no answer"), maybe_stored=True))
    assert h.check({0: [rec(0, 0, maybe)]}).unsure == 1
    with pytest.raises(AssertionError, match="said not stored but is"):
        h.check({0: [rec(0, 0, no)]})
    with pytest.raises(AssertionError, match="stored 2"):
        h.check({0: [rec(0, 0, maybe), rec(0, 1, maybe)]})


def test_a_failure_must_say_whether_it_may_be_stored():
    h = History()
    h.fail(h.value("p0", 0), DeliveryTimeout("no answer"))  # maybe_stored None: says neither
    with pytest.raises(AssertionError, match="without saying"):
        h.check({0: []})


def test_a_producer_out_of_order_in_a_partition_fails():
    h = History()
    a, b = acked(h, "p0", 0, 0, 1), acked(h, "p0", 1, 0, 0)
    with pytest.raises(AssertionError, match="out of order"):
        h.check({0: [rec(0, 0, b), rec(0, 1, a)]})


def test_offsets_must_be_dense():
    h = History()
    a, b = acked(h, "p0", 0, 0, 0), acked(h, "p0", 1, 0, 2)
    with pytest.raises(AssertionError, match="dense"):
        h.check({0: [rec(0, 0, a), rec(0, 2, b)]})


def test_what_a_consumer_read_must_still_be_there():
    logs = {0: [rec(0, 5, b"x"), rec(0, 6, b"y")]}
    assert check_reads({(0, 5): b"x", (0, 6): b"y", (0, 2): b"gone by retention"}, logs) == 2
    with pytest.raises(AssertionError, match="read b'z' at partition 0 offset 6"):
        check_reads({(0, 6): b"z"}, logs)  # replaced: a divergent tail cut after it was read
    with pytest.raises(AssertionError, match="offset 7"):
        check_reads({(0, 7): b"w"}, logs)  # vanished
