"""Truncation between two micro-batches (DESIGN section 9), on a real cluster.

Invariant protected: the stream never reports records of a lost lineage as if they were
still in the log, and never silently reads a new lineage at offsets it believes follow
the ones it already delivered, even when the log has grown back past its stored offset
(the case Spark's own Kafka source cannot see: it stores offsets without epochs).

Staging (scenario 3's `stage_unclean_divergence`): one partition, replicas [1, 2, 3],
min.insync.replicas=1, unclean election on. Offsets 0-4 "in-sync-*" on all replicas,
5-8 "only-on-1-*" on broker 1 alone (epoch E0). Micro-batch 1 (availableNow, run 1)
reads all nine: the checkpoint stores {"offset": 9, "epoch": E0, "epochStart": 0}.
Broker 1 is killed, broker 2 elected uncleanly at E2 and given "new-0..5" at offsets
5-10: the log end (11) is past the stored offset 9 again. Broker 2's end offset for E0
is 5: the divergence.

- failOnDataLoss=true: run 2 from the checkpoint fails; the message names the topic,
  the partition, the stored offset and epoch and the divergence offset; nothing of the
  new lineage is delivered.
- failOnDataLoss=false: run 3 from the same checkpoint resumes at offset 5: the sink gets
  exactly "new-0..5" at 5-10 (epoch E2), the loss is counted ("dataLoss": 1 in the
  offset) and logged.
- protection off (an offset without its epoch, as Spark's Kafka source keeps it): a read
  from offset 9 returns "new-4", "new-5" as if they followed "only-on-1-3"; nothing tells.
- executors: a task whose range was planned before the election (offsets 5-8, epoch E0)
  finds records of epoch E2 there and fails (or, failOnDataLoss=false, returns nothing);
  a task starting at (9, E0) is stopped by the consumer's own validation (KIP-320).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from client.spark.offsets import Position
from client.spark.options import SourceOptions
from client.spark.partition_reader import read_range
from client.spark.planning import DataLossError
from client.spark.planning import OffsetRange
from client.types import TopicPartition
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.test_kip101_appendix_unclean_divergence import DIVERGENCE
from tests.scenarios.test_kip101_appendix_unclean_divergence import IN_SYNC
from tests.scenarios.test_kip101_appendix_unclean_divergence import NEW
from tests.scenarios.test_kip101_appendix_unclean_divergence import ONLY_ON_1
from tests.scenarios.test_kip101_appendix_unclean_divergence import TOPIC
from tests.scenarios.test_kip101_appendix_unclean_divergence import Staged
from tests.scenarios.test_kip101_appendix_unclean_divergence import stage_unclean_divergence
from tests.scenarios.test_kip101_appendix_unclean_divergence import start_cluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import QueryRun
from tests.spark.streams import run_available_now
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

STORED = len(IN_SYNC) + len(ONLY_ON_1)  # 9: the offset run 1 checkpoints


async def test_truncation_between_micro_batches_is_detected_after_the_log_grew_back(
    spark: Any, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    first: list[QueryRun] = []

    async def first_micro_batch(c: ScenarioCluster, s: Staged) -> None:
        run = run_available_now(spark, stream_options(bootstrap(c), TOPIC), checkpoint)
        assert [(r.offset, r.value, r.leaderEpoch) for r in run.rows()] == [
            (i, v, s.e0) for i, v in enumerate(IN_SYNC + ONLY_ON_1)
        ]
        assert run.end_offset()["partitions"][TOPIC]["0"] == {
            "offset": STORED,
            "epoch": s.e0,
            "epochStart": 0,
        }
        first.append(run)

    (tmp_path / "cluster").mkdir()
    with scenario_cluster(tmp_path / "cluster") as c:
        await start_cluster(c)
        s = await stage_unclean_divergence(c, [], before_leader_dies=first_micro_batch)
        assert first, "micro-batch 1 did not run"
        servers = bootstrap(c)

        # failOnDataLoss=true (the default): the query fails, naming everything.
        failing = QueryRun(spark, stream_options(servers, TOPIC), checkpoint)
        with pytest.raises(Exception) as err:
            failing.wait()
        message = str(err.value)
        for part in (
            f"topic {TOPIC} partition 0",
            f"truncated at offset {DIVERGENCE} of leader epoch {s.e0}",
            f"stored offset {STORED} (leader epoch {s.e0})",
            f"diverges at offset {DIVERGENCE}",
            f'"failOnDataLoss" to "false": the source then resumes at offset {DIVERGENCE}, '
            "the divergence offset",
        ):
            assert part in message, message[:3000]
        assert "first offset still in the log" not in message, message[:3000]
        assert failing.rows() == [], "records of the new lineage were delivered"

        # failOnDataLoss=false: resume at the divergence offset, on the new lineage.
        going_on = run_available_now(
            spark, stream_options(servers, TOPIC, failOnDataLoss=False), checkpoint
        )
        rows = going_on.rows()
        assert [(r.offset, r.value, r.leaderEpoch) for r in rows] == [
            (DIVERGENCE + i, v, s.e2) for i, v in enumerate(NEW)
        ]
        assert not {r.value for r in rows} & set(ONLY_ON_1)
        end = going_on.end_offset()
        assert (end["dataLoss"], end["truncations"]) == (1, 1)
        latest = going_on.query.lastProgress["sources"][0]["latestOffset"]
        report = json.loads(latest) if isinstance(latest, str) else latest
        assert (report["dataLoss"], report["truncations"]) == (1, 1)
        assert end["partitions"][TOPIC]["0"] == {
            "offset": DIVERGENCE + len(NEW),
            "epoch": s.e2,
            "epochStart": DIVERGENCE,
        }

        # Protection off: the offset alone, as Spark's Kafka source would store it.
        blind = (
            spark.read.format("minibroker")
            .option("kafka.bootstrap.servers", servers)
            .option("subscribe", TOPIC)
            .option("startingOffsets", f'{{"{TOPIC}": {{"0": {STORED}}}}}')
            .load()
            .orderBy("offset")
            .collect()
        )
        assert [(r.offset, r.value) for r in blind] == [(9, b"new-4"), (10, b"new-5")]
        # The same read with the epoch kept fails like the stream; a batch read given
        # the position read nothing: its message does not blame an election.
        with pytest.raises(Exception, match=f"diverges at offset {DIVERGENCE}") as err:
            (
                spark.read.format("minibroker")
                .option("kafka.bootstrap.servers", servers)
                .option("subscribe", TOPIC)
                .option(
                    "startingOffsets",
                    f'{{"{TOPIC}": {{"0": {{"offset": {STORED}, "epoch": {s.e0}}}}}}}',
                )
                .load()
                .collect()
            )
        given = str(err.value)
        assert f"the startingOffsets position {STORED} (leader epoch {s.e0})" in given, given
        assert "unclean" not in given and "already read" not in given, given

        # Executors: ranges planned before the election, read after it.
        tp = TopicPartition(TOPIC, 0)
        strict = SourceOptions.parse(stream_options(servers, TOPIC), streaming=True)
        lenient = SourceOptions.parse(
            stream_options(servers, TOPIC, failOnDataLoss=False), streaming=True
        )
        planned = OffsetRange.between(tp, Position(DIVERGENCE, s.e0), Position(STORED, s.e0))
        with pytest.raises(DataLossError, match=f"offset {DIVERGENCE} carries leader epoch {s.e2}"):
            list(read_range(planned, strict))
        assert list(read_range(planned, lenient)) == []
        past = OffsetRange.between(tp, Position(STORED, s.e0), Position(11, s.e2))
        with pytest.raises(DataLossError, match="log truncation detected"):
            list(read_range(past, strict))
        assert list(read_range(past, lenient)) == []
