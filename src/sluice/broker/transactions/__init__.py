"""Transactional and delayed messages on the broker (DESIGN §5, §6).

- ``manager.py``: ``TransactionManager``, the state of every partition led here and the APIs;
- ``partition.py``: ``PartitionTransactions``, one partition's open and ended halves, ends;
- ``halves.py``: half messages in the log, and the scans that read them back;
- ``check_back.py``: asking producers about old open halves, discarding them;
- ``audit.py``: the copies of discarded halves in ``__txn_discarded``;
- ``delays.py``: ``DelayedDelivery``, committing delayed messages when due.
"""

from sluice.broker.transactions.delays import DelayedDelivery
from sluice.broker.transactions.manager import TransactionManager

__all__ = ["DelayedDelivery", "TransactionManager"]
