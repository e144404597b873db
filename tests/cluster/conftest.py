"""Real etcd processes for the cluster tests, and the stores under test.

``etcd_factory`` starts Debian's ``etcd`` (``sluice.harness.EtcdProcess``) on free loopback client
and peer ports with a fresh data directory, waits until it reports healthy, and kills it at
the end of the test even when the test fails.  ``etcd`` is one such process shared by a test
module; tests sharing it use their own cluster name (key prefix), so they never see each
other's keys.

etcd runs with a 500 ms election timeout, so it grants leases as short as 1 s: sessions in
these tests time out after 1 s.
"""

from __future__ import annotations

import uuid

import pytest
from cluster_helpers import REQUEST_MS, SESSION_MS

from sluice.cluster.embedded import EmbeddedStore
from sluice.cluster.etcd import EtcdStore
from sluice.harness import EtcdProcess


@pytest.fixture
def etcd_factory(tmp_path):
    started: list[EtcdProcess] = []

    def make() -> EtcdProcess:
        n = len(started)
        e = EtcdProcess(tmp_path / f"etcd{n}", tmp_path / f"etcd{n}.log")
        started.append(e)
        return e.start()

    yield make
    for e in started:
        e.kill()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    d = tmp_path_factory.mktemp("etcd")
    e = EtcdProcess(d / "data", d / "etcd.log")
    try:
        yield e.start()
    finally:
        e.kill()


@pytest.fixture
def cluster_name() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["embedded", "etcd"])
async def store_factory(request, tmp_path, cluster_name):
    """``make()`` opens a started store of the parametrized kind on the same metadata each
    time: the same data directory (a restart) or the same etcd cluster (another broker)."""
    opened = []
    url = request.getfixturevalue("etcd").url(cluster_name) if request.param == "etcd" else None

    async def make():
        if url is None:
            store = EmbeddedStore(tmp_path / "data", node_id=0)
        else:
            store = EtcdStore(url, session_timeout_ms=SESSION_MS, request_timeout_ms=REQUEST_MS)
        await store.start()
        opened.append(store)
        return store

    make.kind = request.param
    yield make
    for store in opened:
        await store.close()

