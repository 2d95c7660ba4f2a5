"""`python -m bench tls`: what TLS costs (issue 18). Target: TLS costs at most 25% of
plaintext throughput for 1 MiB batches.

One broker with two native listeners, PLAINTEXT and SSL (a certificate from a
throwaway CA, TLS 1.3), a topic of one partition, RF 1. Each round writes
`--mib` MiB of 1 MiB batches of 1 KiB records through one listener (raw Produce,
acks=1, several requests in flight: no per-record client work), then reads the whole
partition back through it (raw Fetch of whole batches), and the same through the
other listener; rounds alternate which listener goes first. MB/s per listener and
direction (median of the rounds) and SSL / PLAINTEXT. Both listeners share the
broker, its disk and the client process, so what differs is TLS: encryption on both
ends, and on the broker the copy through a memory BIO (runtime/tls.py) instead of the
scatter-gather write of a plaintext answer.
"""

from __future__ import annotations

import argparse
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
from bench.harness import raw_fill
from bench.harness import run
from bench.harness import write_results
from client.cluster import ClusterClient
from client.security import create_ssl_context
from client.throwaway_ca import ThrowawayCA

NAME = "tls"
TARGET_RATIO = 0.75  # TLS at least 75% of plaintext: it costs at most 25%
_SSL_LISTENER = re.compile(r"SSL://([\w.-]+):(\d+)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench {NAME}", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--mib", type=int, default=512, help="MiB written per listener per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds [3]")
    p.add_argument("--batch-kib", type=int, default=1024, help="KiB per batch [1024]")
    return p


async def one_listener(
    bootstrap: str, tls: dict[str, Any], topic: str, batch: bytes, total: int, max_bytes: int
) -> tuple[float, float]:
    """(write MB/s, read MB/s) of `total` bytes through one listener."""
    client = ClusterClient(bootstrap, client_id=f"bench-{NAME}", **tls)
    await client.bootstrap()
    try:
        started = time.perf_counter()
        written = await raw_fill(client, topic, 1, batch, total)
        write_s = time.perf_counter() - started
        fetcher = RawFetcher(client, topic, 1, max_bytes)
        read = 0
        started = time.perf_counter()
        while True:
            nbytes, _ = await fetcher.fetch_round()
            read += nbytes
            if nbytes == 0:
                break
        read_s = time.perf_counter() - started
        return written / write_s / 1e6, read / read_s / 1e6
    finally:
        await client.close()


async def measure(args: argparse.Namespace, ca: ThrowawayCA) -> list[dict[str, Any]]:
    cert = ca.issue("broker", hosts=["127.0.0.1", "localhost"])
    broker_args = [
        *("--listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0"),
        *("--ssl-certfile", str(cert.certfile), "--ssl-keyfile", str(cert.keyfile)),
    ]
    batch, _ = build_batch(KiB, args.batch_kib * KiB)
    total = args.mib * MiB
    per: dict[str, dict[str, list[float]]] = {
        name: {"write": [], "read": []} for name in ("PLAINTEXT", "SSL")
    }
    with BenchCluster(1, broker_args=broker_args, keep_data=args.keep_data) as cluster:
        broker = cluster.cluster.brokers[1]
        match = _SSL_LISTENER.search(broker.log_text())
        assert match is not None, "the broker did not log its SSL listener"
        listeners = {
            "PLAINTEXT": (f"{broker.host}:{broker.port}", {}),
            "SSL": (
                f"{match[1]}:{match[2]}",
                {"security_protocol": "SSL", "ssl_context": create_ssl_context(cafile=ca.cafile)},
            ),
        }
        for round_ in range(args.rounds):
            order = ["PLAINTEXT", "SSL"] if round_ % 2 == 0 else ["SSL", "PLAINTEXT"]
            for name in order:
                topic = f"{NAME}-{name.lower()}-{round_}"
                await cluster.create_topic(topic, partitions=1, replication_factor=1)
                bootstrap, tls = listeners[name]
                write, read = await one_listener(
                    bootstrap, tls, topic, batch, total, args.batch_kib * KiB
                )
                per[name]["write"].append(write)
                per[name]["read"].append(read)
                await cluster.delete_topic(topic)
    rows = []
    for direction in ("write", "read"):
        plain = statistics.median(per["PLAINTEXT"][direction])
        secure = statistics.median(per["SSL"][direction])
        rows.append(
            {
                "direction": direction,
                "batch_kib": args.batch_kib,
                "plaintext_mb_per_s": round(plain, 1),
                "ssl_mb_per_s": round(secure, 1),
                "ssl_over_plaintext": round(secure / plain, 3),
                "target_met": secure / plain >= TARGET_RATIO,
                "rounds": {
                    k: [round(v[direction][i], 1) for i in range(args.rounds)]
                    for k, v in per.items()
                },
            }
        )
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
            ["direction", "batch KiB", "PLAINTEXT MB/s", "SSL MB/s", "SSL / PLAINTEXT", "target"],
            [
                [
                    r["direction"],
                    r["batch_kib"],
                    r["plaintext_mb_per_s"],
                    r["ssl_mb_per_s"],
                    r["ssl_over_plaintext"],
                    f">= {TARGET_RATIO} {'met' if r['target_met'] else 'MISSED'}",
                ]
                for r in rows
            ],
        )
    )
    write_results(NAME, args=args, rows=rows, started=started, out=args.out)
    return 0
