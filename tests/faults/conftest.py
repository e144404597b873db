"""Fixtures of the fault tests: ``three_brokers`` (replicated.py), stopped after the test
even when it fails."""

from __future__ import annotations

import pytest
from replicated import ThreeBrokers


@pytest.fixture
async def three_brokers(tmp_path):
    cluster = ThreeBrokers(tmp_path)
    try:
        yield cluster
    finally:
        await cluster.close()
