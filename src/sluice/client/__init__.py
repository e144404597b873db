"""Sluice Python clients: asyncio ``Producer`` / ``Consumer`` / ``Admin`` and their blocking
``Sync*`` facades.  Only ``transport`` touches sockets; see each module's charter."""

from sluice.client.admin import Admin
from sluice.client.consumer import Consumer
from sluice.client.producer import InOrderCallbacks, Producer, RecordMetadata
from sluice.client.status import BrokerStatus, ClusterStatus, PartitionStatus
from sluice.client.subscriber import Message, Subscriber
from sluice.client.sync import (
    SyncAdmin,
    SyncConsumer,
    SyncProducer,
    SyncSubscriber,
    SyncTransactionProducer,
)
from sluice.client.transaction import (
    DelayedMessages,
    DelayedProducer,
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
    "DelayedMessages",
    "DelayedProducer",
    "InOrderCallbacks",
    "LocalTransactionState",
    "Message",
    "PartitionStatus",
    "Producer",
    "RecordMetadata",
    "Subscriber",
    "SyncAdmin",
    "SyncConsumer",
    "SyncProducer",
    "SyncSubscriber",
    "SyncTransactionProducer",
    "TransactionMessage",
    "TransactionProducer",
    "TransactionResult",
]
