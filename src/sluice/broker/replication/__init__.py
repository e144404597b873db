"""Replication: partition states, leader side, follower side, replica moves (service.py)."""

from sluice.broker.replication.service import ReplicationService

__all__ = ["ReplicationService"]
