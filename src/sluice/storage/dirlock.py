"""The data directory's lock: one broker per data directory, taken before anything is read.

Two brokers on one directory would both recover, append and cut each other's logs, losing
acknowledged messages.  ``DataDirLock.acquire`` takes an exclusive ``flock`` on
``<data_dir>/.lock`` (created if missing) and writes the holder's pid into it for the
refusal message of the next one.  The kernel drops the lock when the process exits, however
it exits (``kill -9`` included), so a stale file never blocks a restart.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from sluice.errors import ConfigError, DataDirInUse, storage_error_from_os

LOCK_NAME = ".lock"


class DataDirLock:
    """An exclusive lock on a data directory, held until ``release`` or process exit."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Create the directory if needed and lock it; ``DataDirInUse`` when another
        process holds it, ``ConfigError`` when the path is not a usable directory."""
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise ConfigError(f"data directory {self.data_dir} exists and is not a directory")
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"cannot use data directory {self.data_dir}: {storage_error_from_os(exc, 'open').message}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConfigError(f"cannot lock data directory {self.data_dir}: {exc.strerror}") from exc
            who = f" by another broker (pid {holder})" if holder else " by another broker"
            raise DataDirInUse(f"data directory {self.data_dir} is in use{who}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
