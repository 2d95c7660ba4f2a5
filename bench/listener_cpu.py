"""Broker CPU per request on a Kafka listener against the native listener, for the
same requests: `python -m bench listener-cpu` (issue 15: within 10%).

One broker, one partition (RF 1). The same Produce requests (one batch of
`--batch-size` bytes of 100-byte records, acks=1) and then the same Fetch requests
(the partition from offset 0, up to `--fetch-bytes`) go to the broker over raw sockets,
`--in-flight` pipelined, once in minibroker's protocol (MessagePack bodies) and once
in Apache Kafka's (Produce v8, Fetch v12, this project's codec). For each: the broker's
CPU (utime + stime from /proc) per request over `--requests` requests, after a
warm-up, in alternating rounds; the median of the rounds and Kafka's over native.
What differs between the two is only the wire codec: the handlers are the same.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.harness import BenchCluster
from bench.harness import KiB
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import format_table
from bench.harness import process_cpu_seconds
from bench.harness import run
from bench.harness import write_results
from protocol.connection import ClientConnection
from protocol.kafka.apis import FETCH
from protocol.kafka.apis import PRODUCE
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchTopic
from protocol.messages import Message
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic

NAME = "listener-cpu"
TOPIC = "listener-cpu"
WARM_UP = 200
KAFKA_VERSIONS = {"produce": (PRODUCE, 8), "fetch": (FETCH, 12)}


def requests(kind: str, batch: bytes, fetch_bytes: int) -> Message:
    if kind == "produce":
        partition = ProducePartition(index=0, records=memoryview(batch))
        return ProduceRequest(
            acks=1, timeout_ms=10_000, topics=[ProduceTopic(name=TOPIC, partitions=[partition])]
        )
    fetch = FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=fetch_bytes)
    return FetchRequest(
        max_wait_ms=0, max_bytes=fetch_bytes, topics=[FetchTopic(topic=TOPIC, partitions=[fetch])]
    )


async def send_native(address: tuple[str, int], body: Message, count: int, in_flight: int) -> None:
    reader, writer = await asyncio.open_connection(*address)
    conn = ClientConnection("bench")
    try:
        await _pipeline(
            count,
            in_flight,
            lambda: writer.write(conn.send_request(body)[1]),
            lambda data: len(conn.receive_data(data)),
            reader,
            writer,
        )
    finally:
        writer.close()


async def send_kafka(
    address: tuple[str, int], api: KafkaApi, version: int, body: Message, count: int, in_flight: int
) -> None:
    reader, writer = await asyncio.open_connection(*address)
    frame = encode_request(api, version, 1, "bench", body)
    try:
        sent = done = 0
        while done < count:
            while sent < count and sent - done < in_flight:
                writer.write(frame)
                sent += 1
            await writer.drain()
            # Frame by frame, as a Kafka client reads (no re-buffering of big answers).
            size = int.from_bytes(await reader.readexactly(4), "big")
            decode_response(api, version, await reader.readexactly(size))
            done += 1
    finally:
        writer.close()


async def _pipeline(
    count: int,
    in_flight: int,
    send: Callable[[], None],
    answered: Callable[[bytes], int],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    sent = done = 0
    while done < count:
        while sent < count and sent - done < in_flight:
            send()
            sent += 1
        await writer.drain()
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the connection")
        done += answered(data)


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    batch, records = build_batch(100, args.batch_size * KiB)
    rows: list[dict[str, Any]] = []
    with BenchCluster(1, kafka=True, keep_data=args.keep_data) as cluster:
        await cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
        broker = cluster.cluster.brokers[1]
        native = (broker.host, broker.port)
        kafka = (broker.host, broker.kafka_port)
        for kind in ("produce", "fetch"):
            body = requests(kind, batch, args.fetch_bytes * KiB)
            api, version = KAFKA_VERSIONS[kind]

            async def native_run(n: int, body: Message = body) -> None:
                await send_native(native, body, n, args.in_flight)

            async def kafka_run(n: int, body: Message = body, api=api, version=version) -> None:
                await send_kafka(kafka, api, version, body, n, args.in_flight)

            for warm_up in (native_run, kafka_run):
                await warm_up(WARM_UP)
            per: dict[str, list[float]] = {"native": [], "kafka": []}
            for _ in range(args.rounds):
                for protocol, go in (("native", native_run), ("kafka", kafka_run)):
                    before = process_cpu_seconds(broker.pid)
                    await go(args.requests)
                    used = process_cpu_seconds(broker.pid) - before
                    per[protocol].append(used / args.requests * 1e6)
            native_us = statistics.median(per["native"])
            kafka_us = statistics.median(per["kafka"])
            rows.append(
                {
                    "request": kind,
                    "records_per_request": records,
                    "native_us": round(native_us, 1),
                    "kafka_us": round(kafka_us, 1),
                    "kafka_over_native": round(kafka_us / native_us, 3),
                    "rounds": {k: [round(v, 1) for v in vs] for k, vs in per.items()},
                }
            )
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench {NAME}", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--batch-size", type=int, default=16, help="KiB per produced batch [16]")
    p.add_argument("--fetch-bytes", type=int, default=1024, help="KiB per fetch at most [1024]")
    p.add_argument("--requests", type=int, default=2_000, help="requests per round [2000]")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds [3]")
    p.add_argument("--in-flight", type=int, default=8, help="pipelined requests [8]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.requests, args.rounds = min(args.requests, 300), 1
    started = time.monotonic()
    rows = run(measure(args))
    print(
        format_table(
            ["request", "records", "native us", "kafka us", "kafka / native"],
            [
                [
                    r["request"],
                    r["records_per_request"],
                    r["native_us"],
                    r["kafka_us"],
                    r["kafka_over_native"],
                ]
                for r in rows
            ],
        )
    )
    write_results(NAME, args=args, rows=rows, started=started, out=args.out)
    return 0
