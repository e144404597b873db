"""Importing ``sluice.spark`` points Spark's Python workers at this Python (no Spark needed)."""

from __future__ import annotations

import importlib
import os
import sys
import types

import pytest


@pytest.fixture
def fresh_sluice_spark(monkeypatch):
    """Import ``sluice.spark`` anew, with a stand-in for the module that needs PySpark."""
    source = types.ModuleType("sluice.spark.source")
    source.SluiceDataSource = object
    monkeypatch.setitem(sys.modules, "sluice.spark.source", source)
    monkeypatch.delitem(sys.modules, "sluice.spark", raising=False)
    saved = os.environ.get("PYSPARK_PYTHON")
    try:
        yield lambda: importlib.import_module("sluice.spark")
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved


@pytest.mark.parametrize("unset", [None, ""])
def test_unset_pyspark_python_becomes_this_python(fresh_sluice_spark, unset):
    if unset is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = unset
    fresh_sluice_spark()
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_a_chosen_pyspark_python_is_kept(fresh_sluice_spark):
    os.environ["PYSPARK_PYTHON"] = "/opt/other/python"
    fresh_sluice_spark()
    assert os.environ["PYSPARK_PYTHON"] == "/opt/other/python"
