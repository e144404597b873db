"""``pipelines.session``: a Spark it starts leaves no files behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SPARK_FILES = ("spark-*", "blockmgr-*", "artifacts-*", "liblz4-java-*", "snappy-*")

# Spark's JVM deletes its files in a shutdown hook, which does not run when it is killed
# (a container stopped, a process group ended just after Python): here it is killed
# with SIGKILL, the Python process exits normally.
SCRIPT = """
import sys
from sluice.spark.pipelines import session
spark = session("local[2]", "sluice-scratch-test", {"spark.ui.enabled": "false"})
print(spark.range(1000).repartition(3).count(), flush=True)
jvm = spark.sparkContext._gateway.proc
if sys.argv[1] == "stop":
    spark.stop()
jvm.kill()
jvm.wait()
"""


def _spark_files(directory: Path) -> set[Path]:
    return {p for pattern in SPARK_FILES for p in directory.glob(pattern)}


def test_a_session_leaves_no_spark_files_in_tmp(tmp_path):
    java_tmp = Path("/tmp")  # where Spark's JVM puts them by default, whatever TMPDIR says
    for ending in ("stop", "exit"):  # spark.stop() then exit, or just exit
        scratch = tmp_path / ending
        scratch.mkdir()
        before = _spark_files(java_tmp)
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, ending], capture_output=True, text=True, timeout=180,
            env={**os.environ, "TMPDIR": str(scratch), "PYSPARK_PYTHON": sys.executable},
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.split() == ["1000"]
        assert list(scratch.iterdir()) == []  # the session's scratch directory is gone
        assert _spark_files(java_tmp) <= before
