"""``sluice group`` rendering: a summed lag says how many partitions it leaves out."""

from __future__ import annotations

from sluice.cli import group


def test_a_total_lag_names_the_partitions_whose_lag_is_unknown():
    assert group._total_lag(40, 0) == "40"
    assert group._total_lag(40, 2) == "40 + 2 unknown"
