"""Re-driving dead letters: copy a subscription's dead letters back into their topic.

A dead letter is a copy of a message in ``<topic>.<subscription>.dlq`` with the
``sluice.dlq.*`` headers (protocol/subscriptions.py).  ``redrive`` reads the dead-letter
topic through a subscription of its own and copies each dead letter of the given
subscription back into its original partition without those headers, acking it once the
copy is acknowledged: a re-drive cut short goes on where it stopped.
"""

from __future__ import annotations

from sluice import errors
from sluice.client.subscriber import Subscriber
from sluice.protocol.subscriptions import (
    DLQ_HEADERS,
    DLQ_PARTITION,
    DLQ_SUBSCRIPTION,
    DLQ_TOPIC,
    dlq_topic,
)

REDRIVE_SUBSCRIPTION = "sluice.redrive"  # before 2 subscriptions could share a dead-letter topic


def redrive_subscription(topic: str) -> str:
    """The subscription a re-drive into ``topic`` reads the dead-letter topic through:
    ``sluice.redrive.<length of topic>``.  The length tells the pairs that share a
    dead-letter topic apart (``col`` + ``x.y``, ``col.x`` + ``y``: creating the second is
    refused now, not so before), so each re-drive keeps its own place."""
    return f"{REDRIVE_SUBSCRIPTION}.{len(topic)}"


async def redrive(bootstrap, topic: str, subscription: str, *, idle_s: float = 1.0) -> int:
    """Copy the dead letters of ``subscription`` of ``topic`` — the messages of its
    dead-letter topic whose ``sluice.dlq.topic`` and ``sluice.dlq.subscription`` headers
    name them — back into ``topic``, into their original partition, without the
    ``sluice.dlq.*`` headers, and return how many.  It reads the dead-letter topic through
    the subscription ``redrive_subscription(topic)`` and acks each message once its copy
    is acknowledged (or at once, another's dead letter): a re-drive cut short goes on where
    it stopped, and copies nothing twice unless its acks were lost.

    0 when there is no dead-letter topic yet; ``UnknownTopic`` without ``topic``,
    ``UnknownSubscription`` without either the subscription or its dead-letter topic (the
    dead letters of a deleted subscription can still be re-driven)."""
    from sluice.client.admin import Admin
    from sluice.client.producer import Producer

    source = dlq_topic(topic, subscription)
    name = redrive_subscription(topic)
    mine = (topic.encode(), subscription.encode())
    copied = 0
    async with Admin(bootstrap) as admin:
        count = len((await admin.describe_topic(topic)).partitions)
        if source not in {t.name for t in await admin.list_topics()}:
            await admin.describe_subscription(topic, subscription)  # UnknownSubscription if none
            return 0
        start = await _legacy_redrive_position(admin, source)
        async with Producer(bootstrap, acks="all") as producer, \
                Subscriber(bootstrap, source, name, create=True, start=start) as sub:
            while True:
                batch = await sub.getmany(1000, idle_s)
                if not batch:
                    await sub.flush()
                    infos = await admin.describe_subscription(source, name)
                    if all(i.backlog == 0 and i.in_flight == 0 and i.retrying == 0 for i in infos):
                        return copied
                    continue
                sent = []
                for msg in batch:
                    if (msg.header(DLQ_TOPIC), msg.header(DLQ_SUBSCRIPTION)) != mine:
                        msg.ack()  # another subscription's, sharing the name: its re-drive's
                        continue
                    part = msg.header(DLQ_PARTITION)
                    partition = int(part) if part is not None and part.isdigit() and int(part) < count else None
                    headers = [(k, v) for k, v in msg.headers if k not in DLQ_HEADERS]
                    fut = await producer.send(topic, msg.value, key=msg.key, headers=headers, partition=partition)
                    sent.append((msg, fut))
                for msg, fut in sent:
                    await fut
                    msg.ack()
                    copied += 1


async def _legacy_redrive_position(admin, source: str) -> str | int:
    """Where a new per-topic re-drive subscription starts: where the one all re-drives
    of ``source`` once shared (``sluice.redrive``) got to, else the earliest message."""
    try:
        infos = await admin.describe_subscription(source, REDRIVE_SUBSCRIPTION)
    except errors.UnknownSubscription:
        return "earliest"
    return min((i.confirmed for i in infos), default="earliest")
