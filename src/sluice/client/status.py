"""A cluster's health as one metadata response shows it: which brokers are alive, which one
is the controller, which partitions are under-replicated or offline.

Pure: ``ClusterStatus.from_metadata`` reads a ``MetadataResponse`` and does no I/O
(``Admin.cluster_status`` asks the broker).  What counts:

- a broker is **alive** when the metadata lists it (the metadata lists the live brokers
  only); a node id that some partition names as a replica but that is not listed is shown
  as not alive, without an address;
- a partition is **under-replicated** when its ISR is smaller than its replica list;
- a partition is **offline** when it has no leader (leader -1).  An offline partition is
  usually under-replicated too, and is then listed in both;
- the **metadata store** is unreachable when the answering broker says so (``store_error``):
  nothing can then be elected or changed, and what the rest shows may be stale.

Topics the metadata answers with an error are left out: they have no partitions to judge.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.protocol import messages

__all__ = ["BrokerStatus", "ClusterStatus", "PartitionStatus"]


@dataclass(frozen=True)
class BrokerStatus:
    """One broker: its node id, ``host:port`` (``""`` when not alive: no address is known)
    and whether it is alive."""

    node_id: int
    address: str
    alive: bool


@dataclass(frozen=True)
class PartitionStatus:
    """One partition's replication state: leader (-1: offline), replicas (preferred leader
    first), in-sync replicas and leader epoch."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int

    @property
    def offline(self) -> bool:
        return self.leader < 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True)
class ClusterStatus:
    """Brokers by node id, the controller's node id (-1: none known), the under-replicated
    and offline partitions by topic and partition, and why the metadata store cannot be
    reached (``""``: it can)."""

    brokers: tuple[BrokerStatus, ...]
    controller: int
    under_replicated: tuple[PartitionStatus, ...]
    offline: tuple[PartitionStatus, ...]
    store_error: str = ""

    @property
    def healthy(self) -> bool:
        """The metadata store answers, and every partition has a leader and its whole
        replica list in sync."""
        return not self.under_replicated and not self.offline and not self.store_error

    @classmethod
    def from_metadata(cls, response: messages.MetadataResponse) -> ClusterStatus:
        """The status shown by ``response`` (a metadata answer for every topic)."""
        alive = {b.node_id: f"{_host(b.host)}:{b.port}" for b in response.brokers}
        partitions = sorted(
            (
                PartitionStatus(t.name, p.partition, p.leader, tuple(p.replicas), tuple(p.isr), p.leader_epoch)
                for t in response.topics
                if not t.error
                for p in t.partitions
            ),
            key=lambda p: (p.topic, p.partition),
        )
        named = {n for p in partitions for n in (*p.replicas, *p.isr)} | {
            p.leader for p in partitions if p.leader >= 0
        }
        brokers = tuple(
            BrokerStatus(n, alive.get(n, ""), n in alive) for n in sorted(alive.keys() | named)
        )
        return cls(
            brokers=brokers,
            controller=response.controller_id,
            under_replicated=tuple(p for p in partitions if p.under_replicated),
            offline=tuple(p for p in partitions if p.offline),
            store_error=response.store_error,
        )


def _host(host: str) -> str:
    """An IPv6 address in brackets, so that ``host:port`` reads back unambiguously."""
    return f"[{host}]" if ":" in host else host
