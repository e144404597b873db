"""Topic administration: create, delete, list, describe, list offsets.

Thin: each method is one request to a broker (the controller when metadata names one) and
turns per-topic or per-partition error codes into exceptions with ``errors.raise_for_code``.
Belongs to one event loop; ``client.sync.SyncAdmin`` is the blocking twin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice import errors
from sluice.client.transport import Cluster, ConnectionFactory
from sluice.protocol import messages
from sluice.protocol.messages import TopicDescription, TopicMetadata

__all__ = ["Admin", "TopicDescription", "TopicMetadata"]


class Admin:
    """Administrative requests against a cluster."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: float = 30000,
        connect_timeout_ms: float = 10000,
        connection_factory: ConnectionFactory | None = None,
    ) -> None:
        self._cluster = Cluster(
            bootstrap,
            connection_factory=connection_factory,
            connect_timeout=connect_timeout_ms / 1000,
            request_timeout=request_timeout_ms / 1000,
        )

    async def start(self) -> None:
        """Optional: connect now (methods connect on first use)."""
        await self._cluster.refresh([])

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _request(self, request):
        return (await self._cluster.request(request))[0]

    async def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        """Create a topic; ``TopicAlreadyExists``, ``InvalidTopicName``, ... on failure."""
        if not isinstance(partitions, int) or isinstance(partitions, bool):
            raise errors.ConfigError(f"partitions must be an int, got {partitions!r}")
        # the range is the broker's to check: it answers INVALID_PARTITIONS
        cfg = {str(k): str(v) for k, v in (config or {}).items()}
        resp = await self._request(
            messages.CreateTopicsRequest(
                topics=[messages.NewTopic(name=name, partitions=partitions, config=cfg)]
            )
        )
        for r in resp.topics:
            errors.raise_for_code(r.error, r.message or r.name)

    async def delete_topic(self, name: str) -> None:
        resp = await self._request(messages.DeleteTopicsRequest(names=[name]))
        for r in resp.topics:
            errors.raise_for_code(r.error, r.message or r.name)

    async def list_topics(self) -> list[TopicMetadata]:
        """Metadata of every topic (partition leaders, replicas, max message bytes)."""
        resp = await self._request(messages.MetadataRequest(topics=None))
        return list(resp.topics)

    async def describe_topic(self, name: str) -> TopicDescription:
        """Config and per-partition log state (start offset, high watermark, size) of a topic."""
        resp = await self._request(messages.DescribeTopicsRequest(names=[name]))
        for t in resp.topics:
            if t.name == name:
                errors.raise_for_code(t.error, t.message or name)
                return t
        raise errors.UnknownTopic(name)

    async def list_offsets(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        timestamp: int = messages.LATEST,
    ) -> dict[int, int]:
        """Offsets of ``topic``'s partitions (all by default) at ``timestamp``.

        ``messages.LATEST`` (-1): the next offset to be written; ``messages.EARLIEST`` (-2):
        the first offset kept; a time in ms: the first offset with a timestamp >= it (-1 if
        none).  Returns {partition: offset}.
        """
        if partitions is None:
            resp = await self._request(messages.MetadataRequest(topics=[topic]))
            for t in resp.topics:
                errors.raise_for_code(t.error, t.message or topic)
            partitions = sorted(p.partition for t in resp.topics for p in t.partitions)
        req = messages.ListOffsetsRequest(
            partitions=[
                messages.ListOffsetsPartition(topic=topic, partition=p, timestamp=timestamp)
                for p in partitions
            ]
        )
        resp = await self._request(req)
        out = {}
        for r in resp.partitions:
            errors.raise_for_code(r.error, r.message)
            out[r.partition] = r.offset
        return out
