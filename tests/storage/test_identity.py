"""storage/identity.py: which node a data directory belongs to."""

from __future__ import annotations

import pytest

from sluice.errors import ConfigError
from sluice.storage import identity


def test_a_directory_without_owner_or_partitions_is_new_until_claimed(tmp_path):
    assert identity.claim(tmp_path, 3) is True
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / ".trash-1").mkdir()  # deletions left over are not partitions
    assert identity.claim(tmp_path, 3) is True
    identity.record(tmp_path, 3)
    assert identity.claim(tmp_path, 3) is False


def test_a_directory_with_partitions_but_no_owner_is_not_new(tmp_path):
    (tmp_path / "logs" / "orders-0").mkdir(parents=True)
    assert identity.claim(tmp_path, 1) is False


def test_another_node_is_refused(tmp_path):
    identity.record(tmp_path, 3)
    with pytest.raises(ConfigError, match=r"belongs to node 3 .*not node 33: start it with --node-id 3"):
        identity.claim(tmp_path, 33)


@pytest.mark.parametrize("text", [b"", b"{", b"[]", b'{"node": 1}', b'{"node_id": "3"}', b'{"node_id": true}'])
def test_an_unreadable_owner_is_refused_not_overwritten(tmp_path, text):
    (tmp_path / "meta.json").write_bytes(text)
    with pytest.raises(ConfigError, match="cannot tell which node"):
        identity.claim(tmp_path, 1)
    identity.record(tmp_path, 1)
    assert (tmp_path / "meta.json").read_bytes() == text
