"""Recovery: how fast a broker recovers 1 GiB of unflushed log after an unclean
shutdown.

One broker, a topic of one partition (replication factor 1, default 128 MiB
segments, no flush.ms / flush.messages, so nothing is fsynced and the recovery point
stays at 0). `--gib` of 1 KiB records in 1 MiB batches is appended fast (copies of
one encoded batch), the broker is SIGKILLed, and started again. Its log then says
`Loading logs ... after an unclean shutdown`, `unclean shutdown: recovering N
segment(s)` and `loaded 1 logs`: what broker/storage/log_loader.py does in between
is read every batch of every segment from the recovery point on (length, magic,
CRC-32C, contiguous offsets, epochs), rebuild both indexes, and fsync the recovered
segments.

- `scan_s`: from the `Loading logs` line to the `loaded` line (the log's own
  timestamps, ms resolution): the recovery itself; MB/s = log bytes / scan_s.
- `to_loaded_s`, `to_serving_s`: wall time from the restart (process spawn) until the
  `loaded` line and until `broker N started` (registered, unfenced, serving).

For comparison the broker is then stopped cleanly (SIGTERM) and started again: a clean
load only sanity-checks the segments. The data is in the page cache in both cases
(the bench does not drop caches, it would need root and disturb the machine): this is
the CPU cost of the scan, not the disk's read speed.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import BenchCluster
from bench.harness import KiB
from bench.harness import MiB
from bench.harness import Progress
from bench.harness import build_batch
from bench.harness import common_args
from bench.harness import raw_fill
from bench.harness import report
from bench.harness import run
from client.cluster import ClusterClient
from tests.integration.cluster import Cluster

NAME = "recovery"
TOPIC = "bench-recovery"
NODE = 1
LOADING = re.compile(r"^(\S+ \S+) \w+ .*Loading logs from", re.M)
# LogManager.shutdown_description: "after a clean shutdown" / "after an unclean shutdown".
LOADED = re.compile(r"^(\S+ \S+) \w+ .*loaded (\d+) logs from .* after an? (\w+) shutdown", re.M)
RECOVERING = re.compile(r"unclean shutdown: recovering (\d+) segment")
STARTED = re.compile(rf"broker {NODE} started")
RESTART_TIMEOUT_S = 300.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench recovery", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--gib", type=float, help="GiB of log to recover [1; 0.125 with --quick]")
    p.add_argument("--record-size", type=int, default=KiB, help="value bytes [1024]")
    return p


async def fill(cluster: BenchCluster, total: int, record_size: int, progress: Progress) -> int:
    await cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
    batch, _ = build_batch(record_size, MiB)
    client = ClusterClient(cluster.bootstrap, client_id="bench-recovery-fill")
    await client.bootstrap()
    last = [0.0]

    def on_progress(written: int) -> None:
        now = time.monotonic()
        if now - last[0] > 0.5:
            last[0] = now
            progress.update(f"writing: {written / MiB:,.0f} / {total / MiB:,.0f} MiB")

    try:
        return await raw_fill(client, TOPIC, 1, batch, total, on_progress=on_progress)
    finally:
        await client.close()


def log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / f"{TOPIC}-0").glob("*.log"))


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def timed_restart(cluster: BenchCluster, expect: str) -> dict[str, Any]:
    """Start the broker again; times from its log, checked to be an `expect` load."""
    t0 = time.monotonic()
    proc = cluster.restart_broker(NODE, wait=False)
    to_loaded = to_serving = None
    while to_serving is None:
        text = proc.log_text()
        now = time.monotonic()
        if to_loaded is None and LOADED.search(text):
            to_loaded = now - t0
        if STARTED.search(text):
            to_serving = now - t0
            to_loaded = to_loaded if to_loaded is not None else to_serving
        elif not proc.alive:
            raise RuntimeError(f"the broker exited during recovery:\n{proc.tail()}")
        elif now - t0 > RESTART_TIMEOUT_S:
            raise TimeoutError(f"the broker did not start within {RESTART_TIMEOUT_S:.0f} s")
        time.sleep(0.01)
    loading, loaded = LOADING.search(text), LOADED.search(text)
    assert loading is not None and loaded is not None, "the load lines are missing"
    if loaded[3] != expect:
        raise RuntimeError(f"expected a load after a {expect} shutdown, the log says {loaded[3]}")
    recovering = RECOVERING.search(text)
    Cluster.wait_ready(proc)
    return {
        "shutdown": expect,
        "segments_recovered": int(recovering[1]) if recovering else 0,
        "scan_s": round(_stamp(loaded[1]) - _stamp(loading[1]), 3),
        "to_loaded_s": round(to_loaded, 3),
        "to_serving_s": round(to_serving, 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.gib is None:
        args.gib = 0.125 if args.quick else 1.0
    progress = Progress(3, NAME)
    rows = []
    with BenchCluster(1, keep_data=args.keep_data) as cluster:
        total = int(args.gib * 1024 * MiB)
        run(fill(cluster, total, args.record_size, progress))
        broker = cluster.cluster.brokers[NODE]
        nbytes = log_bytes(broker.data_dir)
        progress.step(f"written {nbytes / MiB:,.0f} MiB; SIGKILL, restart")
        broker.kill()
        rows.append({**timed_restart(cluster, "unclean"), "log_bytes": nbytes})
        progress.step("recovered; SIGTERM, restart")
        broker = cluster.cluster.brokers[NODE]
        if broker.terminate() != 0:
            raise RuntimeError(f"the broker did not stop cleanly:\n{broker.tail()}")
        broker = cluster.cluster.brokers[NODE]
        rows.append({**timed_restart(cluster, "clean"), "log_bytes": log_bytes(broker.data_dir)})
        progress.step("done")
    for row in rows:
        row["scan_mb_per_s"] = round(row["log_bytes"] / max(row["scan_s"], 1e-3) / 1e6)
    if rows[0]["segments_recovered"] == 0:
        raise RuntimeError("the unclean restart recovered no segment: nothing was measured")
    columns = ["shutdown", "log MiB", "segments", "scan s", "MB/s", "to loaded s", "to serving s"]
    table = [
        [
            r["shutdown"],
            round(r["log_bytes"] / MiB),
            r["segments_recovered"],
            r["scan_s"],
            r["scan_mb_per_s"],
            r["to_loaded_s"],
            r["to_serving_s"],
        ]
        for r in rows
    ]
    return report(NAME, args, progress, columns, table, rows)


if __name__ == "__main__":
    sys.exit(main())
