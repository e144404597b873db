"""Free loopback ports for the processes a test or a benchmark starts.

A port is found free and released at once, so another process could take it before ours
does: readiness checks (``broker.py``, ``etcd.py``) therefore wait for the process to say it
listens, not only for an answer on the port.

The ports are picked below the kernel's ephemeral range (``ip_local_port_range``), never in
it: the kernel hands ephemeral ports to every outgoing connection as its local port, so a
port from that range — what binding to port 0 gives — can be taken by any client socket
while a broker it was picked for is starting, or is down between a kill and its restart on
the same port (``Address already in use``).  Ports outside the range are taken only by an
explicit bind.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_handed_out: set[int] = set()
_LOWEST = 10_000  # below: ports well-known services are configured with
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int] | None:
    """The kernel's ephemeral port range, inclusive, or ``None`` where it cannot be read."""
    try:
        low, high = map(int, _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def _candidates() -> list[int]:
    """Ports to try, in random order: below the ephemeral range (else any unprivileged)."""
    span = ephemeral_range()
    if span is None or span[0] - _LOWEST < 1000:
        return []
    ports = list(range(_LOWEST, span[0]))
    random.shuffle(ports)
    return ports


def _bind(port: int) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def free_port() -> int:
    """One free loopback port (see ``free_ports``)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all bound at once, then released), outside the
    kernel's ephemeral range where it is known, and none of them handed out before in this
    process: a port picked for a broker that has not started yet is free again as far as the
    kernel knows, and must not go to a second broker."""
    socks: list[socket.socket] = []
    try:
        for port in _candidates():
            if len(socks) == n:
                break
            if port not in _handed_out and (s := _bind(port)) is not None:
                socks.append(s)
        while len(socks) < n:  # no range known, or all of it taken: let the kernel choose
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] in _handed_out:
                s.close()
                continue
            socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
        _handed_out.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()
