"""`local_session()`: a local SparkSession ready for the minibroker data source, for
tests, benchmarks and notebooks.

Spark's Python workers run PYSPARK_PYTHON (default: `python3` on PATH, which may lack
pyarrow and this package); it must be set before the JVM starts
(`spark.pyspark.python` in the builder is not enough), so this sets it to the running
interpreter, then registers MinibrokerDataSource. With a pip-installed PySpark and no
SPARK_HOME of the user's, it also starts Spark from `compiled_spark_home()`, so that
Spark's Python processes import the byte-compiled pyspark package rather than compile
it from `pyspark.zip` each time one starts (client/spark/spark_home.py; ~1.2 s of CPU
per process, eight processes in the first streaming query of a session).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from client.spark.spark_home import compiled_spark_home


def local_session(
    app_name: str = "minibroker",
    *,
    master: str = "local[2]",
    compiled_workers: bool = True,
    **conf: str,
) -> Any:
    """getOrCreate() a local session (UI off, UTC, 2 shuffle partitions; `conf`
    overrides) with the "minibroker" format registered. `compiled_workers=False`
    leaves SPARK_HOME alone (Spark's workers import pyspark from its zip)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if compiled_workers:
        home = compiled_spark_home()
        if home is not None:
            # Read by the JVM's launch scripts and by Spark when it builds its Python
            # workers' PYTHONPATH; set before getOrCreate() starts the JVM.
            os.environ["SPARK_HOME"] = str(home)
    from pyspark.sql import SparkSession

    from client.spark.datasource import MinibrokerDataSource

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "1g",
        **conf,
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MinibrokerDataSource)
    return session
