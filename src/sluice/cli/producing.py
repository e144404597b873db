"""``sluice produce``'s moving parts: input split into messages as it arrives, and a sender
that hands them to the producer at once and tallies what the broker acknowledged.

Nothing waits for more input than is there: ``read_available`` returns whatever one
``read`` gives (a typed line, a line from ``tail -f``, up to 1 MiB of a piped file), the
complete messages in it go to the producer straight away, and the producer's linger
(a few ms) batches what comes close together.  A large piped input thus still goes out in
big bulk sends, and a slow one goes out line by line.  Messages with neither key nor
partition go out ``KEYLESS_SPAN`` bytes or ``KEYLESS_COUNT`` messages per bulk send, and the
producer moves each send on to the next partition: an input spreads over all of them, be
its lines long or short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

from sluice import errors

READ_SIZE = 1 << 20
MAX_DELAYED_BATCH = 1000  # messages in one stored batch of ``produce --delay-ms``
KEYLESS_SPAN = 128 * 1024  # bytes of values per bulk send of keyless messages
KEYLESS_COUNT = 1000  # messages per bulk send of keyless messages


def read_available(fd: int, size: int = READ_SIZE) -> Iterator[bytes]:
    """Chunks of ``fd`` as they arrive: each ``read`` blocks only until some bytes are
    there, never for a full buffer.  Ends at end of input."""
    while chunk := os.read(fd, size):
        yield chunk


def split_messages(chunks: Iterable[bytes], delimiter: bytes | None) -> Iterator[list[bytes]]:
    """The messages in ``chunks``: per chunk, the messages it completes (it may complete
    none); at the end, what follows the last delimiter, if anything.

    Only the delimiter is removed (with ``b"\\n"``, a ``\\r`` before it stays in the
    message).  ``delimiter=None``: the whole input is one message, byte for byte, even
    when empty.  Linear in the input, however long a message is.
    """
    buf = bytearray()
    if delimiter is None:
        for chunk in chunks:
            buf += chunk
        yield [bytes(buf)]
        return
    for chunk in chunks:
        search_from = max(0, len(buf) - len(delimiter) + 1)  # a delimiter may straddle chunks
        buf += chunk
        last = buf.rfind(delimiter, search_from)
        if last < 0:
            continue
        complete = bytes(buf[:last])
        del buf[: last + len(delimiter)]
        yield complete.split(delimiter)
    if buf:
        yield [bytes(buf)]


class HeldInterrupts:
    """Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` as usual, except inside ``held()``: a
    hand-over to the producer, after which the sender holds the messages' futures.  There
    it is raised when the section ends, so every message handed over is tallied as
    acknowledged or failed once the producer is closed (interrupted mid-hand-over, the
    messages could be stored while their futures never reached the tally).  A hand-over
    waits for nothing but buffer memory (at most the producer's ``max_block_ms``); a second
    Ctrl-C inside one raises at once.

    ``install()`` / ``uninstall()`` from the main thread only (elsewhere they do nothing:
    signals reach the main thread alone)."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self._previous = None

    def install(self) -> HeldInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum, frame) -> None:
        if self._depth and not self._pending:
            self._pending = True  # raised when the hand-over ends
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._pending and not self._depth:
            self._pending = False
            raise KeyboardInterrupt


class Sender:
    """Sends messages of one topic through a ``SyncProducer``; never waits for acks.

    ``send`` takes values (and, with ``--key-separator``, one key per value).  Messages
    with one key for all and no headers take the producer's bulk path; others are sent one
    by one in a single hop.  Outcomes are tallied on the producer's loop thread (under a
    lock) and, with ``report``, described one line each: where the message went, or why it
    was not sent.  Read ``sent``, ``acked``, ``failed`` and ``first_error`` after
    ``producer.flush()``.  With ``interrupts``, Ctrl-C waits for the hand-over it falls in.
    """

    def __init__(
        self,
        producer,
        topic: str,
        *,
        key: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        partition: int | None,
        report: Callable[[str], None] | None,
        interrupts: HeldInterrupts | None = None,
    ) -> None:
        self.producer, self.topic = producer, topic
        self._held = interrupts.held if interrupts is not None else contextlib.nullcontext
        self.key, self.headers, self.partition = key, headers, partition
        self.report = report
        self.sent = self.acked = self.failed = 0
        self.first_error: BaseException | None = None
        self._lock = threading.Lock()

    def send(self, values: list[bytes], keys: list[bytes] | None = None) -> None:
        """Hand ``values`` to the producer (``keys``: one per value, else ``key`` for all)."""
        if keys is None and self.key is None and self.partition is None and not self.headers:
            for span in spans(values, KEYLESS_SPAN, KEYLESS_COUNT):
                self._send(span, None)
        else:
            self._send(values, keys)

    def _send(self, values: list[bytes], keys: list[bytes] | None) -> None:
        with self._held():  # Ctrl-C once the futures are in hand
            self._hand_over(values, keys)

    def _hand_over(self, values: list[bytes], keys: list[bytes] | None) -> None:
        self.sent += len(values)
        if keys is None and not self.headers:
            try:
                fut = self.producer.send_many(self.topic, values, key=self.key, partition=self.partition)
            except errors.SluiceError:
                pass  # one of them is refused: find which, send the others
            else:
                fut.add_done_callback(lambda f: self._bulk_done(f, len(values)))
                return
        keys = keys if keys is not None else [self.key] * len(values)
        outcomes = self.producer.send_each(
            (self.topic, v, k, self.headers, self.partition) for v, k in zip(values, keys, strict=True)
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                self._failed(outcome)
            else:
                outcome.add_done_callback(self._one_done)

    def refuse(self, error: errors.SluiceError) -> None:
        """Count a message refused before it reached the producer."""
        self.sent += 1
        self._failed(error)

    def _failed(self, error: BaseException, n: int = 1) -> None:
        """Count ``n`` messages failed by ``error`` (and say so when reporting)."""
        with self._lock:
            self.failed += n
            if self.first_error is None:
                self.first_error = error
        if self.report:
            self.report(f"{'' if n == 1 else f'{n} '}not sent: {_describe(error)}")

    def _acked(self, partition: int | None, offsets: list[int]) -> None:
        """Count acknowledged messages (and say where each went when reporting)."""
        with self._lock:
            self.acked += len(offsets)
        if self.report:
            for offset in offsets:
                self.report(_where(partition, offset))

    def _bulk_done(self, fut, n: int) -> None:
        if fut.exception() is not None:
            self._failed(fut.exception(), n)
            return
        result = fut.result()
        if isinstance(result, tuple):  # (partition, base offset), -1 with acks=none
            partition, base = result
            self._acked(partition, [base + i if base >= 0 else -1 for i in range(n)])
        else:
            self._acked(self.partition, result)

    def _one_done(self, fut) -> None:
        if fut.exception() is not None:
            self._failed(fut.exception())
            return
        meta = fut.result()
        self._acked(meta.partition, [meta.offset])

    def summary_error(self) -> str | None:
        """The one-line failure of the whole run (None when every message was acked)."""
        return summary_error(self.failed, self.sent, self.first_error)

    def exit_status(self) -> int:
        return exit_status(self.first_error)


def spans(values: list[bytes], size: int, count: int) -> Iterator[list[bytes]]:
    """``values`` in order, cut into lists of at most ``count`` values and ``size`` bytes of
    values (a longer value alone)."""
    ends = list(accumulate(map(len, values), initial=0))
    i = 0
    while i < len(values):
        j = min(max(bisect_right(ends, ends[i] + size, i + 1) - 1, i + 1), i + count)
        yield values[i:j]
        i = j


def summary_error(failed: int, sent: int, first_error: BaseException | None) -> str | None:
    """The one-line failure of a ``produce`` run (None when nothing failed): the first error,
    ``NAME (code): message`` as every error line, then how many failed."""
    if not failed:
        return None
    more = "" if failed == 1 else "; this was the first"
    noun = "message" if sent == 1 else "messages"
    return f"{_describe(first_error)} ({failed} of {sent} {noun} failed{more})"


def exit_status(first_error: BaseException | None) -> int:
    """The exit status of a run that failed with ``first_error`` first: 2 when it was bad
    input (``USAGE_ERROR``: a line ``--key-separator`` cannot split), else 1."""
    return 2 if isinstance(first_error, errors.UsageError) else 1


def key_separator_missing(separator: bytes, message: bytes) -> errors.UsageError:
    """The error of a message without its key separator (``--key-separator``)."""
    shown = _printable(message[:40]) + ("…" if len(message) > 40 else "")
    return errors.UsageError(f"no key separator '{_printable(separator)}' in message '{shown}'")


def _printable(data: bytes) -> str:
    """``data`` as text for an error line: UTF-8 as is, a backslash doubled, other bytes and
    control characters as one escape each (``\\xff``, ``\\x01``), so the text ``\\x01`` and
    the byte 0x01 read apart."""
    out = []
    for ch in data.decode("utf-8", "surrogateescape"):
        if "\udc80" <= ch <= "\udcff":  # a byte that is not UTF-8
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch == "\\" or not ch.isprintable():
            out.append(repr(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)


def _where(partition: int | None, offset: int) -> str:
    where = "partition ?" if partition is None else f"partition {partition}"
    return f"{where}, offset unknown (acks=none)" if offset < 0 else f"{where}, offset {offset}"


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, errors.SluiceError):
        return errors.describe(exc)
    return f"{type(exc).__name__}: {exc}"


def produce_delayed(bootstrap: str, topic: str, batches: Iterable[list[bytes]], *, delay_ms: int,
                    key: bytes | None, key_separator: bytes | None, headers,
                    partition: int | None, timeout_ms: int) -> tuple[int, str | None, int]:
    """``sluice produce --delay-ms``: each group of messages read together becomes delayed
    messages due ``delay_ms`` after it was read (stored batches of one key each, of at
    most 1000 messages and the topic's ``max.message.bytes``).  A message without
    ``key_separator`` fails, and so does a stored batch the broker refuses (a message too
    large on its own), or does not store within ``timeout_ms``; the others are stored.
    Returns how many were stored, the run's ``summary_error`` (None when none failed) and
    its ``exit_status``."""
    import asyncio
    import time

    from sluice.client.transaction import DelayedProducer, split_delayed

    hdrs = list(headers or ())

    async def run() -> tuple[int, str | None, int]:
        seen = stored = failed = 0
        first: BaseException | None = None
        async with DelayedProducer(bootstrap, retry_timeout_ms=timeout_ms) as producer:
            limit = await producer.max_message_bytes(topic)
            for values in batches:
                at = int(time.time() * 1000) + delay_ms
                by_key: dict[bytes | None, list] = {}
                seen += len(values)
                for v in values:
                    k = key
                    if key_separator is not None:
                        k, sep, v = v.partition(key_separator)
                        if not sep:
                            failed += 1
                            first = first or key_separator_missing(key_separator, k)
                            continue
                    by_key.setdefault(k, []).append((k, v, hdrs))
                for recs in by_key.values():
                    for chunk in split_delayed(recs, at, limit, MAX_DELAYED_BATCH):
                        try:
                            await producer.send_delayed(topic, chunk, deliver_at_ms=at, partition=partition)
                        except errors.SluiceError as exc:
                            failed += len(chunk)
                            first = first or exc
                        else:
                            stored += len(chunk)
        return stored, summary_error(failed, seen, first), exit_status(first)

    return asyncio.run(run())
