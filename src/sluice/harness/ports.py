"""Free loopback ports for the processes a test or a benchmark starts.

A port is asked of the kernel (bind to port 0) and released at once, so another process can
take it before ours does: readiness checks (``broker.py``, ``etcd.py``) therefore wait for
the process to say it listens, not only for an answer on the port.
"""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """One free loopback port (see ``free_ports``)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all bound at once, then released), none of them
    handed out before in this process: a port picked for a broker that has not started yet
    is free again as far as the kernel knows, and must not go to a second broker."""
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] in _handed_out:
                socks.pop()
                s.close()
        ports = [s.getsockname()[1] for s in socks]
        _handed_out.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()
