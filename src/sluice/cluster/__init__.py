"""Cluster metadata: the store interface (store.py), its embedded (embedded.py) and etcd
(etcd.py, composed of etcd_client.py, etcd_session.py and etcd_election.py)
implementations, and the choice between them."""

from __future__ import annotations

from sluice.cluster.embedded import EmbeddedStore
from sluice.cluster.store import MetadataStore
from sluice.config import ServerConfig


def open_store(config: ServerConfig) -> MetadataStore:
    """The store a broker with ``config`` uses: etcd with ``cluster``, else its data
    directory.  Not started yet."""
    if config.cluster is None:
        return EmbeddedStore(config.data_dir, config.node_id)
    from sluice.cluster.etcd import EtcdStore  # gRPC loads only where a cluster is configured

    return EtcdStore(config.cluster, session_timeout_ms=config.session_timeout_ms)
