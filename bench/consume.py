"""Consume throughput: the client's AsyncConsumer, and a raw fetch loop (the broker's
ceiling, no record decoding), from one partition and from many.

The data: 100 B records in batches of 16 KiB and of 1 MiB, written fast by appending
copies of one encoded batch (bench.harness.raw_fill), to a one-broker cluster
(`--brokers`), replication factor 1. Every cell reads for `--seconds` from the start
of the topic:

- `client`: AsyncConsumer.poll() with every record decoded into a ConsumerRecord
  (CRC checked, as by default) - what an application gets; one pass at most; at most
  `--max-poll-records` per poll (the consumer's default 500 unless given: before
  2026-11-29 this bench used 1,000,000, which keeps a whole fetch of records alive
  per poll and made the GC's full collections half of the reader's CPU);
- `iterate`: `async for record in consumer`, a ConsumerRecord at a time (poll() with
  its default max_poll_records underneath) - the other per-record API;
- `batches`: AsyncConsumer.poll_batches(), each fetch as columns;
- `raw`: Fetch requests for all partitions at once, whole batches counted from their
  headers, never decoded; wraps around to offset 0 at the end, so it can read the
  (page-cached) data several times over.

records/s counts records; MB/s counts batch bytes on the wire (1 MB = 10^6 B).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from functools import partial
from typing import Any

from bench.harness import THROUGHPUT_COLUMNS
from bench.harness import BenchCluster
from bench.harness import Columns
from bench.harness import KiB
from bench.harness import MiB
from bench.harness import Progress
from bench.harness import RawFetcher
from bench.harness import batch_column
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import int_list
from bench.harness import raw_fill
from bench.harness import report
from bench.harness import run
from bench.harness import size_label
from bench.harness import table_of
from client.cluster import ClusterClient
from client.consumer import AsyncConsumer
from client.types import TopicPartition

NAME = "consume"
READERS = ("client", "iterate", "batches", "raw", "confluent")
RECORD_SIZE = 100


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench consume", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--partitions", type=int_list, default=[1, 8], help="partition counts [1,8]")
    p.add_argument(
        "--batch-size", type=int_list, default=[16 * KiB, MiB], help="batch bytes [16384,1048576]"
    )
    p.add_argument(
        "--reader",
        type=lambda s: [x for x in s.split(",") if x],
        default=["client", "iterate", "batches", "raw"],
        help="client (AsyncConsumer.poll), iterate (async for), batches "
        "(AsyncConsumer.poll_batches), raw (a "
        "fetch loop) and/or confluent (librdkafka through the Kafka listeners) "
        "[client,iterate,batches,raw]",
    )
    p.add_argument("--brokers", type=int, default=1, help="brokers in the cluster [1]")
    p.add_argument("--data-mib", type=int, help="MiB written per topic [256; 32 with --quick]")
    p.add_argument("--seconds", type=float, help="reading time per cell [4; 1.5 with --quick]")
    p.add_argument(
        "--partition-fetch-bytes",
        type=int,
        default=2 * MiB,
        help="max bytes per partition per fetch [2 MiB]",
    )
    p.add_argument(
        "--max-poll-records",
        type=int,
        default=500,
        help="the client reader's max_poll_records: records poll() hands out at once "
        "[500, the consumer's default, what `async for` uses]; the caller holds them "
        "until its next poll, so large values keep many records alive for the GC to scan",
    )
    return p


async def fill(
    cluster: BenchCluster, topic: str, partitions: int, batch_size: int, total: int
) -> tuple[int, float]:
    """Write about `total` bytes; returns (bytes written, wire bytes per record)."""
    await cluster.create_topic(topic, partitions=partitions, replication_factor=1)
    batch, count = build_batch(RECORD_SIZE, batch_size)
    client = ClusterClient(cluster.bootstrap, client_id="bench-fill")
    await client.bootstrap()
    try:
        return await raw_fill(client, topic, partitions, batch, total), len(batch) / count
    finally:
        await client.close()


async def read_batches(
    bootstrap: str, topic: str, partitions: int, seconds: float, fetch_bytes: int
) -> tuple[int, int, float]:
    """read_client through AsyncConsumer.poll_batches() (columns, no record objects)."""
    return await read_client(bootstrap, topic, partitions, seconds, fetch_bytes, mode="batches")


async def read_iterate(
    bootstrap: str, topic: str, partitions: int, seconds: float, fetch_bytes: int
) -> tuple[int, int, float]:
    """read_client through `async for record in consumer` (a ConsumerRecord at a time)."""
    return await read_client(bootstrap, topic, partitions, seconds, fetch_bytes, mode="iterate")


async def read_client(
    bootstrap: str,
    topic: str,
    partitions: int,
    seconds: float,
    fetch_bytes: int,
    *,
    mode: str = "poll",
    max_poll_records: int = 500,
) -> tuple[int, int, float]:
    """(records, 0, seconds) read by AsyncConsumer.poll() (`mode` "batches":
    poll_batches(); "iterate": `async for`) in one pass or `seconds` (the bytes on the
    wire are not visible through the consumer: the caller works them out)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = AsyncConsumer(
        bootstrap,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=fetch_bytes,
        max_poll_records=max_poll_records,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        total = sum(ends.values())
        records = 0
        start = time.perf_counter()
        end = start + seconds
        if mode == "iterate":
            async for _ in consumer:
                records += 1
                if records >= total or (records % 4096 == 0 and time.perf_counter() >= end):
                    break
            return records, 0, time.perf_counter() - start
        polled = consumer.poll_batches if mode == "batches" else consumer.poll
        while records < total and time.perf_counter() < end:
            for batch in (await polled(timeout_ms=500)).values():
                records += len(batch)
        return records, 0, time.perf_counter() - start
    finally:
        await consumer.close()


async def read_confluent(
    bootstrap: str, topic: str, partitions: int, seconds: float, fetch_bytes: int
) -> tuple[int, int, float]:
    """(records, 0, seconds) read by librdkafka (confluent-kafka) through the Kafka
    listeners, in one pass or `seconds`; its threads count in this process's CPU."""
    return await asyncio.to_thread(
        _read_confluent, bootstrap, topic, partitions, seconds, fetch_bytes
    )


def _read_confluent(
    bootstrap: str, topic: str, partitions: int, seconds: float, fetch_bytes: int
) -> tuple[int, int, float]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentTopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-consume",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": fetch_bytes,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        tps = [ConfluentTopicPartition(topic, p) for p in range(partitions)]
        total = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps)
        consumer.assign([ConfluentTopicPartition(topic, p, 0) for p in range(partitions)])
        records = 0
        start = time.perf_counter()
        end = start + seconds
        while records < total and time.perf_counter() < end:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if message.error() is not None:
                    raise RuntimeError(f"librdkafka: {message.error()}")
                records += 1
        return records, 0, time.perf_counter() - start
    finally:
        consumer.close()


async def read_raw(
    bootstrap: str, topic: str, partitions: int, seconds: float, fetch_bytes: int
) -> tuple[int, int, float]:
    """(records, bytes, seconds) of whole batches fetched in `seconds`."""
    client = ClusterClient(bootstrap, client_id="bench-raw-fetch")
    await client.bootstrap()
    try:
        await client.wait_for_topics([topic], timeout_ms=10_000)
        fetcher = RawFetcher(client, topic, partitions, fetch_bytes)
        records = nbytes = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            got_bytes, got_records = await fetcher.fetch_round()
            if got_bytes == 0:  # read it all: again from the start (page-cached now)
                fetcher.offsets = dict.fromkeys(fetcher.offsets, 0)
            records += got_records
            nbytes += got_bytes
        return records, nbytes, time.perf_counter() - start
    finally:
        await client.close()


COLUMNS: Columns = {
    "reader": "reader",
    "partitions": "partitions",
    "batch": batch_column,
    "records": "records",
    **THROUGHPUT_COLUMNS,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for reader in args.reader:
        if reader not in READERS:
            raise SystemExit(f"--reader: one of {', '.join(READERS)}, not {reader!r}")
    if args.seconds is None:
        args.seconds = 1.5 if args.quick else 4.0
    if args.data_mib is None:
        args.data_mib = 32 if args.quick else 256
    datasets = [(p, b) for p in args.partitions for b in args.batch_size]
    progress = Progress(len(datasets) * (1 + len(args.reader)), NAME)
    rows: list[dict[str, Any]] = []
    readers = {
        "client": partial(read_client, max_poll_records=args.max_poll_records),
        "iterate": read_iterate,
        "batches": read_batches,
        "raw": read_raw,
        "confluent": read_confluent,
    }
    kafka = "confluent" in args.reader  # librdkafka reads through the Kafka listeners
    with BenchCluster(args.brokers, keep_data=args.keep_data, kafka=kafka) as cluster:
        for i, (partitions, batch_size) in enumerate(datasets):
            topic = f"bench-consume-{i}"
            label = f"{partitions} partitions, {size_label(batch_size)} batches"
            progress.update(f"writing {args.data_mib} MiB: {label}")
            written, per_record = run(
                fill(cluster, topic, partitions, batch_size, args.data_mib * MiB)
            )
            progress.step(f"written: {label}")
            for reader in args.reader:
                progress.update(f"{reader}: {label}")
                broker_cpu, client_cpu = cluster.broker_cpu_seconds(), time.process_time()
                records, nbytes, secs = run(
                    readers[reader](
                        cluster.kafka_bootstrap if reader == "confluent" else cluster.bootstrap,
                        topic,
                        partitions,
                        args.seconds,
                        args.partition_fetch_bytes,
                    )
                )
                broker_cpu = cluster.broker_cpu_seconds() - broker_cpu
                client_cpu = time.process_time() - client_cpu
                if records == 0:
                    raise RuntimeError(f"{reader} read nothing from {topic}")
                nbytes = nbytes or round(records * per_record)
                rows.append(
                    {
                        "reader": reader,
                        "partitions": partitions,
                        "batch_size": batch_size,
                        "max_poll_records": args.max_poll_records if reader == "client" else None,
                        "record_size": RECORD_SIZE,
                        "data_bytes": written,
                        "records": records,
                        "bytes": nbytes,
                        "seconds": round(secs, 3),
                        "records_per_s": round(records / secs),
                        "mb_per_s": round(nbytes / secs / 1e6, 1),
                        # CPU cores busy on average: who is the bottleneck.
                        "client_cores": round(client_cpu / secs, 2),
                        "broker_cores": round(broker_cpu / secs, 2),
                    }
                )
                progress.step(f"{reader}: {label}")
    return report(NAME, args, progress, list(COLUMNS), table_of(COLUMNS, rows), rows)


if __name__ == "__main__":
    sys.exit(main())
