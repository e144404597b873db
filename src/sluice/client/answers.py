"""The producer's answers: what each batch of a produce request becomes once the broker
answered, or the request failed as a whole (DESIGN §4).

Records are completed from the answer's ``batch_offsets``, never by adding counts.
OUT_OF_ORDER_SEQUENCE is retried when an earlier batch is still outstanding, renumbers the
partition when the client made the gap itself (client/sequences.py), and fails the part
otherwise.  PRODUCER_FENCED fails every batch and every later send.  Retriable errors and
broken connections requeue (client/retries.py); anything else fails the batches.

Concurrency: the producer's loop only.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice import errors
from sluice.client.accumulator import Batch
from sluice.client.flights import TP, InFlight
from sluice.client.retries import Retries
from sluice.client.sequences import GAP, RETRY, PartitionSequences
from sluice.client.state import ProducerState
from sluice.protocol import messages


class Answers:
    """Settles batches from answers and request failures (module docstring).

    Collaborators: the producer's shared ``state`` (its accumulator), the sender's
    ``in_flight`` bookkeeping (a success clears the partition's failure count), the
    partitions' ``sequences`` (client/identity.py), ``retries``, ``release(batch)`` and
    ``fence(exc)`` (the producer was fenced: client/sender.py).
    """

    def __init__(
        self,
        state: ProducerState,
        in_flight: InFlight,
        sequences: dict[TP, PartitionSequences],
        retries: Retries,
        *,
        release: Callable[[Batch], None],
        fence: Callable[[errors.ProducerFenced], None],
    ) -> None:
        self._acc = state.accumulator
        self._failures = in_flight.failures
        self._seqs = sequences
        self._retry = retries.retry
        self._release = release
        self._fence = fence

    def on_response(self, batches: dict[TP, list[Batch]], response: messages.ProduceResponseV2) -> None:
        if response.error:  # the whole request was answered with one error
            exc = errors.error_for_code(response.error, response.message)
            for tp, bs in batches.items():
                self._on_partition_error(tp, bs, exc)
            return
        results = {(r.topic, r.partition): r for r in response.partitions}
        for tp, bs in batches.items():
            r = results.get(tp)
            if r is None:
                exc = errors.UnknownServerError(f"no result for {tp} in the produce response")
                self._on_partition_error(tp, bs, exc)
            elif r.error:
                self._on_partition_error(tp, bs, errors.error_for_code(r.error, r.message))
            elif len(r.batch_offsets) != len(bs):
                exc = errors.UnknownServerError(
                    f"{len(r.batch_offsets)} batch offsets answered for {len(bs)} batches of {tp}"
                )
                self._on_partition_error(tp, bs, exc)
            else:
                self._failures.pop(tp, None)
                st = self._seqs.get(tp)
                for b, offset in zip(bs, r.batch_offsets, strict=True):
                    b.settle(known=True)
                    if st is not None:
                        st.acknowledged(b)
                    self.complete(b, offset, r.log_append_time)

    def _on_partition_error(self, tp: TP, bs: list[Batch], exc: errors.BrokerError) -> None:
        for b in bs:
            b.settle(known=exc.appended_nothing)
        if isinstance(exc, errors.OutOfOrderSequence) and tp in self._seqs:
            self._on_out_of_order(tp, bs, exc)
        elif isinstance(exc, errors.ProducerFenced):
            self._fence(exc)
            self.fail(bs, exc)
        elif exc.retriable:
            self._retry(tp, bs, exc)
        else:
            self.fail(bs, exc)

    def _on_out_of_order(self, tp: TP, bs: list[Batch], exc: errors.OutOfOrderSequence) -> None:
        """The broker has none of ``bs`` (client/sequences.py): retry them behind an earlier
        outstanding batch, renumber the partition after a gap the client made, or fail."""
        st = self._seqs[tp]
        for b in bs:
            b.maybe_stored = False
        kind = st.classify(bs[0])
        if kind == RETRY:
            self._retry(tp, bs, exc, counted=False)
        elif st.explicit:
            note = "a batch before it failed, and an explicit producer identity is never renumbered"
            self.fail(bs, errors.annotated(exc, f"({note})") if kind == GAP else exc)
        elif kind == GAP:
            st.renumber_pending = True
            self._retry(tp, bs, exc, counted=False)
        else:  # LOST: acknowledged batches are gone; these fail, later ones go on
            st.renumber_pending = True
            self.fail(bs, exc)

    def on_request_error(self, batches: dict[TP, list[Batch]], exc: errors.SluiceError) -> None:
        """The request failed as a whole (no answer read): retry or fail every batch."""
        retriable = exc.retriable or isinstance(exc, errors.ConnectionClosed)
        for tp, bs in batches.items():
            if retriable:
                self._retry(tp, bs, exc)
            else:
                self.fail(bs, exc)

    def abandon(self, batches: dict[TP, list[Batch]], exc: BaseException) -> None:
        """Fail every batch of ``batches`` still unfinished and not requeued."""
        acc = self._acc
        for tp, bs in batches.items():
            q = acc.queues.get(tp, ())
            for b in bs:
                if b in acc.incomplete and b not in q:
                    acc.finish(b, exc, self._release)

    def fail(self, bs: list[Batch], exc: Exception) -> None:
        for b in bs:
            self._acc.finish(b, exc, self._release)

    def complete(self, batch: Batch, base_offset: int, append_time: int) -> None:
        batch.resolve(base_offset, append_time)
        self._acc.finish(batch, None, self._release)
