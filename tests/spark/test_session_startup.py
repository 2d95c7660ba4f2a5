"""The session's Python workers import the byte-compiled pyspark package, not
pyspark.zip (client/spark/spark_home.py): from the zip each Python process Spark starts
compiles pyspark again, ~1.2 s of CPU, eight times in a session's first streaming
query. Switched off (`local_session(compiled_workers=False)`, or Spark's own
SPARK_HOME), the path below ends inside python/lib/pyspark.zip."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def test_workers_import_the_installed_compiled_pyspark(spark: Any) -> None:
    import pyspark

    # A lambda: cloudpickle sends it by value (this module is not importable there).
    where = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: __import__("pyspark").__file__)
    files = where.collect()
    assert files == [pyspark.__file__] * 2, files
    assert ".zip" not in files[0]


def test_a_task_imports_only_the_read_path(spark: Any) -> None:
    """What every Python process Spark starts for a query imports of this project:
    the reader and the fetch path, not the admin, producer or blocking clients (they
    took ~0.2 s of CPU more in each of those processes)."""
    code = (
        "import sys, client.spark.datasource, client.spark.stream_reader;"
        "print(sorted(m for m in ('client.admin', 'client.sync', 'client.producer',"
        " 'client.spark.cluster_view', 'client.spark.writer') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
