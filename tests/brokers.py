"""The broker processes of the tests live in ``sluice.harness``; this name stays for tests
that import ``from brokers import ...``.  New code imports ``sluice.harness``."""

from sluice.harness import BrokerProcess, free_port, free_ports, freeze  # noqa: F401
