"""The options of Spark's Kafka source, on a real cluster and a real local SparkSession:
each changes what is read, not only what is accepted. Also the option error as Spark
shows it, and lag and loss in `query.lastProgress`. (subscribePattern with a topic
created mid-stream: tests/spark/test_stream.py.)"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from client import Producer
from client.errors import MinibrokerError
from client.spark.cluster_view import ClusterView
from client.spark.options import SourceOptions
from client.types import TopicPartition
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import QueryRun
from tests.spark.streams import create_topic
from tests.spark.streams import fill_topic
from tests.spark.streams import produce
from tests.spark.streams import run_available_now
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def wait_first_trigger(run: QueryRun) -> None:
    deadline = time.monotonic() + 60
    while not run.query.recentProgress:
        assert time.monotonic() < deadline and run.query.isActive, run.query.exception()
        time.sleep(0.2)


def test_progress_reports_records_behind_latest_and_data_loss(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    """reportLatestOffset: each micro-batch's progress has the latest offsets, the records
    behind them after the batch and Spark's Kafka metric names."""
    servers = bootstrap(cluster)
    fill_topic(servers, "lagging", 25, partitions=1)
    run = run_available_now(
        spark, stream_options(servers, "lagging", maxOffsetsPerTrigger=10), tmp_path / "cp"
    )
    assert run.batch_sizes() == [10, 10, 5]
    reports = []
    for progress in run.query.recentProgress:
        latest = progress["sources"][0]["latestOffset"]
        if latest is not None and progress["numInputRows"] > 0:
            reports.append(json.loads(latest) if isinstance(latest, str) else latest)
    assert [r["recordsBehindLatest"]["lagging"]["0"] for r in reports] == [15, 5, 0]
    first = reports[0]
    assert first["partitions"] == {"lagging": {"0": 25}}
    assert (first["maxOffsetsBehindLatest"], first["minOffsetsBehindLatest"]) == (15, 15)
    assert first["avgOffsetsBehindLatest"] == 15
    assert (first["dataLoss"], first["truncations"]) == (0, 0)


def test_min_offsets_per_trigger_waits_for_records_or_max_trigger_delay(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    """minOffsetsPerTrigger=10, maxTriggerDelay=3s: 12 records go at the next trigger;
    5 more wait until 3 s after that micro-batch."""
    servers = bootstrap(cluster)
    create_topic(servers, "trickle", partitions=1)
    options = stream_options(servers, "trickle", minOffsetsPerTrigger=10, maxTriggerDelay="3s")
    run = QueryRun(spark, options, tmp_path / "cp", available_now=False)
    try:
        wait_first_trigger(run)
        produce(servers, "trickle", [f"many-{i}".encode() for i in range(12)])
        run.wait_rows(12)
        produce(servers, "trickle", [f"few-{i}".encode() for i in range(5)])
        produced_at = time.monotonic()
        time.sleep(1.5)
        assert len(run.rows()) == 12, "5 of minOffsetsPerTrigger=10 records went at once"
        run.wait_rows(17)
        assert time.monotonic() - produced_at > 1.5, "released before maxTriggerDelay"
    finally:
        run.stop()
    assert run.batch_sizes() == [12, 5]


def produce_at(servers: str, topic: str, records: list[tuple[bytes, int]]) -> None:
    """Each value with its own timestamp (ms), to partition 0."""
    with Producer(servers, acks="all", linger_ms=0) as producer:
        futures = [producer.send(topic, v, partition=0, timestamp_ms=ts) for v, ts in records]
        producer.flush()
        for f in futures:
            f.result(30)


def batch_read(spark: Any, servers: str, topic: str, **options: str) -> list[tuple[int, bytes]]:
    reader = (
        spark.read.format("minibroker")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return [(r.offset, r.value) for r in reader.load().orderBy("offset").collect()]


def test_timestamp_options_and_max_records_per_partition(
    spark: Any, cluster: ScenarioCluster
) -> None:
    """Offsets by time (ListOffsets by timestamp): the first record at or after the time
    starts (or, ending, ends) the read; past the last record: ending means latest,
    starting fails (strategy "error") or starts at the end (strategy "latest")."""
    servers = bootstrap(cluster)
    create_topic(servers, "timed", partitions=1)
    base = 1_700_000_000_000
    produce_at(servers, "timed", [(f"t{i}".encode(), base + 1000 * i) for i in range(10)])
    everything = [(i, f"t{i}".encode()) for i in range(10)]

    assert batch_read(spark, servers, "timed", startingTimestamp=str(base + 3000)) == everything[3:]
    between = batch_read(
        spark,
        servers,
        "timed",
        startingOffsetsByTimestamp=json.dumps({"timed": {"0": base + 2500}}),
        endingOffsetsByTimestamp=json.dumps({"timed": {"0": base + 6000}}),
    )
    assert between == everything[3:6]
    # startingTimestamp takes precedence over startingOffsets.
    assert (
        batch_read(
            spark, servers, "timed", startingTimestamp=str(base + 8000), startingOffsets="earliest"
        )
        == everything[8:]
    )
    after_the_end = str(base + 60_000)
    assert batch_read(spark, servers, "timed", endingTimestamp=after_the_end) == everything
    with pytest.raises(Exception) as err:
        batch_read(spark, servers, "timed", startingTimestamp=after_the_end)
    first_line = str(err.value).splitlines()[0]  # found while planning: first too
    assert "option startingTimestamp: no record at or after the time in timed-0" in first_line
    assert 'set startingOffsetsByTimestampStrategy to "latest"' in first_line
    assert (
        batch_read(
            spark,
            servers,
            "timed",
            startingTimestamp=after_the_end,
            startingOffsetsByTimestampStrategy="latest",
        )
        == []
    )

    split = (
        spark.read.format("minibroker")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", "timed")
        .option("maxRecordsPerPartition", "3")
        .load()
    )
    assert split.rdd.getNumPartitions() == 4  # 10 records, at most 3 a task
    assert sorted(r.offset for r in split.collect()) == list(range(10))


def test_an_option_error_is_the_first_line_spark_shows(
    spark: Any, cluster: ScenarioCluster, tmp_path: Path
) -> None:
    servers = bootstrap(cluster)
    wanted = 'option startingOffsetsByTimestampStrategy must be "error" or "latest", not \'soon\''
    bad = {
        "kafka.bootstrap.servers": servers,
        "subscribe": "anything",
        "startingOffsetsByTimestampStrategy": "soon",
    }
    with pytest.raises(Exception) as batch_error:
        spark.read.format("minibroker").options(**bad).load().collect()
    first_line = str(batch_error.value).splitlines()[0]
    assert first_line.endswith(f"OptionError: {wanted}"), first_line

    query = (
        spark.readStream.format("minibroker")
        .options(**bad)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    with pytest.raises(Exception) as stream_error:
        query.awaitTermination(60)
    first_line = str(stream_error.value).splitlines()[0]
    assert first_line.endswith(f"OptionError: {wanted}"), first_line

    with pytest.raises(Exception) as unknown:
        spark.read.format("minibroker").options(**bad, colour="blue").load().collect()
    first_line = str(unknown.value).splitlines()[0]
    assert "unknown source option(s) colour for format 'minibroker'" in first_line, first_line


def test_sink_acks_and_in_flight_options_write_without_idempotence(
    spark: Any, cluster: ScenarioCluster
) -> None:
    servers = bootstrap(cluster)
    create_topic(servers, "acks-one", partitions=1)
    rows = [(f"v{i}",) for i in range(20)]
    (
        spark.createDataFrame(rows, "value string")
        .coalesce(1)
        .write.format("minibroker")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", "acks-one")
        .option("kafka.acks", "1")
        .option("kafka.max.in.flight.requests.per.connection", "10")
        .option("includeHeaders", "true")
        .mode("append")
        .save()
    )
    got = batch_read(spark, servers, "acks-one")
    assert sorted(v for _, v in got) == sorted(f"v{i}".encode() for i in range(20))


def test_group_id_is_said_once_at_info_and_unused_kafka_parameters_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "t",
            "kafka.group.id": "orders-app",
            "kafka.fetch.max.bytes": "1",
        },
        streaming=True,
    )
    with caplog.at_level(logging.INFO, logger="client.spark.options"):
        options.announce()
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(infos) == 1 and "'orders-app' is not used" in infos[0], infos
    assert "joins no consumer group" in infos[0]
    assert len(warnings) == 1 and "kafka.fetch.max.bytes" in warnings[0], warnings


async def test_fetch_offset_retries_bound_the_drivers_offset_lookups(tmp_path: Path) -> None:
    """fetchOffset.numRetries / retryIntervalMs: a lookup at a dead leader fails after
    that many retries, that far apart; without them the planner retries until
    kafkaConsumer.pollTimeoutMs (a leader election takes longer than Spark's 3 x 10 ms)."""
    with scenario_cluster(tmp_path) as c:
        c.start_controller()
        c.start_broker(1)
        c.start_broker(2)
        await c.create_topic("orphan", replicas=[2])
        await c.wait_leader("orphan", 2)
        servers = bootstrap(c, (1,))
        tp = TopicPartition("orphan", 0)
        bounded = ClusterView(servers, timeout_ms=20_000, retries=2, retry_interval_ms=100)
        patient = ClusterView(servers, timeout_ms=3_000)
        try:
            assert bounded.high_watermarks([tp]) == {tp: 0}  # metadata cached: leader 2
            assert patient.high_watermarks([tp]) == {tp: 0}
            c.brokers[2].kill()
            started = time.monotonic()
            with pytest.raises(
                MinibrokerError, match=r"failed 3 times \(fetchOffset\.numRetries=2\)"
            ):
                await asyncio.to_thread(bounded.high_watermarks, [tp])
            assert time.monotonic() - started < 10
            started = time.monotonic()
            with pytest.raises(MinibrokerError):
                await asyncio.to_thread(patient.high_watermarks, [tp])
            assert time.monotonic() - started >= 2.5
        finally:
            bounded.close()
            patient.close()
