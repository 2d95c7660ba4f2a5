"""`python -m bench <name> [options]`: run one bench, or `all` of them in turn.

`python -m bench <name> --help` shows a bench's options.
"""

from __future__ import annotations

import importlib
import sys
import time

BENCHES = {
    "produce": "bench.produce",
    "produce-batch": "bench.produce",
    "consume": "bench.consume",
    "latency": "bench.latency",
    "failover": "bench.failover",
    "recovery": "bench.recovery",
    "spark": "bench.spark",
    "plot": "bench.plot",
    "summary": "bench.summary",
    "micro": "bench.micro",
    "broker-cpu": "bench.broker_cpu",
    "listener-cpu": "bench.listener_cpu",
    "rebalance": "bench.rebalance",
    "tls": "bench.tls",
    "scale": "bench.scale",
}
# Options a bench name implies: produce-batch is the produce bench through
# create_batch()/send_batch(), only the RF 3 acks=all cells the targets are about.
IMPLIED_ARGS = {"produce-batch": ["--api", "batch", "--rf", "3", "--acks", "all"]}
# `all` runs these in this order (latency reads produce's result for its rate), then
# plots and prints the table of figures against the targets.
ALL = [
    "produce",
    "produce-batch",
    "consume",
    "latency",
    "failover",
    "recovery",
    "scale",
    "spark",
    "plot",
    "summary",
]


def usage() -> str:
    names = ", ".join([*BENCHES, "all"])
    return (
        "usage: python -m bench <name> [options]   (from the repo root)\n"
        f"names: {names}\n"
        "`all` takes --quick too; `python -m bench <name> --help` for a bench's options"
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "all":
        return run_all(rest)
    if name not in BENCHES:
        print(f"error: no bench named {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[name])
    return int(module.main(IMPLIED_ARGS.get(name, []) + rest) or 0)


def run_all(rest: list[str]) -> int:
    unknown = [a for a in rest if a != "--quick"]
    if unknown:
        print(f"error: `all` takes only --quick, not {' '.join(unknown)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    failed = []
    for name in ALL:
        print(f"\n=== bench {name} ===", flush=True)
        t0 = time.monotonic()
        args = [] if name in ("plot", "summary") else IMPLIED_ARGS.get(name, []) + list(rest)
        try:
            code = int(importlib.import_module(BENCHES[name]).main(args) or 0)
        except Exception as exc:  # one broken bench must not hide the others' figures
            print(f"bench {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        print(f"=== {name}: {'ok' if code == 0 else 'FAILED'} in {time.monotonic() - t0:.0f} s")
        if code != 0:
            failed.append(name)
    print(
        f"\nall benches: {time.monotonic() - started:.0f} s; failed: {', '.join(failed) or 'none'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
