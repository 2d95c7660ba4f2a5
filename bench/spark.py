"""Spark: rows/s of the `minibroker` streaming source (client/spark) with
`trigger(availableNow=True)` on local[2].

One broker, a topic of `--partitions` partitions (replication factor 1) holding
`--records` records of 100 B (written fast as copies of one encoded 1 MiB batch). A
SparkSession (local[2], PYSPARK_PYTHON = this interpreter) is started first and NOT
timed; then

    spark.readStream.format("minibroker")
        .option("kafka.bootstrap.servers", ...).option("subscribe", topic)
        .option("startingOffsets", "earliest").load()
        .writeStream.format("noop").trigger(availableNow=True).start()

is timed from start() until the query ends: rows/s = rows read / that time. The rows
read are the sum of numInputRows over the query's progress reports and must equal the
records written. The first micro-batch includes starting the Python workers; the
best `processedRowsPerSecond` of a micro-batch is reported too.

Needs Java and the spark extra (pyspark, pyarrow); without them the bench says so and
exits 2 (`all` counts it as failed, the other benches still run).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from bench.harness import (
    BenchCluster,
    MiB,
    Progress,
    build_batch,
    common_args,
    raw_fill,
    report,
    run,
)
from client.cluster import ClusterClient

NAME = "spark"
TOPIC = "bench-spark"
RECORD_SIZE = 100


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench spark", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--records", type=int, help="records in the topic [1,000,000; 300,000 quick]")
    p.add_argument("--partitions", type=int, default=4, help="partitions [4]")
    p.add_argument(
        "--max-offsets-per-trigger", type=int, help="maxOffsetsPerTrigger [none: one batch]"
    )
    return p


def spark_unavailable() -> str | None:
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        return "Java is not installed (no `java` on PATH, no JAVA_HOME): install a JDK 17+"
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: .venv/bin/pip install -e '.[spark]'"
    return None


async def fill(cluster: BenchCluster, records: int, partitions: int) -> int:
    """Write about `records` records; returns how many were written."""
    await cluster.create_topic(TOPIC, partitions=partitions, replication_factor=1)
    batch, per_batch = build_batch(RECORD_SIZE, MiB)
    batches = max(partitions, -(-records // per_batch))
    client = ClusterClient(cluster.bootstrap, client_id="bench-spark-fill")
    await client.bootstrap()
    try:
        written = await raw_fill(client, TOPIC, partitions, batch, batches * len(batch))
    finally:
        await client.close()
    return written // len(batch) * per_batch


def start_spark() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from client.spark import MinibrokerDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("minibroker-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MinibrokerDataSource)
    return session


def stream_once(session: Any, bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    checkpoint = tempfile.mkdtemp(prefix="minibroker-bench-spark-")
    try:
        reader = (
            session.readStream.format("minibroker")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
        )
        if args.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
        query = (
            reader.load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", checkpoint)
        )
        start = time.perf_counter()
        handle = query.start()
        handle.awaitTermination()
        elapsed = time.perf_counter() - start
        if handle.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {handle.exception()}")
        progress = handle.recentProgress
        rows = sum(p["numInputRows"] for p in progress)
        best = max((p.get("processedRowsPerSecond") or 0 for p in progress), default=0)
        return {
            "rows": rows,
            "seconds": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed),
            "micro_batches": sum(1 for p in progress if p["numInputRows"]),
            "best_batch_rows_per_s": round(best),
        }
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    reason = spark_unavailable()
    if reason is not None:
        print(f"bench spark: cannot run: {reason}", file=sys.stderr)
        return 2
    if args.records is None:
        args.records = 300_000 if args.quick else 1_000_000
    started = time.monotonic()
    progress = Progress(3, NAME)
    with BenchCluster(1, keep_data=args.keep_data) as cluster:
        progress.update(f"writing {args.records:,} records")
        written = run(fill(cluster, args.records, args.partitions))
        progress.step("starting Spark (not timed)")
        session = start_spark()
        try:
            progress.step("streaming (availableNow)")
            row = {
                "records": written,
                "partitions": args.partitions,
                **stream_once(session, cluster.bootstrap, args),
            }
        finally:
            session.stop()
        progress.step("done")
    if row["rows"] != written:
        raise RuntimeError(f"the query read {row['rows']} rows, the topic holds {written}")
    columns = ["records", "partitions", "micro-batches", "seconds", "rows/s", "best batch rows/s"]
    table = [
        [
            row["records"],
            row["partitions"],
            row["micro_batches"],
            row["seconds"],
            row["rows_per_s"],
            row["best_batch_rows_per_s"],
        ]
    ]
    return report(
        NAME,
        args=args,
        progress=progress,
        columns=columns,
        table=table,
        rows=[row],
        started=started,
        extra={"spark": "local[2], noop sink, trigger availableNow"},
    )


if __name__ == "__main__":
    sys.exit(main())
