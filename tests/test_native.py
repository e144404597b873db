"""sluice.native: ``SLUICE_PURE_PYTHON=1`` turns off every compiled extension, in each
module that would use one; an extension built from another source is not used."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sluice import native

# what each user of an extension chose, printed by a fresh interpreter
PROBE = """
from sluice.client import accumulator, producer, sync
from sluice.protocol import records
from sluice.storage import syncer
print(records.COMPILED, syncer._csyncer is not None, accumulator.RecordBuffer.__module__,
      sync.producer._Outbox.__module__, producer._send_future.__class__.__name__)
"""


def _chosen(pure: str) -> list[str]:
    env = {**os.environ, native.PURE_PYTHON_ENV: pure}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_pure_python_turns_off_every_extension():
    assert _chosen("1") == ["False", "False", "sluice.client.accumulator", "sluice.client.outbox", "methodcaller"]


def test_without_it_every_built_extension_runs():
    for name in ("_crecords", "_csyncer"):
        try:
            __import__(f"sluice.{name}")
        except ImportError:
            pytest.skip(f"sluice.{name} is not built")
    assert _chosen("0") == ["True", "True", "sluice._crecords", "sluice._crecords", "type"]


@pytest.mark.parametrize(("value", "pure"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_the_environment_decides(monkeypatch, value, pure):
    monkeypatch.setenv(native.PURE_PYTHON_ENV, value)
    assert native.pure_python() is pure
    if pure:
        assert native.load("_csyncer") is None


def test_an_extension_built_from_another_source_is_not_used(monkeypatch):
    monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)
    pytest.importorskip("sluice._crecords")
    with pytest.warns(RuntimeWarning, match="another version of its source"):
        assert native.load("_crecords", abi_version=-1) is None


def test_an_extension_that_is_not_built_is_none(monkeypatch):
    monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)
    assert native.load("_cnothing") is None
