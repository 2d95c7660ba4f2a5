"""Broker CPU per request on a Kafka listener against the native listener, for the
same requests: `python -m bench listener-cpu` (issue 15: within 10%).

One broker, one partition (RF 1). The same Produce requests (one batch of
`--batch-size` bytes of 100-byte records, acks=1) and then the same Fetch requests
(the partition from offset 0, up to `--fetch-bytes`) go to the broker over raw sockets,
`--in-flight` pipelined, once in minibroker's protocol (MessagePack bodies) and once
in Apache Kafka's (Produce v8, Fetch v12, this project's codec). For each: the broker's
CPU (utime + stime from /proc) per request over `--requests` requests (more, in
steps of it, until the broker used 0.1 s: /proc counts 10 ms ticks), after a
warm-up, in alternating rounds; the median of the rounds and Kafka's over native.
What differs between the two is only the wire codec: the handlers are the same.
With two CPUs or more the broker is pinned to one and this process to another
(`--no-pin` leaves them to the scheduler), so the two do not steal each other's time.

Then the codecs alone, in process (no network, no broker): per request, the decode
of the request and the encode of its answer (a produce answer; a fetch answer of
`--fetch-bytes` of records), microseconds, best of `--codec-repeats` repeats of
`--codec-calls` calls each; the difference between the protocols is the part of the
broker's CPU per request the Kafka listener adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit
from typing import Any

from bench.harness import BenchCluster
from bench.harness import KiB
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import format_table
from bench.harness import pin
from bench.harness import process_cpu_seconds
from bench.harness import run
from bench.harness import write_results
from protocol.connection import NATIVE
from protocol.connection import ClientConnection
from protocol.kafka.apis import FETCH
from protocol.kafka.apis import PRODUCE
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import KAFKA
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import FetchTopicResponse
from protocol.messages import Message
from protocol.messages import ProducePartition
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.messages import ProduceTopicResponse

NAME = "listener-cpu"
TOPIC = "listener-cpu"
WARM_UP = 200
MIN_MEASURED_CPU_S = 0.1  # ten of /proc's 10 ms clock ticks
MAX_STEPS = 20  # --requests steps per round, at most
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


def answers(kind: str, fetch_bytes: int) -> Message:
    """What the broker answers `requests(kind)` with: a produce ack, a full fetch."""
    if kind == "produce":
        partition = ProducePartitionResponse(index=0, base_offset=1_000, log_start_offset=0)
        return ProduceResponse(topics=[ProduceTopicResponse(name=TOPIC, partitions=[partition])])
    fetched = FetchPartitionResponse(
        partition_index=0,
        high_watermark=1_000_000,
        last_stable_offset=1_000_000,
        log_start_offset=0,
        records=memoryview(bytes(fetch_bytes)),
    )
    topic = FetchTopicResponse(topic=TOPIC, partitions=[fetched])
    return FetchResponse(responses=[topic])


def measure_codecs(args: argparse.Namespace, batch: bytes) -> list[dict[str, Any]]:
    """Each protocol's decode of a request and encode of its answer, in process."""
    return [codec_row(args, kind, batch) for kind in ("produce", "fetch")]


def codec_row(args: argparse.Namespace, kind: str, batch: bytes) -> dict[str, Any]:
    body = requests(kind, batch, args.fetch_bytes * KiB)
    answer = answers(kind, args.fetch_bytes * KiB)
    api, version = KAFKA_VERSIONS[kind]
    native_payload = ClientConnection("bench").send_request(body)[1][4:]
    native_header = NATIVE.decode_request(native_payload, None).header
    kafka_payload = encode_request(api, version, 1, "bench", body)[4:]
    kafka_header = KAFKA.decode_request(kafka_payload, None).header
    cases = {
        "native_decode": lambda: NATIVE.decode_request(native_payload, None),
        "kafka_decode": lambda: KAFKA.decode_request(kafka_payload, None),
        "native_encode": lambda: NATIVE.encode_response(native_header, answer),
        "kafka_encode": lambda: KAFKA.encode_response(kafka_header, answer),
    }
    row: dict[str, Any] = {"codec_alone": kind}
    for name, call in cases.items():
        best = min(timeit.repeat(call, number=args.codec_calls, repeat=args.codec_repeats))
        row[f"{name}_us"] = round(best / args.codec_calls * 1e6, 2)
    kafka = row["kafka_decode_us"] + row["kafka_encode_us"]
    row["kafka_extra_us"] = round(kafka - row["native_decode_us"] - row["native_encode_us"], 2)
    return row


class FrameCounter:
    """Counts length-prefixed answer frames in a byte stream without keeping them:
    both protocols' answers are drained the same way, as fast as the socket gives
    them, so the broker's CPU is what differs, not how the bench reads."""

    def __init__(self) -> None:
        self._header = b""  # the start of a frame length cut by a read
        self._left = 0  # bytes of the current frame still to come

    def feed(self, data: bytes) -> int:
        frames, at = 0, 0
        while at < len(data):
            if self._left:
                taken = min(self._left, len(data) - at)
                self._left -= taken
                at += taken
                frames += self._left == 0
                continue
            need = 4 - len(self._header)
            self._header += data[at : at + need]
            at += need
            if len(self._header) == 4:
                self._left = int.from_bytes(self._header, "big")
                self._header = b""
                assert self._left > 0, "an empty answer frame"
        return frames


async def send_frames(address: tuple[str, int], frame: bytes, count: int, in_flight: int) -> None:
    """`count` copies of a request frame, `in_flight` pipelined; waits for every answer."""
    reader, writer = await asyncio.open_connection(*address)
    counter = FrameCounter()
    try:
        sent = done = 0
        while done < count:
            while sent < count and sent - done < in_flight:
                writer.write(frame)
                sent += 1
            await writer.drain()
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("the broker closed the connection")
            done += counter.feed(data)
    finally:
        writer.close()


async def check_native(address: tuple[str, int], body: Message) -> None:
    """One request whose answer is decoded: the measured ones are answered, not refused."""
    reader, writer = await asyncio.open_connection(*address)
    conn = ClientConnection("bench")
    try:
        writer.write(conn.send_request(body)[1])
        responses: list[Any] = []
        while not responses:
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("the broker closed the connection")
            responses = conn.receive_data(data)
        assert responses[0].error_code == 0, responses[0]
        assert_served(responses[0].body)
    finally:
        writer.close()


async def check_kafka(address: tuple[str, int], api: KafkaApi, version: int, body: Message) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(encode_request(api, version, 1, "bench", body))
        size = int.from_bytes(await reader.readexactly(4), "big")
        assert_served(decode_response(api, version, await reader.readexactly(size))[1])
    finally:
        writer.close()


def assert_served(answer: Any) -> None:
    if isinstance(answer, ProduceResponse):
        partition = answer.topics[0].partitions[0]
        assert partition.error_code == 0, partition
    else:
        assert isinstance(answer, FetchResponse), answer
        partition = answer.responses[0].partitions[0]
        assert partition.error_code == 0 and len(partition.records) > 0, partition


async def cpu_per_request(
    pid: int, address: tuple[str, int], frame: bytes, args: argparse.Namespace
) -> float:
    """The broker's CPU microseconds per request. /proc counts CPU in clock ticks (10 ms):
    requests go on in `--requests` steps until the broker has used MIN_MEASURED_CPU_S
    (a tick is then at most a tenth of it), MAX_STEPS steps at most."""
    before = process_cpu_seconds(pid)
    sent, used = 0, 0.0
    for _ in range(MAX_STEPS):
        await send_frames(address, frame, args.requests, args.in_flight)
        sent += args.requests
        used = process_cpu_seconds(pid) - before
        if used >= MIN_MEASURED_CPU_S:
            break
    return used / sent * 1e6


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    batch, records = build_batch(100, args.batch_size * KiB)
    rows: list[dict[str, Any]] = []
    with BenchCluster(1, kafka=True, keep_data=args.keep_data) as cluster:
        await cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
        broker = cluster.cluster.brokers[1]
        if args.pin:
            print(pin(broker.pid))
        native = (broker.host, broker.port)
        kafka = (broker.host, broker.kafka_port)
        for kind in ("produce", "fetch"):
            body = requests(kind, batch, args.fetch_bytes * KiB)
            api, version = KAFKA_VERSIONS[kind]

            await check_native(native, body)
            await check_kafka(kafka, api, version, body)
            frames = {
                "native": (native, ClientConnection("bench").send_request(body)[1]),
                "kafka": (kafka, encode_request(api, version, 1, "bench", body)),
            }
            for address, frame in frames.values():
                await send_frames(address, frame, WARM_UP, args.in_flight)
            per: dict[str, list[float]] = {"native": [], "kafka": []}
            for round_ in range(args.rounds):
                order = ["native", "kafka"] if round_ % 2 == 0 else ["kafka", "native"]
                for protocol in order:
                    address, frame = frames[protocol]
                    per[protocol].append(await cpu_per_request(broker.pid, address, frame, args))
            native_us = statistics.median(per["native"])
            kafka_us = statistics.median(per["kafka"])
            rows.append(
                {
                    "request": kind,
                    "records_per_request": records,
                    "native_us": round(native_us, 1),
                    "kafka_us": round(kafka_us, 1),
                    "kafka_over_native": round(kafka_us / native_us, 3) if native_us else None,
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
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave CPUs to the scheduler")
    p.add_argument("--codec-calls", type=int, default=5_000, help="codec calls per repeat [5000]")
    p.add_argument("--codec-repeats", type=int, default=7, help="codec repeats, best kept [7]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.requests, args.rounds = min(args.requests, 300), 1
        args.codec_calls, args.codec_repeats = min(args.codec_calls, 500), 2
    started = time.monotonic()
    batch, _ = build_batch(100, args.batch_size * KiB)
    codec_rows = measure_codecs(args, batch)
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
    columns = ["native_decode_us", "kafka_decode_us", "native_encode_us", "kafka_encode_us"]
    print(
        format_table(
            ["codec alone", *[c.removesuffix("_us").replace("_", " ") for c in columns], "extra"],
            [[r["codec_alone"], *[r[c] for c in columns], r["kafka_extra_us"]] for r in codec_rows],
        )
    )
    write_results(NAME, args=args, rows=rows + codec_rows, started=started, out=args.out)
    return 0
