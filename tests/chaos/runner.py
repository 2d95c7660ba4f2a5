"""One chaos run end to end, and campaigns of runs.

A run: start the cluster (backend), create the topic, run the workload and the nemesis
together, heal, let the consumers catch up, read every partition in full, collect the
replicas' logs, check. Everything lands in the run's directory:

    config.json     what was run (seed, faults, topic settings, backend)
    history.jsonl   every operation (history.py)
    replicas.json   every broker's replica of every partition (replicas.py)
    metadata.json   every controller's metadata log, read after the run (quorum_watch.py;
                    the history holds the quorum's DescribeQuorum samples)
    results.json    the checker's result (checker.py) plus run facts
    summary.txt     the short human summary
    client.log      this process's log (clients, nemesis)
    logs/           the servers' logs (always for the process backend; for docker when
                    the run is not valid or failed, or with keep_logs)

Bounded: the whole run has a hard deadline (time limit + setup and teardown slack);
the cluster is torn down in a `finally` (and the backends' atexit hooks).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import time
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from client import AsyncAdmin
from client.errors import MinibrokerError
from tests.integration.cluster import run_command

from . import checker
from . import quorum_watch
from . import replicas
from .backends import Backend
from .backends import ClusterSettings
from .backends import DockerBackend
from .backends import ProcessBackend
from .backends import unsupported_faults
from .history import History
from .nemesis import Nemesis
from .nemesis import NemesisConfig
from .workload import Workload
from .workload import WorkloadConfig

log = logging.getLogger(__name__)

# Setup (cluster start, topic), heal, catch-up, final read, replicas, teardown.
SLACK_S = 480.0


@dataclass
class RunConfig:
    seed: int
    backend: str = "process"  # process | docker
    faults: list[str] = field(default_factory=lambda: ["pause"])
    max_faults: int = 6
    fault_interval: tuple[float, float] = (2.0, 5.0)
    fault_duration: tuple[float, float] = (2.0, 6.0)
    max_concurrent_faults: int = 1
    guard_wipes: bool = True
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    image: str = "minibroker:latest"
    keep_logs: bool = False  # also when the run is valid

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self) -> list[str]:
        """Why this run could not be checked or could not run, one message per fault in
        the options (empty: fine). The CLI refuses these; run_once raises on them."""
        wl = self.workload
        out = wl.problems()
        if wl.replication_factor > self.cluster.brokers:
            out.append(
                f"--rf {wl.replication_factor}: the cluster has {self.cluster.brokers} brokers"
            )
        if self.backend == "docker" and self.cluster.controllers != 3:
            out.append(f"--controllers {self.cluster.controllers}: the compose cluster runs 3")
        if self.max_faults < 0 or self.max_concurrent_faults < 1:
            out.append("--max-faults must be >= 0 and --max-concurrent-faults >= 1")
        cannot = unsupported_faults(self.backend, self.faults)
        if self.faults and len(cannot) == len(self.faults):
            out.append(
                f"--faults {','.join(self.faults)}: none can be injected by the "
                f"{self.backend} backend ({'; '.join(cannot.values())})"
            )
        if (self.cluster.tls or self.cluster.secure) and self.backend != "process":
            out.append("--tls, --secure: only the process backend runs them so far")
        if "diverge" in self.faults and wl.replication_factor < 2:
            out.append("--faults diverge needs followers to leave the leader alone: --rf 2 or more")
        if "wipe" in self.faults and self.guard_wipes and wl.replication_factor < 2:
            out.append(
                "--faults wipe with --rf 1: a guarded wipe needs another in-sync copy, so no "
                "wipe would ever happen; add --unguarded-wipes to wipe anyway (acknowledged "
                "writes are then lost by design, and the run must fail)"
            )
        return out


def _setup_logging(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s [chaos] %(name)s: %(message)s")
    )
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return handler


def make_backend(cfg: RunConfig, run_dir: Path) -> Backend:
    if cfg.backend == "process":
        return ProcessBackend(cfg.cluster, run_dir / "cluster")
    if cfg.backend == "docker":
        return DockerBackend(cfg.cluster, run_dir, seed=cfg.seed, image=cfg.image)
    raise ValueError(f"unknown backend {cfg.backend!r} (process or docker)")


async def wait_cluster_ready(
    bootstrap: str,
    brokers: list[int],
    topic: str,
    timeout: float = 60.0,
    secure: dict[str, Any] | None = None,
) -> str | None:
    """Until every broker is registered and unfenced and every partition of `topic`
    has a leader with its full ISR. None when it got there, else what was missing."""
    deadline = time.monotonic() + timeout
    why = "not asked yet"
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(10):
                admin = AsyncAdmin(
                    bootstrap, request_timeout_ms=5000, bootstrap_retries=2, **(secure or {})
                )
                try:
                    await admin.start()
                    cluster = await admin.describe_cluster()
                    (desc,) = await admin.describe_topics([topic], include_offsets=False)
                finally:
                    await admin.close()
            live = {b.node_id for b in cluster.brokers if not b.is_fenced}
            missing = sorted(set(brokers) - live)
            no_leader = [p.partition for p in desc.partitions if p.leader < 0]
            short_isr = [p.partition for p in desc.partitions if len(p.isr) < len(p.replicas)]
            if not missing and not no_leader and not short_isr:
                return None
            why = f"fenced/missing brokers {missing}, leaderless {no_leader}, short ISR {short_isr}"
        except (MinibrokerError, TimeoutError, OSError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(1.0)
    return why


async def _run(
    cfg: RunConfig, run_dir: Path, backend: Backend, facts: dict[str, Any]
) -> tuple[dict, dict]:
    """Returns the replicas' logs and the controllers' metadata logs."""
    wl = cfg.workload
    history = History(run_dir / "history.jsonl")
    try:
        t0 = time.monotonic()
        await backend.up()
        facts["cluster-up-s"] = round(time.monotonic() - t0, 1)
        if isinstance(backend, DockerBackend):
            facts["image"] = f"{cfg.image} {backend.image_id}"
        bootstrap = backend.bootstrap_servers()
        workload = Workload(
            history, bootstrap, wl, backend.kafka_bootstrap_servers(), tls=backend.tls
        )
        await workload.create_topic()
        nemesis = Nemesis(
            backend,
            history,
            NemesisConfig(
                faults=cfg.faults,
                seed=cfg.seed,
                topic=wl.topic,
                partitions=wl.partitions,
                max_faults=cfg.max_faults,
                time_limit=wl.time_limit,
                interval=cfg.fault_interval,
                duration=cfg.fault_duration,
                max_concurrent=cfg.max_concurrent_faults,
                guard_wipes=cfg.guard_wipes,
            ),
            bootstrap,
        )
        stop = asyncio.Event()
        tls = backend.tls_context()
        watch = quorum_watch.QuorumWatch(history, backend.controller_addresses(), tls=tls)
        watch_stop = asyncio.Event()
        watch_task = asyncio.get_running_loop().create_task(watch.run(watch_stop))
        t0 = time.monotonic()
        workload.start()
        nemesis_task = asyncio.get_running_loop().create_task(nemesis.run(stop))
        try:
            await workload.wait_producers()
        finally:
            stop.set()
            try:
                await nemesis_task  # heals
            finally:
                watch_stop.set()
                await watch_task
        facts["workload-s"] = round(time.monotonic() - t0, 1)
        facts["faults-applied"] = nemesis.applied
        facts["faults-skipped"] = nemesis.skipped
        facts["faults-max-concurrent"] = nemesis.max_concurrent_seen
        facts["quorum-samples"] = watch.rounds

        not_ready = await wait_cluster_ready(
            bootstrap, backend.broker_ids, wl.topic, secure=workload.secure
        )
        if not_ready is not None:
            facts["not-ready-after-heal"] = not_ready
            log.warning("cluster not fully ready after heal: %s", not_ready)
        ends = await workload.end_offsets()
        if ends is not None:
            facts["caught-up"] = sorted(await workload.catch_up(ends))
        else:
            await workload.stop()
        facts["end-offsets"] = ends
        if workload.errors:
            facts["workload-errors"] = workload.errors
        await workload.final_read()
        logs = await replicas.collect_converged(
            backend.broker_addresses(), wl.topic, wl.partitions, tls=tls, sasl=backend.admin_sasl()
        )
        facts["replicas-converged"] = logs.get("converged")
        (run_dir / "replicas.json").write_text(json.dumps(logs, indent=1) + "\n")
        metadata = await quorum_watch.collect_metadata(backend, run_dir / "metadata-copies")
        (run_dir / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n")
        return logs, metadata
    finally:
        history.close()


def run_once(cfg: RunConfig, out_dir: Path, *, name: str | None = None) -> dict[str, Any]:
    """One run in `out_dir/<name>`; returns results.json's content. The cluster is
    always torn down; its logs are kept when the run is not valid (or keep_logs)."""
    problems = cfg.problems()
    if problems:
        raise ValueError("cannot run this chaos configuration: " + "; ".join(problems))
    name = name or f"{cfg.backend}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = out_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    handler = _setup_logging(run_dir / "client.log")
    facts: dict[str, Any] = {
        "run-dir": str(run_dir),
        "backend": cfg.backend,
        "seed": cfg.seed,
        "source": _source_version(),
    }
    started = time.monotonic()
    error: str | None = None
    replica_logs: dict[str, Any] | None = None
    metadata: dict[str, Any] = {"available": False, "reason": "the run ended before it"}
    backend = make_backend(cfg, run_dir)

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with asyncio.timeout(cfg.workload.time_limit + SLACK_S):
            return await _run(cfg, run_dir, backend, facts)

    try:
        try:
            replica_logs, metadata = asyncio.run(main())
        except Exception as exc:  # the run broke: keep everything and report it
            error = f"{type(exc).__name__}: {exc}"
            log.exception("chaos run %s failed", name)
        result = checker.check(
            _load_history(run_dir),
            replicas=replica_logs,
            metadata=metadata,
            unclean=cfg.workload.unclean,
            idempotent=cfg.workload.idempotent,
            leader_only_acks=cfg.workload.leader_only_acks,
        )
        if error is not None:
            result["error"] = error
            result["valid"] = False if result["valid"] is False else "unknown"
        if result["valid"] is not True or cfg.keep_logs:
            try:
                asyncio.run(backend.collect_logs(run_dir / "logs"))
            except Exception:
                log.exception("could not collect the servers' logs")
    finally:
        try:
            asyncio.run(backend.down())
        finally:
            logging.getLogger().removeHandler(handler)
            handler.close()
    if cfg.backend == "process":
        _tidy_process_run(run_dir, keep_data=result["valid"] is not True)
    result["run"] = {**facts, "duration-s": round(time.monotonic() - started, 1)}
    (run_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    text = checker.summary(result)
    if error is not None:
        text = f"run error: {error}\n{text}"
    (run_dir / "summary.txt").write_text(text + "\n")
    return result


def _source_version() -> str | None:
    """`git describe --always --dirty` of the repository (what the process backend ran)."""
    try:
        r = run_command(["git", "describe", "--always", "--dirty"], timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None


def _load_history(run_dir: Path) -> list:
    from .history import load

    path = run_dir / "history.jsonl"
    return load(path) if path.exists() else []


def _tidy_process_run(run_dir: Path, *, keep_data: bool) -> None:
    """Node logs to logs/; data directories deleted unless the run is to be examined."""
    cluster = run_dir / "cluster"
    if not cluster.exists():
        return
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    for path in cluster.glob("*.log"):
        shutil.move(str(path), logs / path.name)
    if not keep_data:
        shutil.rmtree(cluster, ignore_errors=True)


def recheck(run_dir: Path) -> dict[str, Any]:
    """Check a finished run again from its files (after a checker change, say)."""
    cfg = json.loads((run_dir / "config.json").read_text())
    rep_path = run_dir / "replicas.json"
    logs = json.loads(rep_path.read_text()) if rep_path.exists() else None
    meta_path = run_dir / "metadata.json"
    metadata = (
        json.loads(meta_path.read_text())
        if meta_path.exists()
        else {"available": False, "reason": "no metadata.json (a run from before the check)"}
    )
    wl = cfg["workload"]
    return checker.check(
        _load_history(run_dir),
        replicas=logs,
        metadata=metadata,
        unclean=wl["unclean"],
        idempotent=wl.get("idempotent", False),
        leader_only_acks=wl.get("acks") == "1" and wl.get("replication_factor", 1) > 1,
    )


def campaign(
    base: RunConfig, runs: int, out_dir: Path, *, stop_on_failure: bool = False
) -> dict[str, Any]:
    """`runs` runs with seeds base.seed, base.seed + 1, ...; writes campaign.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    totals = dict.fromkeys(checker.ANOMALIES, 0)
    for i in range(runs):
        cfg = RunConfig(**{**base.__dict__, "seed": base.seed + i})
        result = run_once(cfg, out_dir, name=f"run-{i:03d}-seed{cfg.seed}")
        counts = {k: v["count"] for k, v in result["anomalies"].items()}
        for k, n in counts.items():
            totals[k] += n
        rows.append(
            {
                "run": i,
                "seed": cfg.seed,
                "valid": result["valid"],
                "error": result.get("error"),
                "anomalies": {k: n for k, n in counts.items() if n},
                "acknowledged": result["stats"].get("acknowledged", 0),
                "faults": result["run"].get("faults-applied"),
                "faults-max-concurrent": result["run"].get("faults-max-concurrent"),
                "indeterminate": result["stats"].get("send-info", 0)
                + result["stats"].get("send-pending", 0),
                "unchecked": result["unchecked"],
                "dir": result["run"]["run-dir"],
            }
        )
        print(_row_text(rows[-1]), flush=True)
        if stop_on_failure and result["valid"] is False:
            break
    summary = {
        "runs": len(rows),
        "valid": sum(1 for r in rows if r["valid"] is True),
        "invalid": sum(1 for r in rows if r["valid"] is False),
        "unknown": sum(1 for r in rows if r["valid"] == "unknown"),
        "errors": sum(1 for r in rows if r["error"]),
        "totals": totals,
        "acknowledged": sum(r["acknowledged"] for r in rows),
        "indeterminate": sum(r["indeterminate"] for r in rows),
        "config": base.to_json(),
        "rows": rows,
    }
    (out_dir / "campaign.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _row_text(row: dict[str, Any]) -> str:
    anomalies = ", ".join(f"{k} {n}" for k, n in row["anomalies"].items()) or "no anomalies"
    extra = f"; error: {row['error']}" if row.get("error") else ""
    unchecked = ""
    if row["valid"] == "unknown" and row["unchecked"]:
        more = len(row["unchecked"]) - 1
        unchecked = f"; unknown because {row['unchecked'][0]}" + (
            f" (+{more} more)" if more else ""
        )
    elif row["unchecked"]:
        unchecked = f"; {len(row['unchecked'])} unchecked"
    return (
        f"run {row['run']} seed {row['seed']}: valid={json.dumps(row['valid'])}, "
        f"{row['acknowledged']} acknowledged, {row['indeterminate']} indeterminate, "
        f"{row['faults']} faults (at most {row['faults-max-concurrent']} at once), {anomalies}"
        f"{unchecked}{extra} ({row['dir']})"
    )
