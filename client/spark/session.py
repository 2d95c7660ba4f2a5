"""`local_session()`: a local SparkSession ready for the minibroker data source, for
tests, benchmarks and notebooks.

Spark's Python workers run PYSPARK_PYTHON (default: `python3` on PATH, which may lack
pyarrow and this package); it must be set before the JVM starts
(`spark.pyspark.python` in the builder is not enough), so this sets it to the running
interpreter, then registers MinibrokerDataSource. With a pip-installed PySpark and no
SPARK_HOME of the user's, it also starts Spark from `compiled_spark_home()`, so that
Spark's Python processes import the byte-compiled pyspark package rather than compile
it from `pyspark.zip` each time one starts (client/spark/spark_home.py; ~1.2 s of CPU
per process, eight processes in the first streaming query of a session). And it starts
the JVM with a class-data archive an earlier session's JVM wrote, or has this one
write it as it exits (client/spark/class_archive.py; session start ~10 -> ~5 s).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from client.spark.class_archive import ClassArchive
from client.spark.class_archive import archive_key
from client.spark.class_archive import class_path_blockers
from client.spark.class_archive import java_binary
from client.spark.spark_home import cache_dir
from client.spark.spark_home import compiled_spark_home
from client.spark.spark_home import pip_spark_home

log = logging.getLogger(__name__)

_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def local_session(
    app_name: str = "minibroker",
    *,
    master: str = "local[2]",
    compiled_workers: bool = True,
    class_archive: bool = True,
    **conf: str,
) -> Any:
    """getOrCreate() a local session (UI off, UTC, 2 shuffle partitions; `conf`
    overrides) with the "minibroker" format registered. `compiled_workers=False`
    leaves SPARK_HOME alone (Spark's workers import pyspark from its zip);
    `class_archive=False` starts the JVM without a class-data archive."""
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
    archive = _class_archive(settings) if class_archive else None
    user_options = settings.get(_JAVA_OPTIONS, "")
    archive_options = archive.java_options() if archive is not None else ""
    if archive_options:
        settings[_JAVA_OPTIONS] = f"{user_options} {archive_options}".strip()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        if archive is None or not archive_options:
            raise
        # The JVM would not start with the archive's options: start it without them,
        # and never offer a mapped archive again.
        log.warning("Spark's JVM failed with %r (%s): starting without", archive_options, exc)
        if archive.writing is None:
            archive.discard()
        archive.writing = None
        session = builder.config(_JAVA_OPTIONS, user_options).getOrCreate()
    if archive is not None and archive.writing is not None:
        jvm = session.sparkContext._jvm
        archive.started(
            int(jvm.java.lang.ProcessHandle.current().pid()),
            str(jvm.System.getProperty("java.class.path")),
        )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MinibrokerDataSource)
    return session


def _class_archive(settings: dict[str, str]) -> ClassArchive | None:
    """The class-data archive for the JVM this session will start
    (client/spark/class_archive.py), or None: this process already started its JVM
    (getOrCreate() reuses it), the user chose an archive, or there is no java."""
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        return None
    if "SharedArchiveFile" in settings.get(_JAVA_OPTIONS, ""):
        return None
    java = java_binary()
    spark_home = Path(os.environ["SPARK_HOME"]) if "SPARK_HOME" in os.environ else pip_spark_home()
    if java is None or spark_home is None:
        return None
    extra = settings.get("spark.driver.extraClassPath", "")
    blockers = class_path_blockers(spark_home, extra)
    if blockers:
        log.info("no class archive for Spark's JVM: %s", "; ".join(blockers))
        return None
    key = archive_key(java, spark_home, extra)
    return ClassArchive(cache_dir() / "spark-class-archive", key, java)
