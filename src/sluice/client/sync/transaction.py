"""``SyncTransactionProducer``: the blocking ``TransactionProducer`` (client/transaction.py)."""

from __future__ import annotations

from sluice.client.sync.base import SyncBase
from sluice.client.transaction import TransactionProducer, _state_of

__all__ = ["SyncTransactionProducer"]


class SyncTransactionProducer(SyncBase):
    """Blocking ``TransactionProducer``.  ``local_transaction`` runs in the calling thread
    (between storing the half message and ending it); ``check_local_transaction`` runs in
    a worker thread of the client.  It starts (registers its group for check-back) on
    first use or on ``with``."""

    _client_cls = TransactionProducer
    _thread_name = "sluice-txn-producer"

    def send_in_transaction(self, topic: str, value: bytes | None, local_transaction, **kw):
        msg = self._call(TransactionProducer.send_half, topic, value, **kw)
        state = _state_of(local_transaction(msg))
        return self._call(TransactionProducer.finish, msg, state)

    def end_transaction(self, txn_id: str, commit: bool):
        return self._call(TransactionProducer.end_transaction, txn_id, commit)

