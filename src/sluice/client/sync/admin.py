"""``SyncAdmin``: the blocking ``Admin`` (client/admin/), one method per admin call."""

from __future__ import annotations

from sluice.client.admin import Admin
from sluice.client.sync.base import SyncBase

__all__ = ["SyncAdmin"]


class SyncAdmin(SyncBase):
    """Blocking ``Admin``."""

    _client_cls = Admin
    _thread_name = "sluice-admin"

    def create_topic(self, name: str, partitions: int = 1, config=None, replication_factor: int = 0) -> None:
        self._call(Admin.create_topic, name, partitions, config, replication_factor)

    def delete_topic(self, name: str) -> None:
        self._call(Admin.delete_topic, name)

    def list_topics(self, include_internal: bool = False):
        return self._call(Admin.list_topics, include_internal)

    def describe_topic(self, name: str):
        return self._call(Admin.describe_topic, name)

    def list_offsets(self, topic: str, partitions=None, timestamp: int = -1) -> dict[int, int]:
        return self._call(Admin.list_offsets, topic, partitions, timestamp)

    def alter_topic_config(self, name: str, config=None, *, delete=(), validate_only: bool = False) -> None:
        self._call(Admin.alter_topic_config, name, config, delete=delete, validate_only=validate_only)

    def add_partitions(self, name: str, *, total=None, count=None, validate_only: bool = False) -> int:
        return self._call(Admin.add_partitions, name, total=total, count=count, validate_only=validate_only)

    def cluster_status(self):
        return self._call(Admin.cluster_status)

    def list_transactions(self, topics=None, delayed: bool = False) -> list:
        return self._call(Admin.list_transactions, topics, delayed)

    def end_transaction(self, txn_id: str, commit: bool):
        return self._call(Admin.end_transaction, txn_id, commit)

    def elect_leaders(self, topics=None) -> list:
        return self._call(Admin.elect_leaders, topics)

    def rebalance(self, topics=None, *, reassign: bool = True):
        return self._call(Admin.rebalance, topics, reassign=reassign)

    def list_groups(self) -> list:
        return self._call(Admin.list_groups)

    def describe_group(self, group: str):
        return self._call(Admin.describe_group, group)

    def delete_group(self, group: str) -> None:
        self._call(Admin.delete_group, group)

    def reset_group_offsets(self, group: str, topic: str, **kw) -> list:
        """See ``Admin.reset_group_offsets`` (keyword arguments ``to``, ``shift_by``,
        ``partitions``, ``dry_run``)."""
        return self._call(Admin.reset_group_offsets, group, topic, **kw)

    def create_subscription(self, topic: str, name: str, config=None, **kw) -> None:
        self._call(Admin.create_subscription, topic, name, config, **kw)

    def delete_subscription(self, topic: str, name: str) -> None:
        self._call(Admin.delete_subscription, topic, name)

    def seek_subscription(self, topic: str, name: str, to) -> dict[int, int]:
        return self._call(Admin.seek_subscription, topic, name, to)

    def describe_subscription(self, topic: str, name: str | None = None) -> list:
        return self._call(Admin.describe_subscription, topic, name)

    def list_subscriptions(self, topic: str | None = None) -> dict:
        return self._call(Admin.list_subscriptions, topic)

