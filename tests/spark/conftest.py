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
    from sluice.spark.pipelines import session

    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    spark = session("local[2]", "sluice-tests", conf)
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()
