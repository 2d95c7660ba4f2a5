"""The latest figures against issue 7's targets, as a Markdown table, from
bench/results/*.json: `python -m bench summary` (paste it into bench/README.md).

Each line takes the best cell of its kind (the targets are about what the cluster can
do); a missing results file shows as "not run".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR
from bench.harness import MiB

Rows = list[dict[str, Any]]


def _best(rows: Rows, key: str, **match: Any) -> float | None:
    values = [r[key] for r in rows if all(r.get(k) == v for k, v in match.items())]
    return max(values) if values else None


def _summary_of(doc: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((s for s in doc.get("summary", []) if s["kind"] == kind), None)


def _largest(doc: dict[str, Any]) -> dict[str, Any]:
    done = [r for r in doc["results"] if "error" not in r]
    return max(done, key=lambda r: r["partitions"]) if done else {}


# (bench, what, target text, figure(doc) -> value or None, unit, met(value) -> bool)
Line = tuple[str, str, str, Callable[[dict[str, Any]], float | None], str, Callable[[float], bool]]


def _produce_lines(bench: str, how: str) -> list[Line]:
    """The two produce targets, for send() (bench produce) or send_batch() (produce-batch)."""
    return [
        (
            bench,
            f"produce RF=3 acks=all, 1 KiB records{how}",
            ">= 250 MB/s",
            lambda d: _best(d["results"], "mb_per_s", rf=3, acks="all", record_size=1024),
            "MB/s",
            lambda v: v >= 250,
        ),
        (
            bench,
            f"produce RF=3 acks=all, 100 B records{how}",
            ">= 420,000 records/s",
            lambda d: _best(d["results"], "records_per_s", rf=3, acks="all", record_size=100),
            "records/s",
            lambda v: v >= 420_000,
        ),
    ]


LINES: list[Line] = [
    *_produce_lines("produce", ""),
    *_produce_lines("produce-batch", ", send_batch()"),
    (
        "consume",
        "consume 100 B records, AsyncConsumer",
        ">= 1,000,000 records/s",
        lambda d: _best(d["results"], "records_per_s", reader="client"),
        "records/s",
        lambda v: v >= 1_000_000,
    ),
    (
        "consume",
        "consume 100 B records, raw fetch (broker ceiling)",
        ">= 1,000,000 records/s",
        lambda d: _best(d["results"], "records_per_s", reader="raw"),
        "records/s",
        lambda v: v >= 1_000_000,
    ),
    (
        "consume",
        "consume 1 MiB batches, raw fetch",
        ">= 1 GB/s",
        lambda d: _best(d["results"], "mb_per_s", reader="raw", batch_size=MiB),
        "MB/s",
        lambda v: v >= 1000,
    ),
    (
        "consume",
        "consume 1 MiB batches, AsyncConsumer.poll_batches()",
        ">= 1 GB/s",
        lambda d: _best(d["results"], "mb_per_s", reader="batches", batch_size=MiB),
        "MB/s",
        lambda v: v >= 1000,
    ),
    (
        "latency",
        "end-to-end latency p50 (acks=all, RF=3, ~10% load)",
        "<= 1 ms",
        lambda d: _best(d["results"], "p50_ms", measure="end-to-end"),
        "ms",
        lambda v: v <= 1,
    ),
    (
        "latency",
        "end-to-end latency p99",
        "<= 3 ms",
        lambda d: _best(d["results"], "p99_ms", measure="end-to-end"),
        "ms",
        lambda v: v <= 3,
    ),
    (
        "latency",
        "end-to-end latency p99.9",
        "(no target)",
        lambda d: _best(d["results"], "p99.9_ms", measure="end-to-end"),
        "ms",
        lambda v: True,
    ),
    (
        "latency",
        "end-to-end latency max",
        "(no target)",
        lambda d: _best(d["results"], "max_ms", measure="end-to-end"),
        "ms",
        lambda v: True,
    ),
    (
        "failover",
        "unavailable after SIGKILL of the leader (worst trial)",
        "<= session timeout + 1 s",
        lambda d: (_summary_of(d, "SIGKILL") or {}).get("max_s"),
        "s",
        lambda v: v <= 5.0,  # replaced by the run's own target below
    ),
    (
        "failover",
        "unavailable after controlled shutdown (worst trial)",
        "<= 200 ms",
        lambda d: (_summary_of(d, "SIGTERM") or {}).get("max_s"),
        "s",
        lambda v: v <= 0.2,
    ),
    (
        "recovery",
        "recovery scan of unflushed log after SIGKILL",
        ">= 500 MB/s",
        lambda d: _best(d["results"], "scan_mb_per_s", shutdown="unclean"),
        "MB/s",
        lambda v: v >= 500,
    ),
    (
        "scale",
        "idle replication, busiest broker, largest partition count (RF 3)",
        "< 5% of a core",
        lambda d: _largest(d).get("idle_core_pct"),
        "% of a core",
        lambda v: v < 5,
    ),
    (
        "scale",
        "failover of the broker leading a third of the partitions, largest count",
        "<= session timeout + 2 s",
        lambda d: _largest(d).get("failover_s"),
        "s",
        lambda v: v <= 6.0,  # replaced by the run's own target below
    ),
    (
        "scale",
        "open descriptors of a broker, largest partition count",
        "bounded (--max-open-segment-files 8,192 + sockets)",
        lambda d: _largest(d).get("fds"),
        "fds",
        lambda v: v <= 8192 + 256,
    ),
    *[
        (
            "spark",
            f"Spark source, availableNow, local[2], {session} query",
            ">= 300,000 rows/s",
            lambda d, session=session: _best(d["results"], "rows_per_s", session=session),
            "rows/s",
            lambda v: v >= 300_000,
        )
        # The first query of a session pays for Spark's Python workers and the JVM's
        # compiling of the read path; a long-running stream runs warm.
        for session in ("cold", "warm")
    ],
]


def _fmt(value: float, unit: str) -> str:
    if unit in ("records/s", "rows/s"):
        return f"{value:,.0f} {unit}"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:,.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def markdown(results: Path) -> str:
    docs: dict[str, dict[str, Any] | None] = {}
    out = [
        "| measure | target | latest | met | run |",
        "|---|---|---|---|---|",
    ]
    for bench, what, target, figure, unit, met in LINES:
        if bench not in docs:
            path = results / f"{bench}.json"
            docs[bench] = json.loads(path.read_text()) if path.exists() else None
        doc = docs[bench]
        value = figure(doc) if doc is not None else None
        if doc is None or value is None:
            out.append(f"| {what} | {target} | not run | | |")
            continue
        if bench == "failover" and "SIGKILL" in what:
            limit = (_summary_of(doc, "SIGKILL") or {}).get("target_s", 5.0)
            target = f"<= session timeout + 1 s = {limit:g} s"
            ok = value <= limit
        elif bench == "scale" and "failover" in what:
            limit = doc.get("session_timeout_ms", 4000) / 1000 + 2
            target = f"<= session timeout + 2 s = {limit:g} s"
            ok = value <= limit
        else:
            ok = met(value)
        run = f"{doc['mode']} {doc['machine']['time_utc'][:10]} {doc['machine']['git_commit'][:8]}"
        mark = "n/a" if target == "(no target)" else ("yes" if ok else "**no**")
        out.append(f"| {what} | {target} | {_fmt(value, unit)} | {mark} | {run} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench summary", description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="where the JSON files are")
    args = p.parse_args(argv)
    print(markdown(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
