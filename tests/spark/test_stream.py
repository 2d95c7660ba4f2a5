"""The streaming source end to end on a real cluster and a real local SparkSession."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import QueryRun
from tests.spark.streams import create_topic
from tests.spark.streams import fill_topic
from tests.spark.streams import produce
from tests.spark.streams import run_available_now
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def test_available_now_reads_exactly_the_produced_records_and_resumes_from_checkpoint(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    servers = bootstrap(cluster)
    first = fill_topic(servers, "exact", 30)
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

    second = [f"second-{i}".encode() for i in range(20)]
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


def test_max_offsets_per_trigger_caps_every_micro_batch(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    produced = fill_topic(bootstrap(cluster), "capped", 25)
    run = run_available_now(
        spark, stream_options(bootstrap(cluster), "capped", maxOffsetsPerTrigger=7), tmp_path / "cp"
    )
    assert run.batch_sizes() == [7, 7, 7, 4]
    assert sorted(r.value for r in run.rows()) == sorted(produced)


def test_topics_matching_subscribe_pattern_created_while_running_are_read_from_earliest(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    """subscribePattern matches whole topic names (Java's String.matches); no topic
    matches when the query starts (startingOffsets=latest); once a matching one is
    created, its partitions are read from offset 0 and the others never. Also
    includeHeaders, minPartitions, and kafka.group.id / other kafka.* accepted."""
    servers = bootstrap(cluster)
    options = stream_options(
        servers, "unused", startingOffsets="latest", includeHeaders=True, minPartitions=4
    )
    del options["subscribe"]
    options |= {
        "subscribePattern": r"late-[a-z]+",
        "kafka.group.id": "orders-app",
        "kafka.session.timeout.ms": "6000",
    }
    run = QueryRun(spark, options, tmp_path / "cp", available_now=False)
    try:
        deadline = time.monotonic() + 60
        while not run.query.recentProgress:  # a trigger ran with no partition to read
            assert time.monotonic() < deadline and run.query.isActive, run.query.exception()
            time.sleep(0.2)
        for name in ("late-orders", "late-1", "xlate-orders"):  # only the first matches
            create_topic(servers, name)
        produced = [f"late-{i}".encode() for i in range(12)]
        produce(servers, "late-orders", produced, headers=[("source", b"test"), ("empty", None)])
        produce(servers, "late-1", [b"not-matching"])
        produce(servers, "xlate-orders", [b"matching-only-a-part"])
        rows = run.wait_rows(len(produced))
        time.sleep(1)  # a trigger more: nothing of the other topics comes
        rows = run.rows()
    finally:
        run.stop()
    assert sorted(r.value for r in rows) == sorted(produced)
    assert {r.topic for r in rows} == {"late-orders"}
    assert {r.partition for r in rows} == {0, 1}
    assert all(r.offset < 12 for r in rows) and min(r.offset for r in rows) == 0
    assert {tuple((h.key, h.value) for h in r.headers) for r in rows} == {
        (("source", b"test"), ("empty", None))
    }
