"""Helpers for the cluster tests: polling with deadlines (``eventually``: sluice.harness), and
a process holding a session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sluice.errors import MetadataUnavailable
from sluice.harness import eventually, free_ports  # noqa: F401 - re-exported for the cluster tests

HOLDER = Path(__file__).with_name("hold_session.py")
SESSION_MS = 1000  # etcd runs with a 500 ms election timeout: it grants 1 s leases
REQUEST_MS = 1000


def answered(call, predicate=lambda result: True):
    """A check for ``eventually``: ``[result]`` once ``await call()`` answers (not
    ``MetadataUnavailable``) with a result for which ``predicate`` holds."""

    async def check():
        try:
            result = await call()
        except MetadataUnavailable:
            return None
        return [result] if predicate(result) else None

    return check


def hold_session(url: str, node_id: int, port: int, *, campaign: bool = False) -> subprocess.Popen:
    """A child process that registers ``node_id`` (and campaigns for controller) through its
    own store, says ``ready`` and holds on until killed."""
    args = [sys.executable, str(HOLDER), url, str(node_id), str(port)] + (["--campaign"] if campaign else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()  # the child exits (EOF) if it cannot get there
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"session holder failed: {line}{proc.stdout.read()}")
    return proc
