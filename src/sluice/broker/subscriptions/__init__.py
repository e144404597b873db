"""Subscriptions on the broker: durable cursors over a topic's partitions, delivered with
per-message acks (DESIGN §3).

- ``manager.py``: ``SubscriptionManager``, the subscriptions of every partition led here;
- ``handlers.py``: the APIs (subscribe, ack, create, delete, seek, describe);
- ``partition.py``: ``PartitionSubscriptions``, those of one partition, loaded and written;
- ``store.py``: their durable state, control batches in the partition's own log;
- ``delivery.py``: ``SubscriptionPartition``, the delivery state machine of one: it reads
  the log and pushes to the sessions; ``ledger.py``: its books (``Ledger``: what is
  settled, out, retried, held behind a key);
- ``cursor.py`` (settled offsets), ``in_flight.py`` (deliveries out), ``retries.py``
  (pending redeliveries and their journal), ``keys.py`` (key-ordered mode);
- ``session.py``: one connection's subscription, its credit;
- ``dead_letters.py``: copies of the messages given up on.
"""

from sluice.broker.subscriptions.manager import SubscriptionManager

__all__ = ["SubscriptionManager"]
