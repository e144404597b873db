"""A cluster's health as one metadata response shows it: which brokers are alive, which one
is the controller, which partitions are under-replicated or offline.

Pure: ``ClusterStatus.from_metadata`` reads a ``MetadataResponse`` and does no I/O
(``Admin.cluster_status`` asks the broker).  What counts:

- a broker is **alive** when the metadata lists it (the metadata lists the live brokers
  only); a node id that some partition names as a replica but that is not listed is shown
  as not alive, without an address;
- a partition is **under-replicated** when its ISR is smaller than its replica list, or
  its replica list is shorter than its topic's replication factor (``full_factor``: an
  internal topic created while brokers were down, until they return), counting only as
  many replicas as the cluster has brokers (alive or named);
- a partition is **offline** when it has no leader (leader -1).  An offline partition is
  usually under-replicated too, and is then listed in both;
- the **metadata store** is unreachable when the answering broker says so (``store_error``):
  nothing can then be elected or changed, and what the rest shows may be stale.

Topics the metadata answers with an error are left out: they have no partitions to judge.

A broker is listed as alive as long as its registration lasts (the session timeout), also
after it died or while it is paused: ``with_probes`` adds what asking each live broker
directly showed (``Admin.cluster_status`` connects to each with a short timeout), and a
live broker that does not answer (``no_answer``) makes the cluster not healthy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sluice.protocol import messages

__all__ = ["BrokerStatus", "ClusterStatus", "PartitionStatus"]


@dataclass(frozen=True)
class BrokerStatus:
    """One broker: its node id, ``host:port`` (``""`` when not alive: no address is known),
    whether it is alive (registered), and why it did not answer when asked directly
    (``no_answer``; ``""``: it answered, or was not asked)."""

    node_id: int
    address: str
    alive: bool
    no_answer: str = ""


@dataclass(frozen=True)
class PartitionStatus:
    """One partition's replication state: leader (-1: offline), replicas (preferred leader
    first), in-sync replicas, leader epoch, and how many replicas it is meant to have
    (``full_factor``: its topic's replication factor, at most the brokers the cluster has;
    0: as many as it has)."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    full_factor: int = 0

    @property
    def offline(self) -> bool:
        return self.leader < 0

    @property
    def missing(self) -> int:
        """Replicas short of ``full_factor`` (not merely out of sync: not assigned)."""
        return max(0, self.full_factor - len(self.replicas))

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas) or self.missing > 0


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
    def silent(self) -> tuple[BrokerStatus, ...]:
        """The brokers listed as alive that did not answer when asked directly."""
        return tuple(b for b in self.brokers if b.alive and b.no_answer)

    @property
    def healthy(self) -> bool:
        """The metadata store answers, every broker listed as alive answered, and every
        partition has a leader and its whole replica list (as long as its topic's
        replication factor) in sync."""
        return not self.under_replicated and not self.offline and not self.store_error and not self.silent

    def with_probes(self, no_answer: Mapping[int, str]) -> ClusterStatus:
        """This status with why each broker of ``no_answer`` (node id -> reason) did not
        answer when asked directly."""
        brokers = tuple(replace(b, no_answer=no_answer.get(b.node_id, "")) for b in self.brokers)
        return replace(self, brokers=brokers)

    @classmethod
    def from_metadata(cls, response: messages.MetadataResponse) -> ClusterStatus:
        """The status shown by ``response`` (a metadata answer for every topic)."""
        alive = {b.node_id: f"{_host(b.host)}:{b.port}" for b in response.brokers}
        answered = [t for t in response.topics if not t.error]
        named = {n for t in answered for p in t.partitions for n in (*p.replicas, *p.isr)} | {
            p.leader for t in answered for p in t.partitions if p.leader >= 0
        }
        known = alive.keys() | named
        partitions = sorted(
            (
                PartitionStatus(
                    t.name, p.partition, p.leader, tuple(p.replicas), tuple(p.isr), p.leader_epoch,
                    min(t.replication_factor, len(known)),
                )
                for t in answered
                for p in t.partitions
            ),
            key=lambda p: (p.topic, p.partition),
        )
        brokers = tuple(BrokerStatus(n, alive.get(n, ""), n in alive) for n in sorted(known))
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
