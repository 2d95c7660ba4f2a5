"""PNGs in bench/plots/ (committed, for bench/README.md) from bench/results/*.json
(git-ignored, machine-specific), with matplotlib, headless:

- produce_throughput.png: MB/s of every produce cell, one panel per record size,
  with the issue's target as a line;
- consume_throughput.png: records/s of the consumer and the raw fetch loop;
- latency_cdf.png: the end-to-end and produce-ack latency distribution (CDF, log
  time axis) with the p50 and p99 targets.

A missing results file is skipped with a note; `python -m bench plot`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness import REPO
from bench.harness import RESULTS_DIR
from bench.harness import size_label

PLOTS_DIR = REPO / "bench" / "plots"

PRODUCE_TARGET_MB_S = {1024: 250.0, 100: 42.0}  # 420,000 records/s of 100 B = 42 MB/s
CONSUME_TARGET_RECORDS_S = 1_000_000
LATENCY_TARGETS_MS = {"p50": 1.0, "p99": 3.0}


def _load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    if not path.exists():
        print(f"plot: no {path.name}, skipped", file=sys.stderr)
        return None
    return json.loads(path.read_text())


def _subtitle(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    return (
        f"{m['cores']} cores {m['cpu_model']}, Python {m['python']}, uvloop {m['uvloop']}, "
        f"{doc['mode']} run, commit {m['git_commit'][:8]}"
    )


def _save(fig: Any, title: str, doc: dict[str, Any], path: Path) -> Path:
    """Title the figure (with the run's machine line), write it as a PNG, free it."""
    import matplotlib.pyplot as plt

    fig.suptitle(f"{title}\n{_subtitle(doc)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_produce(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib.pyplot as plt

    sizes = sorted({r["record_size"] for r in doc["results"]})
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 6), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        rows = [r for r in doc["results"] if r["record_size"] == size]
        labels = [
            f"RF{r['rf']} acks={r['acks']} {size_label(r['batch_size'])} x{r['producers']}"
            for r in rows
        ]
        colors = ["tab:blue" if r["rf"] == 1 else "tab:orange" for r in rows]
        ax.barh(labels, [r["mb_per_s"] for r in rows], color=colors)
        for i, r in enumerate(rows):
            ax.text(r["mb_per_s"], i, f" {r['records_per_s']:,}/s", va="center", fontsize=7)
        target = PRODUCE_TARGET_MB_S.get(size)
        if target:
            ax.axvline(
                target, color="red", linestyle="--", label=f"RF3 acks=all target {target:g} MB/s"
            )
            ax.legend(loc="lower right")
        ax.set_title(f"{size_label(size)} records")
        ax.set_xlabel("MB/s (value bytes); label: records/s")
        ax.invert_yaxis()
    return _save(fig, "Produce throughput by record size", doc, out / "produce_throughput.png")


def plot_consume(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = doc["results"]
    labels = [f"{r['reader']} {r['partitions']}p {size_label(r['batch_size'])}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 5))
    shades = {"raw": "tab:green", "batches": "tab:blue"}
    colors = [shades.get(r["reader"], "tab:purple") for r in rows]
    ax.barh(labels, [r["records_per_s"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        ax.text(r["records_per_s"], i, f" {r['mb_per_s']:g} MB/s", va="center", fontsize=8)
    ax.axvline(CONSUME_TARGET_RECORDS_S, color="red", linestyle="--", label="target 1M records/s")
    ax.legend(loc="lower right")
    ax.set_xlabel("records/s (100 B records)")
    ax.invert_yaxis()
    return _save(fig, "Consume throughput", doc, out / "consume_throughput.png")


def plot_latency(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for row in doc["results"]:
        values = row["cdf_ms"]
        fractions = [i / (len(values) - 1) for i in range(len(values))]
        ax.plot(values, fractions, label=f"{row['measure']} (p99 {row['p99_ms']} ms)")
    for name, ms in LATENCY_TARGETS_MS.items():
        ax.axvline(ms, color="red", linestyle=":", linewidth=1)
        ax.text(ms, 0.02, f" {name} target", color="red", fontsize=8, rotation=90)
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log scale)")
    ax.set_ylabel("fraction of records")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    rate = doc["settings"].get("rate")
    title = (
        f"End-to-end latency, acks={doc.get('acks', 'all')} RF{doc.get('replication_factor', 3)}, "
        f"{rate:,} records/s"
    )
    return _save(fig, title, doc, out / "latency_cdf.png")


SCALE_PANELS = [
    ("replicas_created_s", "topic creation until every broker leads or follows each replica, s"),
    ("idle_core_pct", "idle CPU, busiest broker, % of a core"),
    ("rss_mb", "broker RSS, MB"),
    ("fds", "broker open descriptors"),
    ("produce_mb_s", "produce, send_batch() acks=all, MB/s"),
    ("ack_p99_ms", "produce ack p99, ms"),
    ("failover_s", "failover after SIGKILL, s"),
    ("isr_back_s", "restarted broker back in every ISR, s"),
    ("controller_serving_s", "controller restart until it serves, s"),
]


def plot_scale(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = sorted((r for r in doc["results"] if "error" not in r), key=lambda r: r["partitions"])
    xs = [r["partitions"] for r in rows]
    fig, axes = plt.subplots(3, 3, figsize=(11, 9))
    for ax, (key, label) in zip(axes.flat, SCALE_PANELS, strict=True):
        ax.plot(xs, [r[key] for r in rows], marker="o")
        ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if key == "idle_core_pct":
            ax.axhline(5, color="red", linestyle="--", linewidth=1)
        if key == "failover_s":
            ax.axhline(doc.get("session_timeout_ms", 4000) / 1000 + 2, color="red", ls="--", lw=1)
    for ax in axes[-1]:
        ax.set_xlabel("partitions, RF 3 (log scale)")
    return _save(fig, "Cost against the partition count", doc, out / "scale.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench plot", description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="where the JSON files are")
    p.add_argument("--plots", type=Path, default=PLOTS_DIR, help="where the PNGs go [bench/plots]")
    args = p.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        print(
            "plot: matplotlib is not installed: `.venv/bin/pip install matplotlib`",
            file=sys.stderr,
        )
        return 1
    matplotlib.use("Agg")
    args.plots.mkdir(parents=True, exist_ok=True)
    plots = {
        "produce": plot_produce,
        "consume": plot_consume,
        "latency": plot_latency,
        "scale": plot_scale,
    }
    for name, plot in plots.items():
        doc = _load(args.results, name)
        if doc is not None:
            print(f"plot: {plot(doc, args.plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
