"""Fixtures of the fault tests: ``three_brokers`` (replicated.py), stopped after the test
even when it fails; the options of the nemesis test (test_nemesis.py), registered when the
fault tests are named on the command line (``pytest tests/faults/test_nemesis.py ...``)."""

from __future__ import annotations

import pytest
from replicated import ThreeBrokers


def pytest_addoption(parser):
    group = parser.getgroup("nemesis", "the seeded nemesis test (tests/faults/test_nemesis.py)")
    group.addoption("--nemesis-seconds", type=float, default=None,
                    help="how long the nemesis injects faults (default: the short CI run)")
    group.addoption("--nemesis-seed", type=int, default=None,
                    help="the seed of the fault schedule (default: the CI seed, or a random one "
                         "with --nemesis-seconds; printed either way)")
    group.addoption("--nemesis-faults", default=None,
                    help="comma-separated fault names to pick from (default: all of test_nemesis.FAULTS)")


def pytest_collection_modifyitems(config, items):
    """A nemesis run longer than the CI one gets time for it beyond the suite's timeout
    (pyproject.toml: 300 s): its seconds plus room to start, heal and check."""
    seconds = config.getoption("--nemesis-seconds", default=None)
    if seconds is None:
        return
    for item in items:
        if item.name == "test_nemesis":
            item.add_marker(pytest.mark.timeout(seconds + 300))


@pytest.fixture
async def three_brokers(tmp_path):
    cluster = ThreeBrokers(tmp_path)
    try:
        yield cluster
    finally:
        await cluster.close()
