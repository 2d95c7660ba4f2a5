"""The README's Spark example runs as written against a real cluster.

It starts its own SparkSession in a fresh interpreter (as a user's script would); the
`spark` fixture is requested only for its rule on a missing Java: a loud skip, or a
failure in CI.
"""

from __future__ import annotations

import json
from typing import Any

from tests.integration.test_readme_examples import is_spark_example
from tests.integration.test_readme_examples import readme_python_blocks
from tests.integration.test_readme_examples import run_readme_block
from tests.scenarios.scenario_cluster import ScenarioCluster


def test_readme_spark_example_runs_as_written(spark: Any, cluster: ScenarioCluster) -> None:
    blocks = [block for block in readme_python_blocks() if is_spark_example(block)]
    assert len(blocks) == 1, "the README has one Spark example"
    host, port = cluster.brokers[1].address
    lines = run_readme_block(blocks[0], f"{host}:{port}", timeout_s=240).splitlines()
    assert lines[0] == "100 rows"
    end_offset: dict[str, Any] = json.loads(lines[1])
    partitions = end_offset["partitions"]["clicks"]
    assert sorted(partitions) == ["0", "1"]
    assert sum(p["offset"] for p in partitions.values()) == 100
    assert all(p["epoch"] == 0 for p in partitions.values())
    assert end_offset["dataLoss"] == 0
