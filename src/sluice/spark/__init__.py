"""Sluice for Apache Spark: the ``sluice`` data source and the pipelines built on it.

Needs the ``spark`` extra (from a clone of the repository: ``pip install '.[spark]'``).
Installing it registers the data source with every Spark session of that Python (the
``pyspark_sluice`` module), so ``spark.read.format("sluice")`` just works; ``register(spark)``
does it explicitly.

Spark runs its Python workers (and its data source lookup) with ``PYSPARK_PYTHON``, else
``python3`` from ``PATH``, which may lack Sluice: ``format("sluice")`` then fails with
``DATA_SOURCE_NOT_FOUND``.  So importing this package sets ``PYSPARK_PYTHON`` to this Python
when it is unset; a session created after the import uses it.
"""

from __future__ import annotations

import os
import sys


def _default_worker_python() -> None:
    """Point Spark's Python workers at this interpreter unless ``PYSPARK_PYTHON`` says
    otherwise (an empty value counts as unset)."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable


_default_worker_python()

from sluice.spark.source import SluiceDataSource  # noqa: E402 - after the environment is set

__all__ = ["SluiceDataSource", "register"]


def register(spark) -> None:
    """Register the ``sluice`` data source with ``spark`` (a ``SparkSession``)."""
    spark.dataSource.register(SluiceDataSource)
