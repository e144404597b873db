"""What ``sluice consume --group`` may commit: the records its reader took, not the ones
still waiting in a pipe.

Written to a pipe, a record is not read yet: up to the pipe's buffer (64 KiB on Linux)
waits there, and ``consume --group G | head -1`` would otherwise commit every record that
fit.  ``Delivered`` counts the bytes written and asks the kernel how many are still
unread (``FIONREAD`` on the pipe), so a group's commit stops at the first record the
reader has not taken.  On a terminal or into a file, a record written is delivered.

Main thread only (the command's loop).
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import stat
import struct
import termios
import time

TP = tuple[str, int]
WAIT_READ_S = 5.0  # at the end, how long the reader is given to take what is in the pipe


def is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


class Delivered:
    """Records written to ``fd``, in order, and which of them its reader took."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pipe = is_pipe(fd)
        self.written = 0  # bytes written to fd
        self._unread: collections.deque[tuple[int, TP, int]] = collections.deque()  # (end byte, tp, offset)
        self._first_unread: dict[TP, int] = {}  # by partition: the offset of its first record still in the pipe

    def wrote(self, records, sizes: list[int]) -> None:
        """``records`` were written, ``sizes`` bytes each, in order."""
        for rec, size in zip(records, sizes, strict=True):
            self.written += size
            if self.pipe:
                self._unread.append((self.written, (rec.topic, rec.partition), rec.offset))

    def unread_bytes(self) -> int:
        """Bytes written to the pipe its reader has not taken (0 for anything else)."""
        if not self.pipe:
            return 0
        try:
            return struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0" * 4))[0]
        except OSError:
            return 0

    def committable(self, positions: dict[TP, int]) -> dict[TP, int]:
        """``positions`` (the consumer's, by partition), held back to the first record of
        each partition that is still unread in the pipe."""
        taken = self.written - self.unread_bytes()
        while self._unread and self._unread[0][0] <= taken:
            self._unread.popleft()
        first: dict[TP, int] = {}
        for _, tp, offset in self._unread:
            first.setdefault(tp, offset)
        return {tp: min(pos, first[tp]) if tp in first else pos for tp, pos in positions.items()}

    def wait_read(self, timeout_s: float = WAIT_READ_S, poll_s: float = 0.02) -> None:
        """Wait until the reader took everything written, or left, for ``timeout_s`` at
        most: a reader that reads only once the command has exited (``Popen.wait()``
        before ``read()``) must not hang it.  What it had not taken by then stays
        uncommitted, to be read again by the group's next run."""
        if not self.pipe:
            return
        watch = select.poll()
        watch.register(self.fd, 0)  # POLLERR / POLLHUP only: the reader closed its end
        deadline = time.monotonic() + timeout_s
        while self.unread_bytes() > 0 and not watch.poll(0) and time.monotonic() < deadline:
            time.sleep(poll_s)
