"""Produce throughput of the client library's AsyncProducer against a 3-broker cluster.

The matrix: replication factor 1 and 3, acks 1 and all, record sizes 100 B and 1 KiB,
batch sizes 16 KiB and 1 MiB, 1 and 4 producers. Every producer is its own process
(so four producers are not one GIL), sending `value`-only records of the cell's size
as fast as `send()` takes them for `--seconds`, then flushing. Throughput is all the
records acknowledged divided by the wall time from the first producer's start to the
last producer's flush; MB/s counts value bytes (1 MB = 10^6 B). Each cell gets a fresh
topic of `--partitions` partitions, deleted afterwards, and is checked: the sum of the
partitions' end offsets must equal the records sent (nothing lost or duplicated).

`--api batch` measures `create_batch()` / `send_batch()` instead of `send()`: each
producer fills whole batches of `batch_size` and sends them round robin over the
partitions (results in bench/results/produce-batch.json, beside send()'s).

    python -m bench produce                      # the whole matrix
    python -m bench produce --rf 3 --acks all --record-size 100 --batch-size 16384 \\
        --producers 1                            # one cell
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import queue
import sys
import time
from typing import Any

from bench.harness import THROUGHPUT_COLUMNS
from bench.harness import BenchCluster
from bench.harness import Columns
from bench.harness import KiB
from bench.harness import MiB
from bench.harness import Progress
from bench.harness import batch_column
from bench.harness import common_args
from bench.harness import int_list
from bench.harness import report
from bench.harness import run
from bench.harness import table_of
from client.admin import AsyncAdmin
from client.producer import AsyncProducer
from client.types import TopicPartition

NAME = "produce"
WORKER_START_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
YIELD_EVERY = 256  # records between yields to the loop, so the sender runs meanwhile
CLIENTS = ("minibroker", "confluent")


def _acks_list(text: str) -> list[str]:
    values = [x.strip().lower() for x in text.split(",") if x.strip()]
    for v in values:
        if v not in ("0", "1", "all", "-1"):
            raise argparse.ArgumentTypeError(f"acks must be 0, 1 or all, not {v!r}")
    return ["all" if v == "-1" else v for v in values]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench produce", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--rf", type=int_list, default=[1, 3], help="replication factors [1,3]")
    p.add_argument("--acks", type=_acks_list, default=["1", "all"], help="acks values [1,all]")
    p.add_argument(
        "--record-size", type=int_list, default=[100, KiB], help="value bytes [100,1024]"
    )
    p.add_argument(
        "--batch-size", type=int_list, default=[16 * KiB, MiB], help="batch_size [16384,1048576]"
    )
    p.add_argument("--producers", type=int_list, default=[1, 4], help="producer processes [1,4]")
    p.add_argument("--partitions", type=int, default=3, help="partitions per topic [3]")
    p.add_argument("--brokers", type=int, default=3, help="brokers in the cluster [3]")
    p.add_argument("--linger-ms", type=int, default=5, help="producer linger_ms [5]")
    p.add_argument("--seconds", type=float, help="sending time per cell [4; 1.5 with --quick]")
    p.add_argument(
        "--api",
        choices=["send", "batch"],
        default="send",
        help="send() per record, or create_batch()/send_batch() [send]",
    )
    p.add_argument(
        "--client",
        type=_client_list,
        default=["minibroker"],
        help="minibroker (AsyncProducer, native listener) and/or confluent (librdkafka "
        "through the Kafka listener), side by side in one run [minibroker]",
    )
    p.add_argument(
        "--confluent-idempotence",
        choices=["on", "off"],
        default="on",
        help="librdkafka's enable.idempotence with acks=all (minibroker's producer is always "
        "idempotent); librdkafka 2.16 keeps one produce request in flight per partition "
        "when it is on [on]",
    )
    return p


def _client_list(text: str) -> list[str]:
    clients = [c.strip() for c in text.split(",") if c.strip()]
    for client in clients:
        if client not in CLIENTS:
            raise argparse.ArgumentTypeError(f"--client: {client!r} is not one of {CLIENTS}")
    return clients


def cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for client, rf, acks, size, batch, producers in itertools.product(
        args.client, args.rf, args.acks, args.record_size, args.batch_size, args.producers
    ):
        if rf > args.brokers:
            raise SystemExit(f"--rf {rf} needs at least {rf} brokers (--brokers {args.brokers})")
        out.append(
            {
                "client": client,
                "rf": rf,
                "acks": acks,
                "record_size": size,
                "batch_size": batch,
                "producers": producers,
            }
        )
    return out


# ------------------------------------------------------------------ the producer process


def _worker(spec: dict[str, Any], ready: Any, go: Any, results: Any) -> None:
    try:
        if spec.get("client") == "confluent":
            results.put(_produce_confluent(spec, ready, go))
        else:
            results.put(run(_produce(spec, ready, go)))
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


async def _produce(spec: dict[str, Any], ready: Any, go: Any) -> dict[str, Any]:
    value = os.urandom(spec["record_size"])
    per_batch = max(1, spec["batch_size"] // (spec["record_size"] + 10))
    # Keep a future per half batch: every batch gets at least one checked.
    sample_every = max(1, per_batch // 2)
    topic = spec["topic"]
    producer = AsyncProducer(
        spec["bootstrap"],
        acks=spec["acks"],
        batch_size=spec["batch_size"],
        linger_ms=spec["linger_ms"],
        max_request_size=max(MiB, spec["batch_size"]),
        buffer_memory=max(32 * MiB, 8 * spec["batch_size"] * spec["partitions"]),
    )
    await producer.start()
    try:
        await producer.partitions_for(topic)
        ready.set()
        await asyncio.to_thread(go.wait, WORKER_START_TIMEOUT_S)
        samples: list[asyncio.Future[Any]] = []
        sent = 0
        cpu_start = time.process_time()
        started_wall = time.time()
        end = time.perf_counter() + spec["seconds"]
        if spec.get("api") == "batch":
            sent, future = await _produce_batches(producer, spec, value, end, samples)
        else:
            send = producer.send
            while time.perf_counter() < end:
                for _ in range(YIELD_EVERY):
                    future = await send(topic, value)
                    sent += 1
                    if sent % sample_every == 0:
                        samples.append(future)
                await asyncio.sleep(0)
        samples.append(future)
        await producer.flush()
        finished_wall = time.time()
        for future in samples:
            future.result()  # raises if its batch failed
        cpu = time.process_time() - cpu_start
        return {"sent": sent, "start": started_wall, "end": finished_wall, "cpu_s": cpu}
    finally:
        await producer.close()


def _produce_confluent(spec: dict[str, Any], ready: Any, go: Any) -> dict[str, Any]:
    """librdkafka through the Kafka listeners: produce() per record, a failed delivery
    fails the cell, idempotent as minibroker's producer is unless
    --confluent-idempotence off."""
    from confluent_kafka import Producer

    value = os.urandom(spec["record_size"])
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": spec["kafka_bootstrap"],
            "acks": spec["acks"],
            "enable.idempotence": spec["acks"] == "all" and spec["confluent_idempotence"],
            "linger.ms": spec["linger_ms"],
            "batch.size": spec["batch_size"],
            "message.max.bytes": max(MiB, spec["batch_size"]) + 1024,
            "queue.buffering.max.kbytes": max(32 * KiB, 8 * spec["batch_size"] // KiB),
            # Failed deliveries only reach Python (and fail the cell): a Python callback
            # per delivered record would bound the client at small records.
            "delivery.report.only.error": True,
            "on_delivery": delivered,  # once for all records, not an argument per call
        }
    )

    producer.list_topics(spec["topic"], timeout=30)
    ready.set()
    go.wait(WORKER_START_TIMEOUT_S)
    sent = 0
    cpu_start = time.process_time()
    started_wall = time.time()
    end = time.perf_counter() + spec["seconds"]
    produce = producer.produce
    while time.perf_counter() < end:
        for _ in range(YIELD_EVERY):
            while True:
                try:
                    produce(spec["topic"], value)
                    break
                except BufferError:  # librdkafka's queue is full: wait for deliveries
                    producer.poll(0.05)
            sent += 1
        producer.poll(0)
    left = producer.flush(60)
    finished_wall = time.time()
    if left or failures:
        raise RuntimeError(f"{left} undelivered, {len(failures)} failed: {failures[:3]}")
    return {
        "sent": sent,
        "start": started_wall,
        "end": finished_wall,
        "cpu_s": time.process_time() - cpu_start,
    }


async def _produce_batches(
    producer: AsyncProducer,
    spec: dict[str, Any],
    value: bytes,
    end: float,
    samples: list[asyncio.Future[Any]],
) -> tuple[int, asyncio.Future[Any]]:
    """Whole batches through send_batch(), round robin over the partitions, until
    `end`; every batch's future is kept (one per batch). Returns (records, last future)."""
    sent = 0
    partition = 0
    future: asyncio.Future[Any] | None = None
    while time.perf_counter() < end:
        batch = producer.create_batch()
        append = batch.append
        while append(value=value) is not None:
            pass
        count = batch.record_count()
        future = await producer.send_batch(batch, spec["topic"], partition=partition)
        samples.append(future)
        sent += count
        partition = (partition + 1) % spec["partitions"]
        await asyncio.sleep(0)
    assert future is not None
    return sent, future


# ------------------------------------------------------------------ one cell


def run_cell(cluster: BenchCluster, spec: dict[str, Any], index: int) -> dict[str, Any]:
    topic = f"bench-produce-{index}"
    run(cluster.create_topic(topic, partitions=spec["partitions"], replication_factor=spec["rf"]))
    ctx = multiprocessing.get_context("spawn")
    ready = [ctx.Event() for _ in range(spec["producers"])]
    go = ctx.Event()
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                {
                    **spec,
                    "topic": topic,
                    "bootstrap": cluster.bootstrap,
                    "kafka_bootstrap": cluster.kafka_bootstrap if cluster.kafka else "",
                },
                ready[i],
                go,
                results,
            ),
            daemon=True,
        )
        for i in range(spec["producers"])
    ]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        for event in ready:
            while not event.wait(0.2):
                dead = [p for p in procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"a producer did not start: {_drain_errors(results)}")
        broker_cpu = cluster.broker_cpu_seconds()
        go.set()
        outcomes = []
        wait_s = spec["seconds"] + 120
        for _ in procs:
            try:
                outcomes.append(results.get(timeout=wait_s))
            except queue.Empty:
                raise RuntimeError(f"a producer did not finish within {wait_s:.0f} s") from None
        broker_cpu = cluster.broker_cpu_seconds() - broker_cpu
        errors = [o["error"] for o in outcomes if "error" in o]
        if errors:
            raise RuntimeError("producer failed: " + "; ".join(errors))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    sent = sum(o["sent"] for o in outcomes)
    elapsed = max(o["end"] for o in outcomes) - min(o["start"] for o in outcomes)
    _, catch_up = run(_wait_log_end(cluster.bootstrap, topic, spec["partitions"], sent))
    run(cluster.delete_topic(topic))
    return {
        **spec,
        "records": sent,
        "seconds": round(elapsed, 3),
        "records_per_s": round(sent / elapsed),
        "mb_per_s": round(sent * spec["record_size"] / elapsed / 1e6, 2),
        # CPU cores busy on average (2 = both cores of this machine): who is the bottleneck.
        "client_cores": round(sum(o["cpu_s"] for o in outcomes) / elapsed, 2),
        "broker_cores": round(broker_cpu / elapsed, 2),
        # acks=1: how long the followers took to catch up after the last ack.
        "replication_catch_up_s": round(catch_up, 2),
    }


def _drain_errors(results: Any) -> str:
    errors = []
    while True:
        try:
            errors.append(str(results.get_nowait()))
        except queue.Empty:
            return "; ".join(errors) or "no error reported (it died)"


async def _wait_log_end(
    bootstrap: str, topic: str, partitions: int, sent: int
) -> tuple[int, float]:
    """Until the high watermarks add up to `sent` (with acks=1 the followers may still
    be catching up when the producers finish). Returns (total, seconds waited); raises
    when the log holds more or, after CATCH_UP_TIMEOUT_S, fewer records than sent."""
    start = time.monotonic()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    async with AsyncAdmin(bootstrap) as admin:
        while True:
            total = sum(
                o.offset for o in (await admin.list_offsets(dict.fromkeys(tps, "latest"))).values()
            )
            waited = time.monotonic() - start
            if total == sent:
                return total, waited
            if total > sent or waited > CATCH_UP_TIMEOUT_S:
                raise RuntimeError(
                    f"{topic}: sent {sent} records but the high watermarks add up to {total} "
                    f"after {waited:.1f} s"
                )
            await asyncio.sleep(0.1)


COLUMNS: Columns = {
    "client": "client",
    "rf": "rf",
    "acks": "acks",
    "record B": "record_size",
    "batch": batch_column,
    "producers": "producers",
    **THROUGHPUT_COLUMNS,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.5 if args.quick else 4.0
    matrix = cells(args)
    rows: list[dict[str, Any]] = []
    progress = Progress(len(matrix), NAME)
    kafka = "confluent" in args.client  # librdkafka speaks to the Kafka listeners
    with BenchCluster(args.brokers, keep_data=args.keep_data, kafka=kafka) as cluster:
        for i, cell in enumerate(matrix):
            label = (
                f"{cell['client']} rf={cell['rf']} acks={cell['acks']} {cell['record_size']} B "
                f"batch={cell['batch_size']} x{cell['producers']}"
            )
            progress.update(label)
            spec = {
                **cell,
                "api": args.api,
                "partitions": args.partitions,
                "linger_ms": args.linger_ms,
                "confluent_idempotence": args.confluent_idempotence == "on",
                "seconds": args.seconds,
            }
            rows.append(run_cell(cluster, spec, i))
            progress.step(label)
    name = NAME if args.api == "send" else f"{NAME}-batch"
    return report(name, args, progress, list(COLUMNS), table_of(COLUMNS, rows), rows)


if __name__ == "__main__":
    sys.exit(main())
