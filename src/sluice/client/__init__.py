"""Sluice Python clients: asyncio ``Producer`` / ``Consumer`` / ``Admin`` and their blocking
``Sync*`` facades.  Only ``transport`` touches sockets; see each module's charter."""

from sluice.client.admin import Admin
from sluice.client.consumer import Consumer
from sluice.client.producer import InOrderCallbacks, Producer, RecordMetadata
from sluice.client.status import BrokerStatus, ClusterStatus, PartitionStatus
from sluice.client.sync import SyncAdmin, SyncConsumer, SyncProducer, SyncTransactionProducer
from sluice.client.transaction import (
    LocalTransactionState,
    TransactionMessage,
    TransactionProducer,
    TransactionResult,
)

__all__ = [
    "Admin",
    "BrokerStatus",
    "ClusterStatus",
    "Consumer",
    "InOrderCallbacks",
    "LocalTransactionState",
    "PartitionStatus",
    "Producer",
    "RecordMetadata",
    "SyncAdmin",
    "SyncConsumer",
    "SyncProducer",
    "SyncTransactionProducer",
    "TransactionMessage",
    "TransactionProducer",
    "TransactionResult",
]
