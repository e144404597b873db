"""storage/identity.py: which node and cluster a data directory belongs to."""

from __future__ import annotations

import json

import pytest

from sluice.errors import ConfigError
from sluice.storage import identity


def test_a_directory_without_owner_or_partitions_is_new_until_claimed(tmp_path):
    assert identity.claim(tmp_path, 3) == identity.Claim(True, None)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / ".trash-1").mkdir()  # deletions left over are not partitions
    assert identity.claim(tmp_path, 3).new
    identity.record(tmp_path, 3, "c1")
    assert identity.claim(tmp_path, 3) == identity.Claim(False, "c1")


def test_a_directory_with_partitions_but_no_owner_is_not_new(tmp_path):
    (tmp_path / "logs" / "orders-0").mkdir(parents=True)
    assert identity.claim(tmp_path, 1) == identity.Claim(False, None)


def test_a_directory_recorded_before_cluster_ids_takes_one(tmp_path):
    (tmp_path / "meta.json").write_text('{"node_id": 2}')
    assert identity.claim(tmp_path, 2) == identity.Claim(False, None)
    identity.record(tmp_path, 2, "c7")
    assert json.loads((tmp_path / "meta.json").read_text()) == {"node_id": 2, "cluster_id": "c7"}


def test_another_node_is_refused(tmp_path):
    identity.record(tmp_path, 3, "c1")
    with pytest.raises(ConfigError, match=r"belongs to node 3 .*not node 33: start it with --node-id 3"):
        identity.claim(tmp_path, 33)


@pytest.mark.parametrize("text", [
    b"", b"{", b"[]", b'{"node": 1}', b'{"node_id": "3"}', b'{"node_id": true}', b'{"node_id": 1, "cluster_id": 5}',
])
def test_an_unreadable_owner_is_refused(tmp_path, text):
    (tmp_path / "meta.json").write_bytes(text)
    with pytest.raises(ConfigError, match="cannot tell which node"):
        identity.claim(tmp_path, 1)
