"""Chaos campaigns from the command line (run from the repository root):

    python -m tests.chaos --runs 20 --seed 1 --faults all --backend docker --time-limit 60
    python -m tests.chaos --backend process --faults kill,pause --rf 1 --min-insync 1
    python -m tests.chaos --backend process --faults diverge --min-insync 1 --unclean
    python -m tests.chaos --recheck chaos-results/run-000-seed1

Options the checker could not judge are refused (exit 2) with what to do instead:
--idempotent with --acks 1, --acks 0, --min-insync above --rf, --rf above the brokers,
only faults the backend cannot inject, diverge with --rf 1, guarded wipes with --rf 1.

Each run writes history.jsonl, replicas.json, metadata.json, results.json, summary.txt (and the
servers' logs when it is not valid) under --out/run-NNN-seed<S>/; the campaign writes
--out/campaign.json. Exit code: 0 when no run is invalid, 1 when one is (or a run
broke), 2 on bad arguments. With --strict, runs whose verdict is "unknown" (a check
could not run, e.g. brokers without DescribeReplicaLog) count as failures too.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any
from typing import TypeVar

from .backends import ClusterSettings
from .backends import docker_unavailable
from .checker import summary
from .nemesis import FAULTS
from .nemesis import parse_faults
from .runner import RunConfig
from .runner import campaign
from .runner import recheck
from .workload import WorkloadConfig

C = TypeVar("C")


def _range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    a, b = float(lo), float(hi or lo)
    if not 0 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: want LOW,HIGH seconds with 0 <= LOW <= HIGH")
    return a, b


def _env_pairs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("MINIBROKER_"):
            raise SystemExit(f"error: {item!r}: want MINIBROKER_NAME=VALUE")
        out[key] = value
    return out


def _fields_from(config: type[C], args: argparse.Namespace, **computed: Any) -> C:
    """`config` with each field that has a flag of its name taken from `args`, the
    others from `computed` (the flags are named after the fields they fill)."""
    names = [f.name for f in fields(config)]  # type: ignore[arg-type]
    given = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return config(**{**given, **computed})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Run chaos campaigns against a minibroker cluster and check them.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=1, help="number of runs")
    p.add_argument("--seed", type=int, default=None, help="seed of the first run (random)")
    p.add_argument(
        "--faults",
        default="all",
        help=f"comma-separated faults: {', '.join(FAULTS)}; 'all' or 'none'",
    )
    p.add_argument("--backend", choices=("docker", "process"), default="docker")
    p.add_argument("--time-limit", type=float, default=60.0, help="workload seconds per run")
    p.add_argument("--max-faults", type=int, default=None, help="faults per run [time/4]")
    p.add_argument(
        "--fault-interval", type=_range, default=(1.0, 4.0), help="LOW,HIGH s between fault starts"
    )
    p.add_argument("--fault-duration", type=_range, default=(2.0, 6.0), help="fault LOW,HIGH s")
    p.add_argument(
        "--max-concurrent-faults",
        type=int,
        default=3,
        help="faults active at once (they overlap: a wipe recovering while another broker "
        "is paused...); 1: one at a time",
    )
    p.add_argument(
        "--unguarded-wipes",
        action="store_true",
        help="wipe even the last in-sync copy or before an earlier wipe recovered "
        "(acknowledged writes are then lost by design: the run must fail)",
    )
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument(
        "--rf", dest="replication_factor", type=int, default=3, help="replication factor"
    )
    p.add_argument(
        "--min-insync",
        dest="min_insync_replicas",
        type=int,
        default=2,
        help="min.insync.replicas",
    )
    p.add_argument("--acks", choices=("0", "1", "all"), default="all")
    p.add_argument("--unclean", action="store_true", help="unclean.leader.election.enable")
    p.add_argument(
        "--idempotent",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="enable_idempotence passed to every producer, both ways; --no-idempotent: "
        "retry duplicates are expected where a retry can put them [on with --acks all, "
        "as the client's default; off otherwise]",
    )
    p.add_argument(
        "--client",
        choices=("minibroker", "confluent"),
        default="minibroker",
        help="whose producers and consumers: minibroker's, or librdkafka's (confluent-kafka) "
        "through the brokers' Kafka listeners",
    )
    p.add_argument(
        "--group",
        action="store_true",
        help="the consumers are members of one consumer group (subscribe, commits after "
        "every poll); the checker adds group-overlap (a partition delivered to two members "
        "of one generation)",
    )
    p.add_argument("--producers", type=int, default=2)
    p.add_argument(
        "--in-flight",
        type=int,
        default=16,
        help="records in flight per producer (lanes awaiting their acknowledgement)",
    )
    p.add_argument(
        "--ack-timeout",
        type=float,
        default=2.5,
        help="seconds a send waits for its acknowledgement before it is indeterminate",
    )
    p.add_argument("--request-timeout-ms", type=int, default=1_500, help="clients' request timeout")
    p.add_argument(
        "--delivery-timeout-ms", type=int, default=20_000, help="producers' delivery timeout"
    )
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--max-sends", type=int, default=100_000, help="sends per run, in all")
    p.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra MINIBROKER_* setting for every broker (repeatable), e.g. "
        "MINIBROKER_ENABLE_TEST_FAULTS=1 with a MINIBROKER_UNSAFE_* switch",
    )
    p.add_argument(
        "--controller-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra MINIBROKER_* setting for the controller (repeatable)",
    )
    p.add_argument(
        "--controllers",
        type=int,
        choices=(1, 3, 5),
        default=None,
        help="controllers: 1, or a quorum of 3 or 5 [docker: 3, as compose runs them; process: 1]",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="every listener SSL, TLS between the servers and from the clients "
        "(certificates from a throwaway CA; process backend)",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        help="SASL_SSL (SCRAM) on every listener and between the servers, the authorizer on, "
        "the workload a user with ACLs on its topic and group (process backend)",
    )
    p.add_argument("--image", default="minibroker:latest", help="docker backend image")
    p.add_argument("--out", type=Path, default=Path("chaos-results"), help="results directory")
    p.add_argument("--keep-logs", action="store_true", help="keep server logs of valid runs")
    p.add_argument("--stop-on-failure", action="store_true", help="stop at the first invalid run")
    p.add_argument("--strict", action="store_true", help='"unknown" verdicts fail too')
    p.add_argument("--recheck", type=Path, metavar="RUN_DIR", help="check a finished run again")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if args.recheck is not None:
        result = recheck(args.recheck)
        print(summary(result))
        return 1 if result["valid"] is False else 0
    try:
        faults = parse_faults(args.faults)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    idempotent = args.acks == "all" if args.idempotent is None else args.idempotent
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    cfg = _fields_from(
        RunConfig,
        args,
        seed=seed,
        faults=faults,
        max_faults=args.max_faults
        if args.max_faults is not None
        else max(1, int(args.time_limit // 4)),
        guard_wipes=not args.unguarded_wipes,
        workload=_fields_from(WorkloadConfig, args, idempotent=idempotent),
        cluster=ClusterSettings(
            controllers=args.controllers or (3 if args.backend == "docker" else 1),
            tls=args.tls,
            secure=args.secure,
            broker_env=_env_pairs(args.broker_env),
            controller_env=_env_pairs(args.controller_env),
        ),
    )
    problems = cfg.problems()
    if args.runs < 1:
        problems.append(f"--runs {args.runs}: want at least 1")
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.backend == "docker":
        why = docker_unavailable(args.image)
        if why is not None:
            print(f"error: the docker backend cannot run: {why}", file=sys.stderr)
            return 2
    print(
        f"chaos: {args.runs} run(s) from seed {seed}, backend {args.backend}, "
        f"faults {','.join(faults) or 'none'} (up to {args.max_concurrent_faults} at once), "
        f"RF {args.replication_factor}, min ISR {args.min_insync_replicas}, acks {args.acks}, "
        f"{'idempotent' if idempotent else 'NON-idempotent'} producers with "
        f"{args.in_flight} records in flight each, {args.time_limit:g}s each; "
        f"results in {args.out}/",
        flush=True,
    )
    result = campaign(cfg, args.runs, args.out, stop_on_failure=args.stop_on_failure)
    totals = {k: n for k, n in result["totals"].items() if n}
    print(
        f"campaign: {result['runs']} runs: {result['valid']} valid, {result['invalid']} "
        f"invalid, {result['unknown']} unknown ({result['errors']} broke: see their "
        f"summary.txt); {result['acknowledged']} acknowledged writes, "
        f"{result['indeterminate']} indeterminate; anomalies: "
        f"{json.dumps(totals) if totals else 'none'} "
        f"({args.out}/campaign.json)"
    )
    if result["invalid"] or result["errors"] or (args.strict and result["unknown"]):
        return 1
    return 0


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM would end the process without running `finally` or atexit: turn it into
    # KeyboardInterrupt so the cluster is torn down (docker compose down -v).
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
