"""Scale: how the cluster's costs grow with the number of partitions (issue 20 item 5).

For each size in `--partitions` (default 10, 100, 1,000, 10,000; `--quick` 10, 100) a
fresh cluster (one controller, three brokers, session timeout `--session-timeout-ms`)
gets one topic of that many partitions, replication factor 3, and the bench measures,
each step bounded in time:

- `create_s`: from CreateTopics until the metadata gives every partition a leader and
  a full ISR; `replicas_created_s`: until every broker has taken its role for every
  replica (its `partition.metadata` written, which comes after the directory; a broker
  may hold all 10,000 directories and still be 20 s from leading or following them);
  `isr_settled_s`: when that took more than half of replica.lag.time.max.ms, followers
  may have started fetching after their leader's first ISR check (and left the ISR):
  one lag window more and a full ISR again, before anything is measured;
- `idle_core_pct`: CPU of the busiest broker over `--idle-seconds` with nothing
  produced (followers long-polling, heartbeats, timers), % of one core, and
  `idle_us_per_partition`: the three brokers' idle CPU per partition per second;
- `rss_mb`, `fds`: the largest broker RSS and open descriptor count, idle;
- `produce_mb_s`, `ack_p99_ms`: `send_batch()` of 16 KiB batches of 100 B records,
  acks=all, round robin over every partition for `--produce-seconds`; MB/s of values
  and the p99 of a batch's time to its acknowledgement (the producer's view);
- `failover_s`: SIGKILL the broker leading the most partitions (about a third); time
  until the metadata shows none of them led by it (the controller fences it after the
  session timeout, then elects; target: session timeout + 2 s);
- `broker_restart_s`: restart that broker (its unclean log recovery) until it serves,
  and `isr_back_s` until every partition has a full ISR again;
- `controller_restart_s`: SIGKILL and restart the controller until it listens, and
  `controller_serving_s` until it has created a topic (its metadata log replayed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from typing import Any

from bench.harness import BenchCluster
from bench.harness import Progress
from bench.harness import common_args
from bench.harness import int_list
from bench.harness import percentile
from bench.harness import process_cpu_seconds
from bench.harness import report
from bench.harness import run
from bench.harness import wait_full_isr
from broker.config import BrokerConfig
from broker.storage.partition_metadata import PARTITION_METADATA
from client.admin import AsyncAdmin
from client.admin import NewTopic
from client.producer import AsyncProducer
from tests.integration.cluster import Cluster
from tests.integration.cluster import open_fds
from tests.integration.cluster import rss_bytes

NAME = "scale"
TOPIC = "bench-scale"
RECORD_SIZE = 100
BATCH_BYTES = 16 * 1024
FAILOVER_TIMEOUT_S = 120.0
IN_FLIGHT_BATCHES = 64  # send_batch() futures outstanding at once, over all partitions
# The brokers' replica.lag.time.max.ms (their default, which the bench keeps).
REPLICA_LAG_S = BrokerConfig.__dataclass_fields__["replica_lag_time_max_ms"].default / 1000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument(
        "--partitions",
        type=int_list,
        help="partition counts, one cluster each [10,100,1000,10000; quick 10,100]",
    )
    p.add_argument("--idle-seconds", type=float, help="idle CPU window [5; quick 2]")
    p.add_argument("--produce-seconds", type=float, help="produce phase [4; quick 2]")
    p.add_argument(
        "--session-timeout-ms", type=int, default=4000, help="controller session timeout [4000]"
    )
    return p


def _ready_timeout_s(partitions: int) -> float:
    # A broker creates a replica's log in ~19 ms here (six fsyncs), three brokers
    # sharing one disk: ~25 s per 1,000 partitions seen. Give 2x.
    return max(30.0, partitions * 0.05)


def _replicas_with_roles(cluster: BenchCluster) -> int:
    """The fewest replicas of the topic any broker has taken its role for: the
    directory is made first, for the whole delta, and each replica's
    `partition.metadata` (its topic id) is written as the broker leads or follows it.
    Counting directories let the idle window start while brokers were still taking
    thousands of roles (49.8-53.2% "idle" at 10,000 partitions in 4 of 7 runs)."""
    prefix = f"{TOPIC}-"
    return min(
        sum(
            1
            for e in os.scandir(b.data_dir)
            if e.name.startswith(prefix) and os.path.exists(f"{e.path}/{PARTITION_METADATA}")
        )
        for b in cluster.cluster.brokers.values()
    )


async def _describe_leaders(admin: AsyncAdmin) -> list[int]:
    (desc,) = await admin.describe_topics([TOPIC], include_offsets=False)
    return [p.leader for p in desc.partitions]


async def _measure_produce(bootstrap: str, partitions: int, seconds: float) -> dict[str, Any]:
    producer = AsyncProducer(
        bootstrap, acks="all", batch_size=BATCH_BYTES, linger_ms=0, buffer_memory=64 * 2**20
    )
    await producer.start()
    try:
        await producer.partitions_for(TOPIC)
        value = os.urandom(RECORD_SIZE)
        latencies: list[float] = []
        failures: list[BaseException] = []
        pending: set[asyncio.Future[Any]] = set()
        sent = 0
        partition = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            batch = producer.create_batch()
            while batch.append(value=value) is not None:
                pass
            count = batch.record_count()
            t0 = time.perf_counter()
            future = await producer.send_batch(batch, TOPIC, partition=partition)
            future.add_done_callback(
                lambda f, t0=t0: (
                    failures.append(f.exception())  # type: ignore[arg-type]
                    if f.exception() is not None
                    else latencies.append(time.perf_counter() - t0)
                )
            )
            pending.add(future)
            future.add_done_callback(pending.discard)
            sent += count
            partition = (partition + 1) % partitions
            if len(pending) >= IN_FLIGHT_BATCHES:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.wait(pending, timeout=60)
        elapsed = time.perf_counter() - start
        if failures or pending or not latencies:
            first = failures[0] if failures else "not acknowledged within 60 s"
            raise RuntimeError(f"{len(failures) + len(pending)} batches failed: {first}")
        latencies.sort()
        return {
            "produce_mb_s": round(sent * RECORD_SIZE / elapsed / 1e6, 1),
            "ack_p99_ms": round(percentile(latencies, 99) * 1000, 1),
        }
    finally:
        await producer.close()


def measure_size(partitions: int, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    row: dict[str, Any] = {"partitions": partitions}
    with BenchCluster(
        3, session_timeout_ms=args.session_timeout_ms, keep_data=args.keep_data
    ) as cluster:
        brokers = cluster.cluster.brokers
        progress.update(f"{partitions:,} partitions: creating")
        t0 = time.perf_counter()
        run(_create(cluster, partitions))
        row["create_s"] = round(time.perf_counter() - t0, 2)
        # The metadata has every ISR at once; the brokers create the logs after it.
        deadline = t0 + _ready_timeout_s(partitions)
        while _replicas_with_roles(cluster) < partitions:  # RF 3 on 3 brokers: all on each
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{partitions} replicas not created on every broker in bound")
            time.sleep(0.2)
        row["replicas_created_s"] = round(time.perf_counter() - t0, 2)
        if row["replicas_created_s"] > REPLICA_LAG_S / 2:
            # The brokers took their roles late and not together (each creates its
            # replicas first): followers that started fetching more than the lag limit
            # after their leader left its ISR, and rejoin it. Measure once it settled:
            # one lag window after the last replica, then a full ISR again.
            progress.update(f"{partitions:,} partitions: ISR settling")
            time.sleep(REPLICA_LAG_S + 1)
            run(_wait_full_isr(cluster, partitions))
        row["isr_settled_s"] = round(time.perf_counter() - t0, 2)

        progress.update(f"{partitions:,} partitions: idle")
        time.sleep(2.0)  # let the followers' first fetches and the ISR settle
        before = {n: process_cpu_seconds(b.pid) for n, b in brokers.items()}
        time.sleep(args.idle_seconds)
        used = {n: process_cpu_seconds(b.pid) - before[n] for n, b in brokers.items()}
        row["idle_core_pct"] = round(max(used.values()) / args.idle_seconds * 100, 2)
        row["idle_us_per_partition"] = round(
            sum(used.values()) / args.idle_seconds / partitions * 1e6, 2
        )
        row["rss_mb"] = round(max(rss_bytes(b.pid) for b in brokers.values()) / 1e6, 1)
        row["fds"] = max(len(open_fds(b.pid)) for b in brokers.values())

        progress.update(f"{partitions:,} partitions: produce")
        row.update(run(_measure_produce(cluster.bootstrap, partitions, args.produce_seconds)))

        progress.update(f"{partitions:,} partitions: failover")
        row.update(run(_failover(cluster, partitions)))

        progress.update(f"{partitions:,} partitions: controller restart")
        row.update(run(_controller_restart(cluster)))
    return row


async def _wait_full_isr(cluster: BenchCluster, partitions: int) -> None:
    async with AsyncAdmin(cluster.bootstrap) as admin:
        await wait_full_isr(admin, TOPIC, 3, timeout_s=_ready_timeout_s(partitions))


async def _create(cluster: BenchCluster, partitions: int) -> None:
    timeout_s = _ready_timeout_s(partitions)
    async with AsyncAdmin(cluster.bootstrap, request_timeout_ms=int(timeout_s * 1000)) as admin:
        # One attempt with the whole bound: a retried CreateTopics would only be told
        # the topic exists.
        await admin.create_topics(
            [NewTopic(TOPIC, partitions, 3)], timeout_ms=int(timeout_s * 1000)
        )
        await wait_full_isr(admin, TOPIC, 3, timeout_s=_ready_timeout_s(partitions))


async def _failover(cluster: BenchCluster, partitions: int) -> dict[str, Any]:
    async with AsyncAdmin(cluster.bootstrap) as admin:
        leaders = await _describe_leaders(admin)
        victim, led = Counter(leaders).most_common(1)[0]
        others = ",".join(
            f"{b.host}:{b.port}" for n, b in cluster.cluster.brokers.items() if n != victim
        )
    t_kill = time.perf_counter()
    cluster.cluster.brokers[victim].kill()
    async with AsyncAdmin(others) as admin:
        deadline = t_kill + FAILOVER_TIMEOUT_S
        last: str = "no answer yet"
        while True:
            try:
                now_leaders = await _describe_leaders(admin)
                stuck = sum(1 for ld in now_leaders if ld in (victim, -1))
                last = f"{stuck} of {len(now_leaders)} partitions still without a new leader"
            except Exception as exc:  # a broker busy taking over: ask again
                now_leaders, last = [], f"{type(exc).__name__}: {exc}"
            if now_leaders and all(ld not in (victim, -1) for ld in now_leaders):
                break
            if time.perf_counter() > deadline:
                raise TimeoutError(f"broker {victim}'s partitions not moved in bound: {last}")
            await asyncio.sleep(0.05)
        failover_s = time.perf_counter() - t_kill
    t_start = time.perf_counter()
    proc = await asyncio.to_thread(cluster.restart_broker, victim, wait=False)
    # It recovers every log it holds first (unclean shutdown): beyond the usual 30 s.
    await asyncio.to_thread(Cluster.wait_ready, proc, _ready_timeout_s(partitions))
    restart_s = time.perf_counter() - t_start
    async with AsyncAdmin(cluster.bootstrap) as admin:
        await wait_full_isr(admin, TOPIC, 3, timeout_s=_ready_timeout_s(partitions))
    return {
        "led_by_victim": led,
        "failover_s": round(failover_s, 2),
        "broker_restart_s": round(restart_s, 2),
        "isr_back_s": round(time.perf_counter() - t_start, 2),
    }


async def _controller_restart(cluster: BenchCluster) -> dict[str, Any]:
    controller = cluster.cluster.controller
    assert controller is not None, "the bench cluster has one controller"
    controller.kill()
    t0 = time.perf_counter()
    await asyncio.to_thread(
        cluster.cluster.start_controller, session_timeout_ms=cluster.session_timeout_ms
    )
    listening_s = time.perf_counter() - t0
    async with AsyncAdmin(cluster.bootstrap) as admin:
        deadline = t0 + FAILOVER_TIMEOUT_S
        while True:
            try:
                await admin.create_topic("bench-scale-probe", 1, 1, {})
                break
            except Exception:
                if time.perf_counter() > deadline:
                    raise
                await asyncio.sleep(0.05)
    return {
        "controller_restart_s": round(listening_s, 2),
        "controller_serving_s": round(time.perf_counter() - t0, 2),
    }


COLUMNS = [
    "partitions",
    "create s",
    "replicas created s",
    "idle % core",
    "idle us/partition/s",
    "RSS MB",
    "fds",
    "produce MB/s",
    "ack p99 ms",
    "led by killed",
    "failover s",
    "broker restart s",
    "ISR back s",
    "controller restart s",
    "controller serving s",
]
KEYS = [
    "partitions",
    "create_s",
    "replicas_created_s",
    "idle_core_pct",
    "idle_us_per_partition",
    "rss_mb",
    "fds",
    "produce_mb_s",
    "ack_p99_ms",
    "led_by_victim",
    "failover_s",
    "broker_restart_s",
    "isr_back_s",
    "controller_restart_s",
    "controller_serving_s",
]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.partitions is None:
        args.partitions = [10, 100] if args.quick else [10, 100, 1000, 10000]
    if args.idle_seconds is None:
        args.idle_seconds = 2.0 if args.quick else 5.0
    if args.produce_seconds is None:
        args.produce_seconds = 2.0 if args.quick else 4.0
    progress = Progress(len(args.partitions), NAME)
    rows = []
    for size in args.partitions:
        try:
            rows.append(measure_size(size, args, progress))
        except (TimeoutError, RuntimeError, AssertionError) as exc:
            # A size that fails a bound is a finding: recorded, the other sizes still run.
            rows.append({"partitions": size, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"bench scale: {size:,} partitions: {rows[-1]['error']}", file=sys.stderr)
        progress.step(f"{size:,} partitions done")
    table = [[row.get(k, "-") for k in KEYS] for row in rows]
    extra = {"session_timeout_ms": args.session_timeout_ms, "replication_factor": 3}
    report(NAME, args, progress, COLUMNS, table, rows, **extra)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
