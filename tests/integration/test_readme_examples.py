"""The README's Python examples run as written, in order, against a real cluster.

The only change made to them is the bootstrap address: the README says
`127.0.0.1:9092` (what `minibroker dev` listens on); the test cluster uses free ports.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.integration.cluster import REPO
from tests.integration.cluster import Cluster

README_ADDRESS = "127.0.0.1:9092"
README_KAFKA_ADDRESS = "127.0.0.1:19092"  # `minibroker dev`'s Kafka listeners


def readme_python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def is_spark_example(block: str) -> bool:
    """Spark examples need Java: tests/spark/test_readme_spark_example.py runs them."""
    return "client.spark" in block


def run_readme_block(
    block: str, bootstrap: str, timeout_s: float, kafka_bootstrap: str = ""
) -> str:
    """Run one README example in a fresh interpreter with the README's addresses
    replaced; its stdout."""
    code = block.replace(README_ADDRESS, bootstrap)
    if kafka_bootstrap:
        code = code.replace(README_KAFKA_ADDRESS, kafka_bootstrap)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, f"example failed:\n{block}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    """conftest's cluster with a controller and brokers 1, 2, 3, with Kafka listeners."""
    cluster.start_controller()
    cluster.start_brokers((1, 2, 3), kafka=True)
    return cluster


def test_readme_has_examples() -> None:
    blocks = readme_python_blocks()
    assert len(blocks) >= 2
    # Each runs against `minibroker dev`: its native or its Kafka listeners.
    assert all(README_ADDRESS in block or README_KAFKA_ADDRESS in block for block in blocks)


def test_readme_examples_run_as_written(cluster: Cluster) -> None:
    host, port = cluster.brokers[1].address
    outputs = [
        run_readme_block(
            block, f"{host}:{port}", timeout_s=120, kafka_bootstrap=cluster.kafka_bootstrap()
        )
        for block in readme_python_blocks()
        if not is_spark_example(block)
    ]
    first, second, group, kafka, librdkafka = (out.splitlines() for out in outputs[:5])
    assert first[0] == "0 0"  # offset 0 at leader epoch 0
    assert first[1] == "0 0 b'k' b'hello'"
    assert "OffsetAndMetadata(offset=1" in first[2] and "leader_epoch=0" in first[2]
    assert second == ["11 records"]
    # A group of one: all of the partition, then revoked on leaving.
    assert group == ["assigned [0]", "11 records", "revoked [0]"]
    # kafka-python through the Kafka listener: offset 0, then the record at epoch 0.
    assert kafka == ["0", "0 0 b'k' b'hi'"]
    assert librdkafka == ["0 0 b'k' b'hi'"]
