"""A checkpoint whose leader epoch is newer than the leader the query reaches is not a
data loss (issue 13, item 4, the Spark source).

    "The Spark source does the same: with failOnDataLoss=true it fails saying the
    epoch is no longer in the log, with false it re-reads 0-9, counts a data loss and
    moves its checkpoint back."

Invariant protected: a stored position that is on the log is never reported lost,
re-read or moved back because the broker the query reaches is a deposed leader still
at an older epoch: the planner (driver) and the executors wait for the metadata to show
the leader at the stored epoch (client/epochs.py), then go on from the position.

Staging: scenario `stage_deposed_leader` (tests/scenarios/
test_kip320_position_ahead_of_leader.py): broker 1, paused through the election of
broker 2 at E+1 and kept from hearing of it, still answers "leader 1, epoch E" and
holds offsets 0-9; broker 2 holds 0-14. Run 1 (through broker 2) reads 0-14 and
checkpoints {"offset": 15, "epoch": E+1, "epochStart": 10}. Runs 2 (failOnDataLoss=true)
and 3 (false) restart from that checkpoint with broker 1 as their only bootstrap server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.test_kip320_position_ahead_of_leader import DEPOSED
from tests.scenarios.test_kip320_position_ahead_of_leader import NEW_LEADER
from tests.scenarios.test_kip320_position_ahead_of_leader import NEWER
from tests.scenarios.test_kip320_position_ahead_of_leader import OLD
from tests.scenarios.test_kip320_position_ahead_of_leader import POSITION
from tests.scenarios.test_kip320_position_ahead_of_leader import TOPIC
from tests.scenarios.test_kip320_position_ahead_of_leader import address
from tests.scenarios.test_kip320_position_ahead_of_leader import stage_deposed_leader
from tests.spark.streams import QueryRun
from tests.spark.streams import run_available_now
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


async def test_a_checkpoint_ahead_of_a_deposed_leader_is_no_data_loss(
    spark: Any, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    (tmp_path / "cluster").mkdir()
    with scenario_cluster(tmp_path / "cluster") as c:
        try:
            s = await stage_deposed_leader(c)
            first = run_available_now(
                spark, stream_options(address(c, NEW_LEADER), TOPIC), checkpoint
            )
            assert [(r.offset, r.value) for r in first.rows()] == list(enumerate(OLD + NEWER))
            stored = {"offset": POSITION, "epoch": s.new_epoch, "epochStart": len(OLD)}
            assert first.end_offset()["partitions"][TOPIC]["0"] == stored

            position = POSITION
            for fail_on_data_loss, name in ((True, "c"), (False, "d")):
                values = [f"{name}-{i}".encode() for i in range(3)]
                assert await c.produce_ok(NEW_LEADER, TOPIC, s.new_epoch, values) == position
                run = QueryRun(
                    spark,
                    stream_options(address(c, DEPOSED), TOPIC, failOnDataLoss=fail_on_data_loss),
                    checkpoint,
                    available_now=False,
                )
                try:
                    rows = run.wait_rows(len(values))
                finally:
                    run.stop()
                assert [(r.offset, r.value, r.leaderEpoch) for r in rows] == [
                    (position + i, v, s.new_epoch) for i, v in enumerate(values)
                ], f"failOnDataLoss={fail_on_data_loss}: re-read or skipped"
                position += len(values)
                end = run.end_offset()
                assert end["dataLoss"] == 0, end
                assert end["partitions"][TOPIC]["0"] == {**stored, "offset": position}
        finally:
            await c.faults("controller", clear=True)
