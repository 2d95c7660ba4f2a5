"""Records deleted by retention before the stream read them: handled like Spark's Kafka
source (fail with failOnDataLoss=true; WARNING and go on from the log start with false).

Staging: one broker checking retention every 200 ms; a topic with 1 KiB segments and
retention.bytes=2048. Micro-batch 1 reads the first 5 records (checkpoint: offset 5).
Then 60 records of ~200 bytes roll many segments and retention deletes the old ones:
the log start moves far past 5.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from client import Admin
from client.types import TopicPartition
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import QueryRun
from tests.spark.streams import produce
from tests.spark.streams import run_available_now
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "retained"
TP = TopicPartition(TOPIC, 0)


async def test_offsets_deleted_by_retention_are_reported_like_sparks_kafka_source(
    spark: Any, tmp_path: Path
) -> None:
    (tmp_path / "cluster").mkdir()
    with scenario_cluster(tmp_path / "cluster") as c:
        c.start_controller()
        c.start_broker(1, "--retention-check-interval-ms", "200")
        await c.create_topic(
            TOPIC, replicas=[1], configs={"segment.bytes": "1024", "retention.bytes": "2048"}
        )
        await c.wait_leader(TOPIC, 1)
        servers = bootstrap(c, (1,))
        checkpoint = tmp_path / "cp"
        produce(servers, TOPIC, [f"early-{i}".encode() for i in range(5)])
        first = run_available_now(spark, stream_options(servers, TOPIC), checkpoint)
        assert [r.offset for r in first.rows()] == [0, 1, 2, 3, 4]

        produce(servers, TOPIC, [f"late-{i:03d}-".encode() + b"x" * 180 for i in range(60)])
        with Admin(servers) as admin:
            deadline = time.monotonic() + 30
            while (start := admin.list_offsets({TP: "earliest"})[TP].offset) <= 5:
                assert time.monotonic() < deadline, "retention did not move the log start"
                await asyncio.sleep(0.2)

        failing = QueryRun(spark, stream_options(servers, TOPIC), checkpoint)
        with pytest.raises(Exception, match=r"offsets 5 to \d+ are no longer in the log") as err:
            failing.wait()
        message = str(err.value)
        for part in (
            "retention deleted the log past offset 5",
            "the source then resumes at offset ",
            "the first offset still in the log",
        ):
            assert part in message, message[:3000]
        assert failing.rows() == []

        going_on = run_available_now(
            spark, stream_options(servers, TOPIC, failOnDataLoss=False), checkpoint
        )
        offsets = [r.offset for r in going_on.rows()]
        assert offsets[0] >= start and offsets == list(range(offsets[0], 65))
        assert going_on.end_offset()["dataLoss"] == 1
        assert "truncations" not in going_on.end_offset()  # a retention loss only
