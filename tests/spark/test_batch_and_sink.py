"""Batch reads between offsets, and the sink (batch and streaming), on a real cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.spark.conftest import bootstrap
from tests.spark.streams import create_topic
from tests.spark.streams import produce
from tests.spark.streams import run_available_now
from tests.spark.streams import stream_options

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def batch_df(spark: Any, servers: str, topic: str | None, **options: str) -> Any:
    """spark.read of `topic` (subscribe), or of the `assign` option's partitions."""
    reader = spark.read.format("minibroker").option("kafka.bootstrap.servers", servers)
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def read_batch(spark: Any, servers: str, topic: str, **options: str) -> list[Any]:
    return batch_df(spark, servers, topic, **options).orderBy("partition", "offset").collect()


def test_batch_read_between_starting_and_ending_offsets(
    spark: Any, cluster: ScenarioCluster
) -> None:
    servers = bootstrap(cluster)
    create_topic(servers, "ranges", partitions=1)
    produced = [f"r-{i}".encode() for i in range(20)]
    produce(servers, "ranges", produced)

    everything = read_batch(spark, servers, "ranges")
    assert [(r.offset, r.value) for r in everything] == list(enumerate(produced))
    middle = batch_df(
        spark,
        servers,
        None,
        assign='{"ranges": [0]}',
        startingOffsets='{"ranges": {"0": 5}}',
        endingOffsets='{"ranges": {"0": {"offset": 15, "epoch": 0}}}',
        minPartitions="3",
    )
    assert middle.rdd.getNumPartitions() == 3  # offsets 5-14 split in three tasks
    rows = middle.orderBy("offset").collect()
    assert [(r.offset, r.value) for r in rows] == list(enumerate(produced))[5:15]
    with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers is required"):
        spark.read.format("minibroker").option("subscribe", "ranges").load().collect()
    with pytest.raises(Exception, match="after the ending offset"):
        read_batch(
            spark,
            servers,
            "ranges",
            startingOffsets='{"ranges": {"0": 9}}',
            endingOffsets='{"ranges": {"0": 3}}',
        )


def test_sink_and_batch_read_round_trip_a_dataframe_exactly(
    spark: Any, cluster: ScenarioCluster
) -> None:
    servers = bootstrap(cluster)
    create_topic(servers, "round-trip", partitions=2)
    rows = [
        (f"k{i}".encode() if i % 3 else None, f"value {i}", i % 2, [("n", str(i).encode())])
        for i in range(40)
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value string, partition int, headers array<struct<key string, value binary>>",
    )
    (
        df.write.format("minibroker")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", "round-trip")
        .mode("append")
        .save()
    )
    back = read_batch(spark, servers, "round-trip", includeHeaders="true")
    got = [
        (r.key, r.value.decode(), r.partition, [(h.key, h.value) for h in r.headers]) for r in back
    ]
    assert sorted(got, key=repr) == sorted(rows, key=repr)
    assert len(back) == len(rows)
    # Each partition received its rows in order, at offsets 0..n-1.
    for p in (0, 1):
        offsets = [r.offset for r in back if r.partition == p]
        assert offsets == list(range(20))

    with pytest.raises(Exception, match="needs a `value` column"):
        spark.createDataFrame([(1,)], "v int").write.format("minibroker").option(
            "kafka.bootstrap.servers", servers
        ).option("topic", "round-trip").mode("append").save()


def test_stream_sink_copies_a_topic(spark: Any, cluster: ScenarioCluster, tmp_path: Path) -> None:
    """readStream -> writeStream.format("minibroker"): the copy holds exactly the source
    records (same partition, key and value), in order."""
    servers = bootstrap(cluster)
    create_topic(servers, "copy-from")
    create_topic(servers, "copy-to")
    produced = [f"c-{i}".encode() for i in range(30)]
    produce(servers, "copy-from", produced)
    query = (
        spark.readStream.format("minibroker")
        .options(**stream_options(servers, "copy-from"))
        .load()
        .select("key", "value", "partition")
        .writeStream.format("minibroker")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", "copy-to")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    source = read_batch(spark, servers, "copy-from")
    copy = read_batch(spark, servers, "copy-to")
    assert [(r.partition, r.offset, r.key, r.value) for r in copy] == [
        (r.partition, r.offset, r.key, r.value) for r in source
    ]
    # Nothing new: a restart from the checkpoint writes nothing again.
    again = run_available_now(spark, stream_options(servers, "copy-to"), tmp_path / "cp2")
    assert len(again.rows()) == len(produced)
