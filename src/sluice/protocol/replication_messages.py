"""The replication APIs' structs: broker to broker, never sent by clients (registered in
messages.py, which re-exports them).

A follower pulls its partitions from their leader (REPLICA_FETCH; version 2 carries the
epoch of its last batch, Kafka's KIP-320), asks where an epoch ends when it must cut its
log (OFFSETS_FOR_LEADER_EPOCH), and an operator's or a broker's ELECT_LEADERS moves
leadership and replicas (broker/replication/).
"""

from __future__ import annotations

from sluice.protocol.structs import Response, Struct


class ReplicaFetchPartition(Struct):
    topic: str
    partition: int
    leader_epoch: int  # the follower's view: the leader refuses an older or newer one
    offset: int  # the follower's log end: everything below it is acknowledged as copied
    max_bytes: int = 1024 * 1024
    storage_error: str = ""  # the follower cannot write this partition: leave the ISR now


class ReplicaFetchRequest(Struct):
    replica_id: int
    partitions: list[ReplicaFetchPartition]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 * 1024 * 1024


class ReplicaFetchResult(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    size: int = 0  # bytes of record batches in the attachments, in list order


class ReplicaFetchResponse(Response):
    partitions: list[ReplicaFetchResult] = []


class ReplicaFetchPartitionV2(ReplicaFetchPartition):
    """Version 2 (Kafka's KIP-320): the follower also says the leader epoch of the last
    batch in its log, so the leader checks that the follower's log below ``offset`` is its
    own before counting it as copied."""

    last_fetched_epoch: int = -1  # -1: an empty log (nothing to check)


class ReplicaFetchRequestV2(ReplicaFetchRequest):
    partitions: list[ReplicaFetchPartitionV2]


class ReplicaFetchResultV2(ReplicaFetchResult):
    """``diverging``: the follower's log does not end in its last epoch where the leader's
    log has that epoch, so what it holds below ``offset`` is not all the leader's.
    ``diverging_epoch`` is the largest epoch the leader has at or below the follower's and
    ``diverging_end_offset`` where it ends in the leader's log (-1, -1: the leader knows
    none of its epochs).  The follower cuts its log there and fetches again; no data comes
    with it, and the leader has not counted the fetch as copied."""

    diverging: bool = False
    diverging_epoch: int = -1
    diverging_end_offset: int = -1


class ReplicaFetchResponseV2(ReplicaFetchResponse):
    partitions: list[ReplicaFetchResultV2] = []


class EpochQuery(Struct):
    topic: str
    partition: int
    current_leader_epoch: int  # the asker's view of the partition's epoch (fencing)
    leader_epoch: int  # the epoch whose end offset is asked for


class OffsetsForLeaderEpochRequest(Struct):
    replica_id: int
    partitions: list[EpochQuery]


class EpochEndOffset(Struct):
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    leader_epoch: int = -1  # the largest epoch <= the asked one that the leader has
    end_offset: int = -1  # where that epoch ends in the leader's log


class OffsetsForLeaderEpochResponse(Response):
    partitions: list[EpochEndOffset] = []


class ElectLeadersRequest(Struct):
    """Give each partition without a live leader one where a replica is eligible (the
    others are answered ``ELIGIBLE_LEADERS_NOT_AVAILABLE``), then move leadership back to
    each partition's preferred replica (the first of its replicas) where it is alive and in
    sync; None: every partition.

    ``reassign`` (added later; older brokers ignore it): first replace the replicas of
    brokers that are not alive by live ones (the least loaded), in partitions that have
    a live leader; then record moves that even out the replica load of the live brokers
    (brokers that joined), done in two phases (``ReplicaMove.pending``)."""

    topics: list[str] | None = None
    reassign: bool = False


class ReplicaMove(Struct):
    """A partition whose replicas changed from ``old`` to ``new`` (same order), or could
    not (``error``).

    ``pending`` (added later): a move in two phases, recorded: the replicas of ``new``
    not in ``old`` were added, those of ``old`` not in ``new`` leave once the others
    are in sync (the controller completes it)."""

    topic: str
    partition: int
    old: list[int] = []
    new: list[int] = []
    error: int = 0
    message: str = ""
    pending: bool = False


class ElectionResult(Struct):
    topic: str
    partition: int
    leader: int
    error: int = 0
    message: str = ""


class ElectLeadersResponse(Response):
    partitions: list[ElectionResult] = []  # the partitions whose leader changed or could not
    moves: list[ReplicaMove] = []  # with ``reassign``: the replicas replaced, or that could not be
