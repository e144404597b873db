"""Storage fault injection: make one broker's disk fail or hang, for fault tests only.

A test cannot make a real disk return ``EIO``, and a read-only or frozen file system needs
root and a loop mount.  This module lets a test make the storage layer of *one broker
process* behave as if its disk failed, at three well-defined points:

- ``write``: a segment write (``Segment.write``), before any byte is written;
- ``fsync``: a segment fdatasync (``Segment.flush`` and the syncer's, storage/syncer.py);
- ``roll``: the creation of a new segment file (``Segment.create``).

**Arming.**  Only a broker started with the environment variable
``SLUICE_TEST_DISK_FAULTS=armed`` (exactly that value) arms the injector (``arm_from_env``,
called once at broker start, logs a warning saying so).  An armed broker reads its rules
from ``<data dir>/disk-faults.json`` whenever a point is reached, at most every
``POLL_S``: a test creates, changes and deletes that file while the broker runs.  No file,
no fault.  A broker without the variable never looks at the file, so a stray file does
nothing, and an unarmed broker pays one check of a module global per write group.

**Rules**, a JSON object: each point maps to an errno name (``"EIO"``, ``"EROFS"``,
``"ENOSPC"``...: the operation raises that ``OSError``) or to ``"hang"`` (the calling thread
blocks until the rule is removed, as on a frozen file system; then the operation goes
on).  ``"only"`` (optional) limits the rules to files whose path contains that string,
e.g. ``"events-0"`` for one partition::

    {"write": "EIO", "fsync": "EIO", "only": "events-0"}

Concurrency: ``check`` is called from any thread (worker threads, the event loop); the
rules are re-read under a lock.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("sluice.storage")

ENV = "SLUICE_TEST_DISK_FAULTS"
ARMED = "armed"
CONTROL_FILE = "disk-faults.json"
POINTS = ("write", "fsync", "roll")
POLL_S = 0.02  # how stale the rules may be; also the poll interval of a hang


class FaultInjector:
    """The rules of ``<data dir>/disk-faults.json``, re-read at most every ``POLL_S``."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / CONTROL_FILE
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._rules: dict = {}

    def rules(self) -> dict:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= POLL_S:
                self._read_at = now
                try:
                    self._rules = json.loads(self.path.read_text())
                except FileNotFoundError:
                    self._rules = {}
                except (OSError, ValueError) as exc:  # half written by the test: keep the last rules
                    log.warning("cannot read %s: %s", self.path, exc)
            return self._rules

    def check(self, point: str, path: str | os.PathLike = "") -> None:
        """Raise the ``OSError`` the rules give ``point`` on ``path``, or block while they
        say ``hang``; return at once when no rule applies."""
        while True:
            rules = self.rules()
            action = rules.get(point)
            if action is None or rules.get("only", "") not in str(path):
                return
            if action != "hang":
                code = getattr(errno, str(action), errno.EIO)
                raise OSError(code, f"{os.strerror(code)} (injected {point} fault)", str(path))
            time.sleep(POLL_S)


# The armed injector of this process, or None (production): callers test it before calling.
injector: FaultInjector | None = None


def arm_from_env(data_dir: Path) -> FaultInjector | None:
    """Arm the injector for ``data_dir`` when ``SLUICE_TEST_DISK_FAULTS=armed``; else
    leave it unarmed.  Returns the armed injector (None when not armed)."""
    global injector
    if os.environ.get(ENV) != ARMED:
        return None
    injector = FaultInjector(data_dir)
    log.warning("storage fault injection is armed (%s=%s): rules are read from %s", ENV, ARMED, injector.path)
    return injector


def check(point: str, path: str | os.PathLike = "") -> None:
    """``injector.check`` when armed; a no-op otherwise.  Hot paths test ``injector`` first."""
    if injector is not None:
        injector.check(point, path)
