"""Blocking facades over the asyncio clients, for the CLI, scripts and Spark executors.

Each facade owns a private event loop running in a daemon thread (client/loop_thread.py)
and forwards calls with ``asyncio.run_coroutine_threadsafe``; the asyncio client is created inside that loop on first
use.  The facades are safe to call from any thread (calls are serialised onto the loop).
``close()`` is final: calls still blocked in other threads then fail with ``ClientClosed``,
and so does every later call (a closed facade never reopens).  They pickle as their
configuration only: an unpickled facade opens its own connections on first use.

One module per facade (producer, transaction, consumer, admin, subscriber) over the loop
thread bridge they share (base.py); the names users import are re-exported here.
"""

from __future__ import annotations

from sluice.client.sync.admin import SyncAdmin
from sluice.client.sync.consumer import SyncConsumer
from sluice.client.sync.producer import SyncProducer
from sluice.client.sync.subscriber import SyncSubscriber as SyncSubscriber  # importable, as ever
from sluice.client.sync.transaction import SyncTransactionProducer

__all__ = ["SyncProducer", "SyncConsumer", "SyncAdmin", "SyncTransactionProducer"]
