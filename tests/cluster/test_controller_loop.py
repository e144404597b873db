"""The controller's serving loop on the embedded store: it waits when there is nothing to do."""

from __future__ import annotations

import asyncio
import contextlib
import time

from sluice.cluster.controller import Controller
from sluice.cluster.embedded import EmbeddedStore
from sluice.cluster.store import BrokerRegistration


async def test_a_poke_that_finds_no_move_leaves_the_controller_waiting(tmp_path):
    """A poke whose look finds no pending move must not leave the loop waking at once
    again and again: the broker would burn a core while idle."""
    store = EmbeddedStore(tmp_path, 0)
    await store.start()
    await store.register_broker(BrokerRegistration(0, "127.0.0.1", 1))
    controller = Controller(store, 0, rebalance_interval_ms=0)
    controller.poke()  # a partition state changed just as the term starts: its first look sees it
    task = asyncio.ensure_future(controller.run())
    try:
        deadline = time.monotonic() + 10
        while controller.live != {0} or controller.moves_pending:
            assert time.monotonic() < deadline, "the controller did not take its first look"
            await asyncio.sleep(0.01)
        assert await cpu_in(0.5) < 0.1, "an idle controller kept a core busy"
        controller.poke()  # and a poke later on is looked at, then waited out the same way
        await asyncio.sleep(0.7)
        assert not controller.moves_pending
        assert await cpu_in(0.5) < 0.1, "an idle controller kept a core busy after a poke"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


async def cpu_in(seconds: float) -> float:
    """CPU seconds this process used while the loop ran for ``seconds``."""
    cpu = time.process_time()
    await asyncio.sleep(seconds)
    return time.process_time() - cpu
