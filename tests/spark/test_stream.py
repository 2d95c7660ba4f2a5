"""The streaming source end to end on a real cluster and a real local SparkSession."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import create_topic, produce, run_available_now, stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def test_available_now_reads_exactly_the_produced_records_and_resumes_from_checkpoint(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    servers = bootstrap(cluster)
    create_topic(servers, "exact")
    first = values("first", 30)
    produce(servers, "exact", first)
    checkpoint = tmp_path / "checkpoint"

    run1 = run_available_now(spark, stream_options(servers, "exact"), checkpoint)
    rows1 = run1.rows()
    assert sorted(r.value for r in rows1) == sorted(first)
    assert {r.topic for r in rows1} == {"exact"}
    assert all(r.key == r.value for r in rows1)
    for p in {r.partition for r in rows1}:
        offsets = [r.offset for r in rows1 if r.partition == p]
        assert offsets == list(range(len(offsets))), f"partition {p}: {offsets}"
    assert {r.leaderEpoch for r in rows1} == {0}

    second = values("second", 20)
    produce(servers, "exact", second)
    run2 = run_available_now(spark, stream_options(servers, "exact"), checkpoint)
    rows2 = run2.rows()
    # No duplicate, no gap: the second run continues exactly where the first stopped.
    assert sorted(r.value for r in rows2) == sorted(second)
    both = rows1 + rows2
    for p in {r.partition for r in both}:
        offsets = sorted(r.offset for r in both if r.partition == p)
        assert offsets == list(range(len(offsets))), f"partition {p}: {offsets}"
    end = run2.end_offset()
    assert list(end) == ["partitions", "dataLoss"]
    assert end["dataLoss"] == 0
    counted = {int(p): pos["offset"] for p, pos in end["partitions"]["exact"].items()}
    assert sum(counted.values()) == len(first) + len(second)
