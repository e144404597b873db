"""A real Spark (``local[2]``) for the connector's tests, shared by the whole session.

Executors run this very Python (``PYSPARK_PYTHON``), where the ``sluice`` data source is
installed and found by PySpark's data source lookup.
"""

from __future__ import annotations

import os
import sys

import pytest

# Spark binds the driver and its block manager on loopback only, here and in the Spark
# processes tests start (they inherit the environment).
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sluice-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
