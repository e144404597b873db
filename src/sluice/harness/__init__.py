"""The process harness of the tests and of ``sluice bench``: real brokers and etcd as child
processes, the free ports they listen on, and polling for a condition.

    ports.py      free_port, free_ports: loopback ports no other child of ours was given
    processes.py  spawn into a log file, stop / kill a process group, freeze (SIGSTOP)
    broker.py     BrokerProcess: ``sluice serve`` on its own port, data and log
    etcd.py       EtcdProcess: a one-member etcd for the cluster metadata
    poll.py       eventually / wait_until: poll until a condition holds or time is up

Readiness is checked, never slept for: a broker is up once it says it listens on its port
and answers there, etcd once it reports healthy.  Every child runs in its own process group
and is stopped by whoever started it, also when a test fails.  Nothing here is imported by
the broker or the clients.
"""

from sluice.harness.broker import BrokerProcess
from sluice.harness.etcd import EtcdProcess, etcd_binary
from sluice.harness.poll import NotReached, eventually, wait_until
from sluice.harness.ports import free_port, free_ports
from sluice.harness.processes import freeze

__all__ = [
    "BrokerProcess",
    "EtcdProcess",
    "NotReached",
    "etcd_binary",
    "eventually",
    "free_port",
    "free_ports",
    "freeze",
    "wait_until",
]
