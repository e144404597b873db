"""The etcd process of the tests lives in ``sluice.harness``; this name stays for tests that
import ``from etcd import ...``.  New code imports ``sluice.harness``."""

from sluice.harness import EtcdProcess, etcd_binary  # noqa: F401
