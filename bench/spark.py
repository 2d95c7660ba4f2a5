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
records written. The query runs `--queries` times (default 2) in the same session,
each from a fresh checkpoint over the whole topic: the first is cold (Spark starts its
Python workers and the JVM compiles the read path on the way), the next ones warm.
Each row also says how long the micro-batches themselves took (`triggerExecution`;
the rest is Spark starting and stopping the query: it launches a Python process per
query for the stream reader), the best `processedRowsPerSecond` of a micro-batch, and
the CPU seconds the query took in the Spark JVM, in Spark's Python processes and in
the broker (so what bounds it shows: 2 cores = 2 CPU-s per second).

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
from pathlib import Path
from typing import Any

from bench.harness import BenchCluster
from bench.harness import MiB
from bench.harness import Progress
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import raw_fill
from bench.harness import report
from bench.harness import run
from client.cluster import ClusterClient
from client.spark.session import local_session

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
    p.add_argument(
        "--queries", type=int, default=2, help="queries in one session, the first cold [2]"
    )
    p.add_argument(
        "--source",
        choices=("minibroker", "floor"),
        default="minibroker",
        help="floor: the same query over an in-memory Python source "
        "(bench/spark_floor_source.py), Spark's own cost for a Python streaming source",
    )
    p.add_argument(
        "--compiled-workers",
        choices=("on", "off"),
        default="on",
        help="local_session(compiled_workers=...): Spark's Python processes import the "
        "byte-compiled pyspark (on) or compile it from pyspark.zip (off) [on]",
    )
    p.add_argument(
        "--class-archive",
        choices=("on", "off"),
        default="on",
        help="local_session(class_archive=...): the JVM maps the classes an earlier "
        "session archived, or writes the archive at its exit if there is none yet "
        "(client/spark/class_archive.py) [on]",
    )
    return p


def class_archive_state(session: Any) -> str:
    """What the session's JVM does with a class-data archive: mapped (an earlier
    session wrote it), written at exit (the first session), or none."""
    bean = session.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = " ".join(str(a) for a in bean.getInputArguments())
    if "SharedArchiveFile" in arguments:
        return "mapped"
    if "ArchiveClassesAtExit" in arguments:
        return "written at exit"
    return "none"


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


def spark_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process's Spark JVM (`jvm`) and of the Python
    processes it started (`python`: the live ones plus those it has reaped)."""
    parents: dict[int, int] = {}
    times: dict[int, tuple[float, float]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        pid = int(entry.name)
        names[pid] = head.partition("(")[2]
        parents[pid] = int(fields[1])
        ticks = os.sysconf("SC_CLK_TCK")
        times[pid] = (
            (int(fields[11]) + int(fields[12])) / ticks,  # utime + stime
            (int(fields[13]) + int(fields[14])) / ticks,  # cutime + cstime (reaped children)
        )
    jvms = [pid for pid, ppid in parents.items() if ppid == os.getpid() and names[pid] == "java"]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out = {"jvm": 0.0, "python": 0.0}
    for jvm in jvms:
        own, reaped = times[jvm]
        out["jvm"] += own
        out["python"] += reaped
        stack = [jvm]
        while stack:
            parent = stack.pop()
            for pid in children.get(parent, ()):
                out["python"] += times[pid][0]
                stack.append(pid)
    return out


def stream_once(session: Any, cluster: BenchCluster, args: argparse.Namespace) -> dict[str, Any]:
    checkpoint = tempfile.mkdtemp(prefix="minibroker-bench-spark-")
    try:
        if args.source == "floor":
            reader = (
                session.readStream.format("bench_floor")
                .option("rows", str(args.written))
                .option("partitions", str(args.partitions))
            )
        else:
            reader = (
                session.readStream.format("minibroker")
                .option("kafka.bootstrap.servers", cluster.bootstrap)
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
        cpu_before, broker_before = spark_cpu_seconds(), cluster.broker_cpu_seconds()
        start = time.perf_counter()
        handle = query.start()
        handle.awaitTermination()
        elapsed = time.perf_counter() - start
        cpu = {k: v - cpu_before[k] for k, v in spark_cpu_seconds().items()}
        broker_cpu = cluster.broker_cpu_seconds() - broker_before
        if handle.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {handle.exception()}")
        progress = handle.recentProgress
        rows = sum(p["numInputRows"] for p in progress)
        best = max((p.get("processedRowsPerSecond") or 0 for p in progress), default=0)
        batches_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
        # Spark's own split of each trigger (latestOffset, queryPlanning, addBatch...)
        phases_ms: dict[str, int] = {}
        for p in progress:
            for phase, ms in p["durationMs"].items():
                phases_ms[phase] = phases_ms.get(phase, 0) + ms
        return {
            "rows": rows,
            "seconds": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed),
            "micro_batches": sum(1 for p in progress if p["numInputRows"]),
            "batches_s": round(batches_ms / 1000, 3),
            "best_batch_rows_per_s": round(best),
            "jvm_cpu_s": round(cpu["jvm"], 2),
            "python_cpu_s": round(cpu["python"], 2),
            "broker_cpu_s": round(broker_cpu, 2),
            "phases_ms": phases_ms,
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
    progress = Progress(3, NAME)
    with BenchCluster(1, keep_data=args.keep_data) as cluster:
        progress.update(f"writing {args.records:,} records")
        written = run(fill(cluster, args.records, args.partitions))
        progress.step("starting Spark (not timed)")
        started = time.perf_counter()
        session = local_session(
            "minibroker-bench",
            compiled_workers=args.compiled_workers == "on",
            class_archive=args.class_archive == "on",
        )
        args.session_start_s = round(time.perf_counter() - started, 2)
        args.class_archive_state = class_archive_state(session)
        args.written = written
        if args.source == "floor":
            from bench.spark_floor_source import FloorDataSource

            session.dataSource.register(FloorDataSource)
        rows: list[dict[str, Any]] = []
        try:
            for query in range(1, args.queries + 1):
                progress.update(f"streaming (availableNow), query {query}/{args.queries}")
                rows.append(
                    {
                        "query": query,
                        "session": "cold" if query == 1 else "warm",
                        "records": written,
                        "partitions": args.partitions,
                        **stream_once(session, cluster, args),
                    }
                )
        finally:
            session.stop()
        progress.step("done")
    for row in rows:
        if row["rows"] != written:
            raise RuntimeError(f"the query read {row['rows']} rows, the topic holds {written}")
    columns = [
        "query",
        "records",
        "partitions",
        "micro-batches",
        "seconds",
        "rows/s",
        "batches s",
        "best batch rows/s",
        "JVM CPU s",
        "Python CPU s",
        "broker CPU s",
    ]
    table = [
        [
            f"{row['query']} ({row['session']})",
            row["records"],
            row["partitions"],
            row["micro_batches"],
            row["seconds"],
            row["rows_per_s"],
            row["batches_s"],
            row["best_batch_rows_per_s"],
            row["jvm_cpu_s"],
            row["python_cpu_s"],
            row["broker_cpu_s"],
        ]
        for row in rows
    ]
    extra = {
        "spark": "local[2], noop sink, trigger availableNow",
        "compiled_workers": args.compiled_workers,
        "class_archive": args.class_archive_state,
        "session_start_s": args.session_start_s,
        "source": args.source,
    }
    return report(NAME, args, progress, columns, table, rows, **extra)


if __name__ == "__main__":
    sys.exit(main())
