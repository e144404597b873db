"""Sluice for Apache Spark: the ``sluice`` data source and the pipelines built on it.

Needs the ``spark`` extra (``pip install 'sluice[spark]'``).  Installing it registers the
data source with every Spark session of that Python (the ``pyspark_sluice`` module), so
``spark.read.format("sluice")`` just works; ``register(spark)`` does it explicitly.
"""

from __future__ import annotations

from sluice.spark.source import SluiceDataSource

__all__ = ["SluiceDataSource", "register"]


def register(spark) -> None:
    """Register the ``sluice`` data source with ``spark`` (a ``SparkSession``)."""
    spark.dataSource.register(SluiceDataSource)
