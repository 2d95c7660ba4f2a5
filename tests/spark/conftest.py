"""Fixtures for the Spark data source tests.

- `spark`: ONE local[2] SparkSession for the whole run (starting one takes ~5 s, the
  first query ~6-10 s). PYSPARK_PYTHON is set to this interpreter before the JVM
  starts: the Python workers must import `client.spark` (the installed package) and
  have pyarrow. When Java or pyspark/pyarrow is missing the tests skip, loudly: the
  reason is in every skip and in a banner at the end of the run. Never in CI (the CI
  environment variable set): there they fail instead.
- `cluster`: a real cluster (controller + brokers 1, 2, 3 as processes) shared by the
  tests that do not hurt it; tests that kill brokers build their own ScenarioCluster.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster

_SKIPPED: list[str] = []


def spark_unavailable() -> str | None:
    """Why Spark cannot run here, or None."""
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (java_home and str(Path(java_home) / "bin" / "java"))
    if not java or not Path(java).exists():
        return "Java is not installed (no `java` on PATH and no JAVA_HOME): install a JDK 17+"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{java} -version` failed: {exc}"
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install -e '.[dev,spark]'"
    return None


def require_spark() -> None:
    """Skip loudly where Java or PySpark is missing; fail in CI."""
    reason = spark_unavailable()
    if reason is not None and os.environ.get("CI"):
        pytest.fail(f"Spark tests cannot run in CI: {reason}")
    if reason is not None:
        _SKIPPED.append(reason)
        pytest.skip(f"SPARK TESTS SKIPPED: {reason}")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    require_spark()
    from client.spark.session import local_session  # sets PYSPARK_PYTHON first

    session = local_session(
        "minibroker-spark-tests",
        **{"spark.default.parallelism": "2", "spark.sql.streaming.minBatchesToRetain": "5"},
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioCluster]:
    with scenario_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        c.start_controller()
        c.start_brokers((1, 2, 3))
        yield c


def bootstrap(c: ScenarioCluster, nodes: tuple[int, ...] = (1, 2, 3)) -> str:
    return ",".join(f"{h}:{p}" for h, p in (c.brokers[n].address for n in nodes))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SKIPPED:
        terminalreporter.write_sep("!", "SPARK TESTS SKIPPED", red=True, bold=True)
        terminalreporter.write_line(f"reason: {_SKIPPED[0]}", red=True, bold=True)
