"""Shared fixtures: real broker processes for integration and fault tests.

``broker`` starts ``sluice serve`` as a child process on a free loopback port with a fresh
data directory and stops it at the end of the test, even when the test fails.  Tests can
``kill()`` it (SIGKILL), ``stop()`` it (SIGTERM) and ``start()`` it again on the same data.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hypothesis  # noqa: F401 - imported (and assertion-rewritten) now, see below
import pytest

# CPython 3.11.7 can raise "SystemError: AST constructor recursion depth mismatch" when a
# garbage collector finalizer runs while pytest's assertion rewriter parses a module; the
# hypothesis plugin imports its modules lazily mid-run, so they are imported here instead.
from sluice.harness import BrokerProcess  # noqa: E402 - after the hypothesis import above


@pytest.fixture
def broker_factory(tmp_path):
    started: list[BrokerProcess] = []

    def make(data_dir: Path | None = None, extra_args: list[str] | None = None) -> BrokerProcess:
        n = len(started)
        b = BrokerProcess(
            data_dir or tmp_path / f"data{n}", tmp_path / f"broker{n}.log", extra_args
        )
        started.append(b)
        return b

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory().start()


def run_cli(
    *args: str, bootstrap: str, input: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """Run the ``sluice`` command line against ``bootstrap``."""
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "--bootstrap", bootstrap, *args],
        input=input,
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    """``cli(*args, bootstrap=..., input=...)`` runs the ``sluice`` command line."""
    return run_cli
