"""Makes ``format("sluice")`` known to every Spark session of this Python.

PySpark looks up the top-level modules named ``pyspark_*`` and registers their
``DefaultSource`` (a Python data source) under its ``name()``.
"""

from sluice.spark.source import SluiceDataSource as DefaultSource

__all__ = ["DefaultSource"]
