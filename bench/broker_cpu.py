"""Broker CPU per produced record, by role: `python -m bench broker-cpu`.

RF 3, acks=all, min.insync.replicas 2, one partition (so one broker leads and two
follow), `create_batch()` / `send_batch()` of `--batch-size` batches of `--record-size`
records from this process. For each broker: microseconds of CPU (utime + stime from
/proc) per acknowledged record over the measured sends, after a warm-up. The leader
validates and appends the client's batches and answers the followers' fetches; a
follower fetches and appends.

Why a CPU measure: on this 2-core machine the produce bench's records/s varies by
±15% from run to run (the cluster and the client share the cores), which hides a
change of a few microseconds per batch; CPU per record does not depend on what else
runs. Compare two checkouts back to back, each run from its own directory, e.g.
issue 13's produce validation: `python -m bench broker-cpu --repeats 3` in both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench.harness import BenchCluster
from bench.harness import common_args
from bench.harness import format_table
from bench.harness import int_list
from bench.harness import process_cpu_seconds
from bench.harness import run
from bench.harness import size_label
from bench.harness import write_results
from client.admin import AsyncAdmin
from client.producer import AsyncProducer

TOPIC = "broker-cpu"
WARM_UP_RECORDS = 5_000
MAX_PENDING_BATCHES = 64  # send_batch futures outstanding before waiting for them


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench broker-cpu",
        description="Broker CPU per produced record by role (leader, followers), RF 3 acks=all.",
    )
    common_args(p)
    p.add_argument("--record-size", type=int_list, default=[100, 1024], help="[100,1024]")
    p.add_argument("--batch-size", type=int, default=16_384, help="batch_size [16384]")
    p.add_argument("--records", type=int, default=300_000, help="records per measurement [300000]")
    p.add_argument("--repeats", type=int, default=3, help="measurements per size, median [3]")
    return p


async def produce(bootstrap: str, count: int, size: int, batch_size: int) -> int:
    """Send `count` records of `size` bytes in whole batches; the records acknowledged."""
    value = b"x" * size
    sent = 0
    async with AsyncProducer(
        bootstrap, acks="all", linger_ms=5, batch_size=batch_size, max_request_size=2 * batch_size
    ) as producer:
        pending: list[asyncio.Future[Any]] = []
        while sent < count:
            batch = producer.create_batch()
            while batch.append(value=value) is not None:
                sent += 1
            pending.append(await producer.send_batch(batch, TOPIC, partition=0))
            if len(pending) >= MAX_PENDING_BATCHES:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    return sent


async def leader_of(bootstrap: str) -> int:
    async with AsyncAdmin(bootstrap) as admin:
        (topic,) = await admin.describe_topics([TOPIC], include_offsets=False)
    return topic.partitions[0].leader


def measure(cluster: BenchCluster, size: int, batch_size: int, records: int) -> dict[str, Any]:
    run(produce(cluster.bootstrap, WARM_UP_RECORDS, size, batch_size))
    pids = {n: b.pid for n, b in cluster.cluster.brokers.items()}
    before = {n: process_cpu_seconds(pid) for n, pid in pids.items()}
    began = time.monotonic()
    sent = run(produce(cluster.bootstrap, records, size, batch_size))
    wall = time.monotonic() - began
    used = {n: process_cpu_seconds(pid) - before[n] for n, pid in pids.items()}
    leader = run(leader_of(cluster.bootstrap))
    followers = [used[n] for n in used if n != leader]
    return {
        "record_size": size,
        "batch_size": batch_size,
        "records": sent,
        "records_per_s": sent / wall,
        "leader_us_per_record": used[leader] / sent * 1e6,
        "follower_us_per_record": statistics.mean(followers) / sent * 1e6,
        "brokers_us_per_record": sum(used.values()) / sent * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    began = time.monotonic()
    records = 30_000 if args.quick else args.records
    results: list[dict[str, Any]] = []
    with BenchCluster(brokers=3, keep_data=args.keep_data) as cluster:
        run(
            cluster.create_topic(
                TOPIC, partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"}
            )
        )
        for size in args.record_size:
            runs = [measure(cluster, size, args.batch_size, records) for _ in range(args.repeats)]
            median = {
                key: statistics.median(r[key] for r in runs)
                for key in runs[0]
                if key.endswith("per_record") or key == "records_per_s"
            }
            results.append({**runs[0], **median, "runs": runs})
    rows = [
        [
            size_label(r["record_size"]),
            size_label(r["batch_size"]),
            round(r["leader_us_per_record"], 2),
            round(r["follower_us_per_record"], 2),
            round(r["brokers_us_per_record"], 2),
            round(r["records_per_s"]),
        ]
        for r in results
    ]
    columns = ["record", "batch", "leader us/rec", "follower us/rec", "3 brokers us/rec", "rec/s"]
    print(format_table(columns, rows))
    write_results("broker-cpu", args=args, rows=results, started=began, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
