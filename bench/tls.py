"""`python -m bench tls`: what TLS costs (issue 18). Target: TLS costs at most 25% of
plaintext throughput for 1 MiB batches.

One broker with four listeners: native PLAINTEXT and SSL, Kafka-protocol KAFKA and
KAFKA_SSL (a certificate from a throwaway CA, TLS 1.3), pinned to one CPU and this
process to the others (`--no-pin`: not). Each round, for each client and protocol, a
fresh topic of one partition (RF 1): `--mib` MiB written in `--batch-kib` batches
(acks=1), then read back whole; rounds alternate which protocol goes first. Clients:

- minibroker: its own client library on the native listeners, raw Produce (4 in
  flight) and raw Fetch of whole batches (one at a time): no per-record work, TLS by
  the event loop's SSL transport in Python;
- librdkafka: confluent-kafka on the Kafka listeners, a Producer of 16 KiB messages
  and an assigned Consumer (clock from its first message): a C client, TLS in its
  threads, with its own pipelining.

Per client, direction and protocol: MB/s and the broker's CPU (utime + stime from
/proc) per MB, medians of the rounds, and SSL / PLAINTEXT against the target. What
differs between the protocols is TLS: encryption on both ends, and on the broker the
copies through a memory BIO (runtime/tls.py) instead of the scatter-gather write of a
plaintext answer.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import BenchCluster
from bench.harness import KiB
from bench.harness import MiB
from bench.harness import RawFetcher
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import format_table
from bench.harness import pin
from bench.harness import process_cpu_seconds
from bench.harness import raw_fill
from bench.harness import run
from bench.harness import write_results
from client.cluster import ClusterClient
from client.security import create_ssl_context
from client.throwaway_ca import ThrowawayCA
from tests.integration.cluster import _BROKER_READY

NAME = "tls"
TARGET_RATIO = 0.75  # TLS at least 75% of plaintext: it costs at most 25%
PROTOCOLS = ("PLAINTEXT", "SSL")
CLIENTS = ("minibroker", "librdkafka")
# The broker's four listeners: each protocol, native and Kafka's.
LISTENERS = {
    ("minibroker", "PLAINTEXT"): "PLAINTEXT",
    ("minibroker", "SSL"): "SSL",
    ("librdkafka", "PLAINTEXT"): "KAFKA",
    ("librdkafka", "SSL"): "KAFKA_SSL",
}
_LISTENER = re.compile(r"\b([A-Z_]+)://([\w.-]+):(\d+)")
KAFKA_MESSAGE_BYTES = 16 * KiB  # few produce() calls: the Python side of the C client is cheap


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench {NAME}", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--mib", type=int, default=512, help="MiB written per listener per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds [3]")
    p.add_argument("--batch-kib", type=int, default=1024, help="KiB per batch [1024]")
    p.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated, of {', '.join(CLIENTS)} [both]",
    )
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave CPUs to the scheduler")
    return p


class Phase:
    """Wall time and the broker's CPU time (utime + stime from /proc) of one phase."""

    def __init__(self, broker_pid: int) -> None:
        self.pid = broker_pid

    def __enter__(self) -> Phase:
        self.cpu = process_cpu_seconds(self.pid)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.started
        self.cpu_s = process_cpu_seconds(self.pid) - self.cpu

    def row(self, nbytes: int) -> dict[str, float]:
        return {
            "mb_per_s": nbytes / self.wall_s / 1e6,
            "broker_cpu_ms_per_mb": self.cpu_s * 1e3 / (nbytes / 1e6),
        }


async def minibroker_client(
    bootstrap: str, tls: dict[str, Any], topic: str, batch: bytes, total: int, broker_pid: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Raw Produce of copies of `batch` (4 in flight), then raw Fetch of whole batches
    (one at a time): what minibroker's client library does at its fastest."""
    client = ClusterClient(bootstrap, client_id=f"bench-{NAME}", **tls)
    await client.bootstrap()
    try:
        await client.wait_for_topics([topic], timeout_ms=10_000)
        with Phase(broker_pid) as write:
            written = await raw_fill(client, topic, 1, batch, total)
        fetcher = RawFetcher(client, topic, 1, len(batch))
        read = 0
        with Phase(broker_pid) as reading:
            while True:
                nbytes, _ = await fetcher.fetch_round()
                read += nbytes
                if nbytes == 0:
                    break
        return write.row(written), reading.row(read)
    finally:
        await client.close()


def kafka_consumer_config(common: dict[str, str], batch_bytes: int) -> dict[str, Any]:
    """The bench's librdkafka Consumer: a batch per partition per Fetch, and no
    second-long pause when its local queue is full (below)."""
    return {
        **common,
        "group.id": f"bench-{NAME}",
        "enable.auto.commit": False,
        "fetch.max.bytes": 4 * batch_bytes,
        "max.partition.fetch.bytes": batch_bytes,
        # When its local queue is over queued.max.messages.kbytes (64 MiB), librdkafka
        # holds the next Fetch for fetch.queue.backoff.ms, 1 s by default: a whole
        # second of a 0.7 s read, whenever the consuming thread falls 64 MiB behind the
        # fetcher (a busy CPU). That hit the faster protocol most: plaintext reads
        # slower than SSL (bench/README.md, "Issue 18"). 10 ms keeps the bound, not
        # the stall.
        "fetch.queue.backoff.ms": 10,
    }


def librdkafka_client(
    bootstrap: str, tls: dict[str, str], topic: str, batch_bytes: int, total: int, broker_pid: int
) -> tuple[dict[str, float], dict[str, float]]:
    """confluent-kafka (librdkafka, C) on a Kafka listener: a Producer of
    KAFKA_MESSAGE_BYTES messages in batches of `batch_bytes` (acks=1), then a Consumer
    of the partition from the start (assigned, no group), with librdkafka's own
    pipelining and prefetch: its encryption and decryption run in C threads."""
    import confluent_kafka  # the bench's C client: installed with the test tools

    common = {"bootstrap.servers": bootstrap, **tls}
    producer = confluent_kafka.Producer(
        {
            **common,
            "acks": 1,
            "linger.ms": 5,
            "batch.size": batch_bytes,
            "message.max.bytes": batch_bytes + 64 * KiB,
            "queue.buffering.max.kbytes": 4 * batch_bytes // KiB,
        }
    )
    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    value = bytes(KAFKA_MESSAGE_BYTES)
    count = max(1, total // len(value))
    producer.list_topics(topic, timeout=10)  # connected before the clock starts
    with Phase(broker_pid) as write:
        for _ in range(count):
            while True:
                try:
                    producer.produce(topic, value, partition=0, on_delivery=delivered)
                    break
                except BufferError:  # its queue is full: let batches go out
                    producer.poll(0.005)
            producer.poll(0)
        left = producer.flush(60)
    if failed or left:
        raise RuntimeError(f"librdkafka produce: {len(failed)} failed ({failed[:1]}), {left} left")
    written = count * len(value)
    consumer = confluent_kafka.Consumer(kafka_consumer_config(common, batch_bytes))

    def consume(wanted: int) -> int:
        # It waits until it has all it asks for: never ask more than is left.
        nbytes = 0
        for msg in consumer.consume(min(1000, wanted), timeout=10):
            if msg.error() is not None:
                raise RuntimeError(f"librdkafka consume: {msg.error()}")
            nbytes += len(msg)
        return nbytes

    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        first = consume(1)  # connected and fetching before the clock starts
        read = 0
        with Phase(broker_pid) as reading:
            while first + read < written:
                read += consume((written - first - read) // len(value))
    finally:
        consumer.close()
    return write.row(written), reading.row(read)


async def measure(args: argparse.Namespace, ca: ThrowawayCA) -> list[dict[str, Any]]:
    cert = ca.issue("broker", hosts=["127.0.0.1", "localhost"])
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        raise SystemExit(f"--clients: {', '.join(unknown)}: choose from {', '.join(CLIENTS)}")
    broker_args = [
        "--listeners",
        ",".join(f"{name}://127.0.0.1:0" for name in LISTENERS.values()),
        *("--kafka-listeners", "KAFKA,KAFKA_SSL"),
        "--listener-security-protocol-map",
        ",".join(f"{name}:{proto}" for (_, proto), name in LISTENERS.items()),
        *("--ssl-certfile", str(cert.certfile), "--ssl-keyfile", str(cert.keyfile)),
    ]
    batch, _ = build_batch(KiB, args.batch_kib * KiB)
    total = args.mib * MiB
    per: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    with BenchCluster(1, broker_args=broker_args, keep_data=args.keep_data) as cluster:
        broker = cluster.cluster.brokers[1]
        started_line = _BROKER_READY.search(broker.log_text())
        assert started_line is not None, "the broker did not log its listeners"
        address = {m[1]: f"{m[2]}:{m[3]}" for m in _LISTENER.finditer(started_line[0])}
        if args.pin:
            print(pin(broker.pid))
        native_tls = {
            "security_protocol": "SSL",
            "ssl_context": create_ssl_context(cafile=ca.cafile),
        }
        kafka_tls = {"security.protocol": "SSL", "ssl.ca.location": str(ca.cafile)}
        for round_ in range(args.rounds):
            order = list(PROTOCOLS) if round_ % 2 == 0 else list(reversed(PROTOCOLS))
            for client in clients:
                for proto in order:
                    topic = f"{NAME}-{client}-{proto.lower()}-{round_}"
                    await cluster.create_topic(topic, partitions=1, replication_factor=1)
                    bootstrap = address[LISTENERS[client, proto]]
                    if client == "minibroker":
                        rows = await minibroker_client(
                            bootstrap,
                            native_tls if proto == "SSL" else {},
                            topic,
                            batch,
                            total,
                            broker.pid,
                        )
                    else:
                        rows = await asyncio.to_thread(
                            librdkafka_client,
                            bootstrap,
                            kafka_tls if proto == "SSL" else {},
                            topic,
                            len(batch),
                            total,
                            broker.pid,
                        )
                    for direction, row in zip(("write", "read"), rows, strict=True):
                        per.setdefault((client, direction, proto), []).append(row)
                    await cluster.delete_topic(topic)
    return summarize(per, clients, args)


def summarize(
    per: dict[tuple[str, str, str], list[dict[str, float]]],
    clients: list[str],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    rows = []
    for client in clients:
        for direction in ("write", "read"):
            row: dict[str, Any] = {
                "client": client,
                "direction": direction,
                "batch_kib": args.batch_kib,
            }
            for proto in PROTOCOLS:
                rounds = per[client, direction, proto]
                for key in ("mb_per_s", "broker_cpu_ms_per_mb"):
                    values = [r[key] for r in rounds]
                    row[f"{proto.lower()}_{key}"] = round(statistics.median(values), 3)
                    row[f"{proto.lower()}_{key}_rounds"] = [round(v, 3) for v in values]
            ratio = row["ssl_mb_per_s"] / row["plaintext_mb_per_s"]
            row["ssl_over_plaintext"] = round(ratio, 3)
            row["target_met"] = ratio >= TARGET_RATIO
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.mib, args.rounds = min(args.mib, 16), 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="minibroker-bench-tls-") as tmp:
        rows = run(measure(args, ThrowawayCA.create(Path(tmp))))
    print(
        format_table(
            [
                "client",
                "direction",
                "PLAINTEXT MB/s",
                "SSL MB/s",
                "SSL / PLAINTEXT",
                "target",
                "broker CPU ms/MB PLAINTEXT",
                "SSL",
            ],
            [
                [
                    r["client"],
                    r["direction"],
                    r["plaintext_mb_per_s"],
                    r["ssl_mb_per_s"],
                    r["ssl_over_plaintext"],
                    f">= {TARGET_RATIO} {'met' if r['target_met'] else 'MISSED'}",
                    r["plaintext_broker_cpu_ms_per_mb"],
                    r["ssl_broker_cpu_ms_per_mb"],
                ]
                for r in rows
            ],
        )
    )
    write_results(NAME, args=args, rows=rows, started=started, out=args.out)
    return 0
