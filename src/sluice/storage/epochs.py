"""Leader-epoch cache of one partition: which leader epoch started at which offset.

Every batch header carries the leader epoch of the leader that appended it (``assign_offsets``
stamps it; a follower keeps the leader's).  Epochs never decrease along a log, so the log is
a run of epochs, and the cache keeps the first offset of each: ``[(epoch, start_offset)]``,
strictly increasing in both.  It is derived data (DESIGN §0): ``PartitionLog.open`` rebuilds
it from batch headers, appends extend it, truncation and retention cut it.  Nothing else
is authoritative about epochs, so there is no file to keep consistent with the log.

``end_offset_for_epoch`` answers Kafka's OffsetsForLeaderEpoch: a follower of a new leader
asks where its last epoch ends on the leader and truncates its divergent tail there.

Concurrency: event loop only (the partition's writer changes it; lookups read it).
"""

from __future__ import annotations

from bisect import bisect_right

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self.epochs: list[int] = []
        self.starts: list[int] = []
        for epoch, start in entries or ():
            self.assign(epoch, start)

    def __len__(self) -> int:
        return len(self.epochs)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self.epochs, self.starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        """The epoch of the last batch of the log; ``UNDEFINED_EPOCH`` for an empty log."""
        return self.epochs[-1] if self.epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` if it is newer than the latest.

        An epoch at or below the latest one is no change (the batches of a run after its
        first).  Returns True when an entry was added.  A start offset below the latest
        entry's would make the cache lie: ``ValueError``.  One equal to it replaces the
        latest entry: that epoch holds no batch (a leader stamps its epoch at the log end
        when elected, before any write, and may be followed by another without writing).
        """
        if epoch < 0 or (self.epochs and epoch <= self.epochs[-1]):
            return False
        if self.starts and start_offset < self.starts[-1]:
            raise ValueError(
                f"epoch {epoch} cannot start at {start_offset}, below epoch "
                f"{self.epochs[-1]}'s start {self.starts[-1]}"
            )
        if self.starts and start_offset == self.starts[-1]:
            self.epochs[-1] = epoch
            return True
        self.epochs.append(epoch)
        self.starts.append(start_offset)
        return True

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: ``(epoch found, end offset)`` for ``epoch``.

        - ``epoch`` is the latest: ``(epoch, log_end_offset)``;
        - an older epoch: the start offset of the first later epoch, with the largest epoch
          at or below ``epoch`` (``epoch`` itself when it is below every known epoch: the
          end is then the first entry's start);
        - ``epoch`` above the latest, undefined, or an empty cache:
          ``(UNDEFINED_EPOCH, UNDEFINED_OFFSET)``.
        """
        if epoch == UNDEFINED_EPOCH or not self.epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.epochs[-1]:
            return epoch, log_end_offset
        i = bisect_right(self.epochs, epoch)  # first entry with a higher epoch
        if i == len(self.epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        floor = self.epochs[i - 1] if i else epoch
        return floor, self.starts[i]

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was cut there)."""
        i = bisect_right(self.starts, end_offset - 1)
        del self.epochs[i:], self.starts[i:]

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: entries before it go, except that the
        epoch in force there now starts there."""
        i = bisect_right(self.starts, start_offset)  # entries at or below the new start
        if i == 0:
            return
        del self.epochs[: i - 1], self.starts[: i - 1]
        self.starts[0] = start_offset
