"""A normal leader failover between micro-batches raises nothing and loses nothing.

Invariant protected: the epoch validation only reports a truncation when the current
lineage really diverges below the stored position. After a clean failover (the leader
is SIGKILLed; an in-sync follower takes over at a higher epoch, its high watermark
possibly behind for a moment) the stored position (offset, E0) is still on the log:
epoch E0 ends exactly where the new epoch starts, at or past the stored offset.

Also checks the planner's epoch lookups (client/epochs.py) on the resulting log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from client.epochs import EpochEndOffset
from client.spark.cluster_view import ClusterView
from client.spark.offsets import Position
from client.types import TopicPartition
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import QueryRun
from tests.spark.streams import produce
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "failover"
TP = TopicPartition(TOPIC, 0)
BEFORE = [f"before-{i}".encode() for i in range(10)]
AFTER = [f"after-{i}".encode() for i in range(10)]


async def test_leader_failover_between_micro_batches_raises_nothing(
    spark: Any, tmp_path: Path
) -> None:
    (tmp_path / "cluster").mkdir()
    with scenario_cluster(tmp_path / "cluster") as c:
        c.start_controller(session_timeout_ms=1500)
        c.start_brokers((1, 2, 3))
        await c.create_topic(TOPIC, replicas=[1, 2, 3])
        e0 = (await c.wait_leader(TOPIC, 1)).leader_epoch
        await c.wait_isr(TOPIC, {1, 2, 3})
        servers = bootstrap(c)
        produce(servers, TOPIC, BEFORE)

        run = QueryRun(spark, stream_options(servers, TOPIC), tmp_path / "cp", available_now=False)
        try:
            run.wait_rows(len(BEFORE))
            c.brokers[1].kill()
            e1 = (await c.wait_leader(TOPIC, min_epoch=e0 + 1, timeout=60)).leader_epoch
            produce(bootstrap(c, (2, 3)), TOPIC, AFTER)
            rows = run.wait_rows(len(BEFORE) + len(AFTER))
            assert run.query.exception() is None
        finally:
            run.stop()
        assert [(r.offset, r.value) for r in rows] == list(enumerate(BEFORE + AFTER))
        assert [r.leaderEpoch for r in rows] == [e0] * 10 + [e1] * 10
        end = run.end_offset()
        assert end == {
            "partitions": {TOPIC: {"0": {"offset": 20, "epoch": e1, "epochStart": 10}}},
            "dataLoss": 0,
        }

        with ClusterView(bootstrap(c, (2, 3)), timeout_ms=30_000) as view:
            assert view.epoch_ends({TP: e0}) == {TP: EpochEndOffset(e0, 10)}
            assert view.epoch_ends({TP: e1}) == {TP: EpochEndOffset(e1, 20)}
            # With where each epoch began (e0 at 0, e1 at 10): client/epochs.py rule 4.
            for position in [
                Position(0, -1, -1),
                Position(1, e0, 0),
                Position(10, e0, 0),
                Position(11, e1, 10),
                Position(20, e1, 10),
            ]:
                assert view.positions_at({TP: position.offset}) == {TP: position}
