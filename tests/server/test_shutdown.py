"""SIGTERM stops a real broker process promptly, idle or with consumers waiting on it."""

from __future__ import annotations

import time

import pytest

from sluice.client import SyncConsumer

pytestmark = pytest.mark.timeout(60)

# Generous for a loaded 2-core machine; a clean stop takes well under 0.1 s when nothing
# holds it, while a waiting fetch used to hold it for the fetch's max wait (10 s here).
EXIT_BOUND_S = 1.0


def timed_stop(broker) -> float:
    t0 = time.monotonic()
    assert broker.stop() == 0
    return time.monotonic() - t0


def test_idle_broker_exits_promptly_after_sigterm(broker, cli):
    b = broker.bootstrap
    assert cli("topic", "create", "t", "--partitions", "3", bootstrap=b).returncode == 0
    assert cli("produce", "t", bootstrap=b, input=b"a\nb\n").returncode == 0
    assert cli("consume", "t", "--group", "g", "-e", bootstrap=b).returncode == 0
    assert timed_stop(broker) < EXIT_BOUND_S
    assert "stopped" in broker.log()


def test_sigterm_answers_waiting_fetches_at_once(broker, cli):
    """A consumer long-polling an idle topic (max wait 10 s) does not hold the shutdown."""
    b = broker.bootstrap
    assert cli("topic", "create", "idle", "--partitions", "2", bootstrap=b).returncode == 0
    consumer = SyncConsumer(b, fetch_max_wait_ms=10_000, request_timeout_ms=30_000,
                            auto_offset_reset="latest", retry_timeout_ms=0)
    try:
        consumer.assign([("idle", 0), ("idle", 1)])
        # Empty after 300 ms: its fetch is parked on the broker, which answers an empty
        # partition only after the 10 s max wait.
        assert consumer.getmany(timeout_ms=300) == []
        took = timed_stop(broker)
    finally:
        consumer.close()
    assert took < EXIT_BOUND_S, f"SIGTERM to exit took {took:.2f}s"
