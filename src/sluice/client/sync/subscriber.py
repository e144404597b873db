"""``SyncSubscriber``: the blocking ``Subscriber`` (client/subscriber.py)."""

from __future__ import annotations

from sluice.client.loop_thread import LoopThread
from sluice.client.subscriber import Message, Subscriber

__all__ = ["SyncSubscriber"]


class SyncSubscriber:
    """Blocking ``Subscriber`` (takes the same arguments), for scripts and the command
    line: it runs in a private event loop thread (``LoopThread``).  Messages it returns
    may be acked, nacked and touched from any thread."""

    def __init__(self, bootstrap, topic: str, subscription: str, **config) -> None:
        self._lt = LoopThread("sluice-subscriber")

        async def create() -> Subscriber:
            sub = Subscriber(bootstrap, topic, subscription, **config)
            await sub.start()
            return sub

        try:
            self._sub = self._lt.run(create())
        except BaseException:
            self._lt.stop()
            raise
        self._closed = False

    @property
    def created(self) -> set[int]:
        """Partitions where subscribing created the subscription (``Subscriber.created``)."""
        return set(self._sub.created)

    def get(self, timeout: float | None = None) -> Message | None:
        return self._lt.run(self._sub.get(timeout))

    def getmany(self, max_records: int = 1000, timeout: float = 0) -> list[Message]:
        return self._lt.run(self._sub.getmany(max_records, timeout))

    def __iter__(self):
        while (msg := self.get()) is not None:
            yield msg

    def flush(self) -> None:
        self._lt.run(self._sub.flush())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._sub.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> SyncSubscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
