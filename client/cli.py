"""The `minibroker` command line (entry point `client.cli:main`).

    minibroker dev                      a local cluster in the foreground
    minibroker controller|broker ARGS   run a server (`python -m controller|broker ARGS`)
    minibroker topic create|list|describe|delete
    minibroker produce TOPIC            stdin lines -> records
    minibroker consume TOPIC            records -> stdout
    minibroker cluster                  brokers and controller
    minibroker cluster health           healthy or not, and why (exit code 1 when not)
    minibroker debug replica-log T P    one broker's replica of a partition, batch by batch

Client commands take -b/--bootstrap-server (also before the command: `minibroker -b
HOST:PORT topic list`; env MINIBROKER_BOOTSTRAP_SERVERS; default 127.0.0.1:9092).
Errors print one line on stderr and exit 1; --debug shows the traceback and the
client's debug log. The servers are started as subprocesses by module name, never
imported.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import uvloop

from client.admin import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_MAX_BATCHES,
    AsyncAdmin,
    LeaderElection,
    PartitionDescription,
    ReplicaLogDescription,
    TopicDescription,
    parse_address,
)
from client.consumer import AsyncConsumer
from client.dev_cluster import DevCluster, DevClusterError
from client.errors import LogTruncationError, MinibrokerError
from client.health import ClusterHealth, is_leaderless, is_under_replicated, render_text
from client.producer import AsyncProducer, parse_acks
from client.types import ConsumerRecord, OffsetAndMetadata, RecordMetadata, TopicPartition
from protocol.errors import ErrorCode

T = TypeVar("T")

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "MINIBROKER_BOOTSTRAP_SERVERS"
# How long produce/consume wait for a topic to show up (a new one takes milliseconds).
TOPIC_WAIT_MS = 10_000
LOG_FORMAT = "%(asctime)s %(levelname)s [client] %(name)s: %(message)s"


# ------------------------------------------------------------------ plumbing


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(dict)["debug"] = True
        logging.getLogger().setLevel(logging.DEBUG)


def _debug_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_debug,
        help="Show tracebacks and the client's debug log.",
    )(f)


def _resolve_bootstrap(
    ctx: click.Context, _param: click.Parameter | None, value: str | None
) -> str:
    # The command's own -b wins, then `minibroker -b ...`, then the env var, then the default.
    if value:
        return value
    root = ctx.find_root().obj or {}
    return root.get("bootstrap") or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP


def client_command(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options every command that talks to a cluster has."""
    f = click.option(
        "-b",
        "--bootstrap-server",
        "bootstrap",
        default=None,
        callback=_resolve_bootstrap,
        help="Brokers to bootstrap from, HOST:PORT[,HOST:PORT...] (`minibroker dev` "
        f"prints this list).  [default: `minibroker -b`, else env {BOOTSTRAP_ENV}, "
        f"else {DEFAULT_BOOTSTRAP}]",
    )(f)
    return _debug_option(f)


def _is_debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def run(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run a coroutine on uvloop, turning errors into one line and exit code 1."""
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(fn(*args, **kwargs))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit:
        raise
    except (MinibrokerError, ValueError, OSError) as exc:
        if _is_debug():
            raise
        _fail(str(exc))
    except Exception as exc:
        if _is_debug():
            raise
        _fail(f"unexpected {type(exc).__name__}: {exc} (run again with --debug for details)")


def _parse_configs(pairs: tuple[str, ...]) -> dict[str, str]:
    configs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--config")
        configs[key.strip()] = value.strip()
    return configs


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _nodes(ids: tuple[int, ...]) -> str:
    return "[" + " ".join(map(str, ids)) + "]"


# ------------------------------------------------------------------ the group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    is_flag=True,
    envvar="MINIBROKER_DEBUG",
    help="Show tracebacks and the client's debug log.",
)
@click.option(
    "-b",
    "--bootstrap-server",
    "bootstrap",
    default=None,
    help="Brokers for every client command, HOST:PORT[,HOST:PORT...]  "
    f"[default: env {BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP}]",
)
@click.version_option(package_name="minibroker", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, debug: bool, bootstrap: str | None) -> None:
    """minibroker: a replicated, Kafka-style log broker with leader epochs.

    Start a local cluster with `minibroker dev`, then in another terminal:

    \b
      minibroker topic create t --partitions 3
      seq 1 10 | minibroker produce t
      minibroker consume t --from-beginning -n 10
    """
    obj = ctx.ensure_object(dict)
    obj["debug"] = obj.get("debug", False) or debug
    obj["bootstrap"] = bootstrap
    logging.basicConfig(
        level=logging.DEBUG if obj["debug"] else logging.WARNING,
        format=LOG_FORMAT,
        stream=sys.stderr,
    )


# ------------------------------------------------------------------ servers


def _exec_module(module: str, args: tuple[str, ...]) -> NoReturn:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: signals and the exit code are the server's own.
    os.execve(sys.executable, [sys.executable, "-m", module, *args], env)


_PASSTHROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def controller(args: tuple[str, ...]) -> None:
    """Run the controller: `python -m controller ARGS` (try `minibroker controller --help`)."""
    _exec_module("controller", args)


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def broker(args: tuple[str, ...]) -> None:
    """Run a broker: `python -m broker ARGS` (try `minibroker broker --help`)."""
    _exec_module("broker", args)


@cli.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("minibroker-data"),
    show_default=True,
    help="Where the controller (controller/), the brokers (broker-N/) and the logs "
    "(logs/) live. Reused across runs.",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, 32),
    default=3,
    show_default=True,
    help="Number of brokers (node ids 1..N).",
)
@click.option(
    "--base-port",
    type=click.IntRange(1, 65535),
    default=9092,
    show_default=True,
    help="Port of broker 1; broker N listens on base-port + 2*(N-1) (9092, 9094, 9096).",
)
@click.option(
    "--controller-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Controller port.  [default: base-port + 1, i.e. 9093]",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--startup-timeout",
    type=click.FloatRange(1, 600),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the controller and every broker to be up.",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(1, 600),
    default=20.0,
    show_default=True,
    help="Seconds to wait for each group (brokers, then controller) after SIGTERM "
    "before killing it.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Log level of the servers (their logs go to DATA_DIR/logs/).",
)
def dev(
    data_dir: Path,
    brokers: int,
    base_port: int,
    controller_port: int | None,
    host: str,
    startup_timeout: float,
    stop_timeout: float,
    log_level: str,
) -> None:
    """Run a local cluster in the foreground: one controller and N brokers.

    Prints the bootstrap address once every broker is up; Ctrl-C (or SIGTERM) stops
    the brokers, then the controller, and exits 0 when all stopped cleanly. If a
    server dies or a port is busy it exits 1 and shows that server's last log lines.
    """
    try:
        cluster = DevCluster(
            data_dir=data_dir,
            brokers=brokers,
            base_port=base_port,
            controller_port=controller_port,
            host=host,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            log_level=log_level.upper(),
        )
    except DevClusterError as exc:
        _fail(str(exc))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(cluster.run())
    sys.exit(code)


# ------------------------------------------------------------------ cluster and topics


@cli.group("cluster", invoke_without_command=True)
@click.option(
    "-b",
    "--bootstrap-server",
    "bootstrap",
    default=None,
    help="Brokers to bootstrap from, HOST:PORT[,HOST:PORT...] (also for the subcommands).  "
    f"[default: `minibroker -b`, else env {BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP}]",
)
@_debug_option
@click.pass_context
def cluster_cmd(ctx: click.Context, bootstrap: str | None) -> None:
    """Show the cluster id, the controller and the brokers (`minibroker cluster`),
    or check the cluster's health (`minibroker cluster health`)."""
    if bootstrap:
        # `minibroker cluster -b X health`: the subcommand's default comes from the root.
        ctx.find_root().ensure_object(dict)["bootstrap"] = bootstrap
    if ctx.invoked_subcommand is not None:
        return
    address = _resolve_bootstrap(ctx, None, bootstrap)

    async def go() -> None:
        async with AsyncAdmin(address, client_id="minibroker-cli") as admin:
            desc = await admin.describe_cluster()
        click.echo(f"cluster id: {desc.cluster_id}  controller: {desc.controller_id}")
        rows = [
            [
                str(b.node_id),
                f"{b.host}:{b.port}",
                "fenced" if b.is_fenced else "active",
                str(b.broker_epoch),
            ]
            for b in desc.brokers
        ]
        click.echo(_table(["ID", "ADDRESS", "STATE", "BROKER-EPOCH"], rows))

    run(go)


def _check_address(
    _ctx: click.Context,
    _param: click.Parameter,
    value: str | None,
    *,
    default_port: int | None = DEFAULT_CONTROLLER_PORT,
) -> str | None:
    if value is None:
        return None
    try:
        parse_address(value, default_port)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@cluster_cmd.command("health")
@click.option(
    "--controller",
    "controller",
    default=None,
    metavar="HOST:PORT",
    envvar="MINIBROKER_CONTROLLER",
    callback=_check_address,
    help="Also ask the controller (port 9093 if left out): its metadata is then the one "
    "evaluated, and an unreachable controller makes the cluster unhealthy. Without it "
    "the verdict rests on a broker's metadata image and the controller's reachability "
    "is unknown.  [env MINIBROKER_CONTROLLER; default: do not ask the controller]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="Keep checking every --interval and print the report whenever it changes "
    "(with --json: one object per line); Ctrl-C or --timeout to stop.",
)
@click.option(
    "-e",
    "--exit-when-healthy",
    is_flag=True,
    help="Keep checking (as --watch) until the cluster is healthy, then exit 0.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="With --watch / --exit-when-healthy: stop after this long; the exit code is "
    "then that of the last check (1 when unhealthy).  [default: no limit]",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Time between checks with --watch / --exit-when-healthy.",
)
@click.option(
    "--probe/--no-probe",
    default=True,
    show_default=True,
    help="Check that every broker the metadata calls live answers (DescribeLogDirs, "
    "which also lists its stray replicas); a killed broker stays unfenced until the "
    "controller's session timeout.",
)
@click.option(
    "--request-timeout-ms",
    type=click.IntRange(min=1),
    default=5_000,
    show_default=True,
    help="Time limit of each request (and connection attempt) of a check.",
)
@client_command
def cluster_health(
    controller: str | None,
    as_json: bool,
    watch: bool,
    exit_when_healthy: bool,
    timeout: float | None,
    interval: float,
    probe: bool,
    request_timeout_ms: int,
    bootstrap: str,
) -> None:
    """Is the cluster healthy? In the manner of `rpk cluster health`.

    \b
    Unhealthy reasons:
      no_broker_reachable          no bootstrap broker answered
      controller_unreachable       --controller did not answer
      no_controller                the metadata names no controller
      no_live_brokers              no broker is registered and unfenced
      brokers_down                 a broker is fenced or does not answer
      offline_log_dirs             a broker's log directory failed (full or failing disk)
      leaderless_partitions        a partition has no leader (-1)
      under_replicated_partitions  a partition's ISR is smaller than its replicas

    Also listed, not a reason: stray replicas, directories a broker set aside as
    <topic>-<partition>.<uuid>-stray because the metadata does not assign them
    (never deleted automatically; check them, then delete or restore them).

    Exit code 0 when healthy, 1 when not (or when --timeout passed first).
    For scripts and container health checks:
    `minibroker cluster health --exit-when-healthy --timeout 30`.
    """
    watching = watch or exit_when_healthy
    code = run(
        _cluster_health,
        bootstrap,
        controller,
        as_json,
        watching,
        exit_when_healthy,
        timeout if watching else None,
        interval,
        probe,
        request_timeout_ms,
    )
    sys.exit(code)


async def _cluster_health(
    bootstrap: str,
    controller: str | None,
    as_json: bool,
    watching: bool,
    exit_when_healthy: bool,
    timeout: float | None,
    interval: float,
    probe: bool,
    request_timeout_ms: int,
) -> int:
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    admin = AsyncAdmin(
        bootstrap,
        client_id="minibroker-cli",
        request_timeout_ms=request_timeout_ms,
        bootstrap_retries=1 if watching else 2,
    )
    last_key: tuple[Any, ...] | None = None
    try:
        while True:
            health = await admin.cluster_health(
                controller=controller,
                probe_brokers=probe,
                probe_timeout_ms=min(request_timeout_ms, 3_000),
            )
            if not watching:
                _print_health(health, as_json, one_line=False)
                return 0 if health.healthy else 1
            if health.state_key() != last_key:
                if last_key is not None and not as_json:
                    click.echo()
                _print_health(health, as_json, one_line=True)
                last_key = health.state_key()
            if health.healthy and exit_when_healthy:
                return 0
            if deadline is not None and loop.time() + interval > deadline:
                if deadline - loop.time() > 0:
                    await asyncio.sleep(deadline - loop.time())
                    continue  # one last check right at the deadline
                if not as_json:
                    click.echo(f"timed out after {timeout:g} s", err=True)
                return 0 if health.healthy else 1
            await asyncio.sleep(interval)
    finally:
        await admin.close()


def _print_health(health: ClusterHealth, as_json: bool, *, one_line: bool) -> None:
    if as_json:
        if one_line:
            click.echo(json.dumps({"time": round(time.time(), 3), **health.to_dict()}))
        else:
            click.echo(json.dumps(health.to_dict(), indent=2))
        return
    if one_line:
        click.echo(time.strftime("%Y-%m-%d %H:%M:%S"))
    click.echo(render_text(health))


@cli.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option(
    "-p",
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Number of partitions.  [default: the controller's --default-partitions]",
)
@click.option(
    "-r",
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas per partition.  [default: the controller's --default-replication-factor]",
)
@click.option(
    "-c",
    "--config",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic config, repeatable (Kafka names: retention.ms, min.insync.replicas, "
    "unclean.leader.election.enable, ...).",
)
@client_command
def topic_create(
    name: str,
    partitions: int | None,
    replication_factor: int | None,
    configs: tuple[str, ...],
    bootstrap: str,
) -> None:
    """Create topic NAME."""
    parsed = _parse_configs(configs)

    async def go() -> None:
        async with AsyncAdmin(bootstrap, client_id="minibroker-cli") as admin:
            created = await admin.create_topic(
                name,
                partitions if partitions is not None else -1,
                replication_factor if replication_factor is not None else -1,
                parsed,
            )
        click.echo(
            f"created topic {created.name}: {_plural(created.num_partitions, 'partition')}, "
            f"replication factor {created.replication_factor}"
        )

    run(go)


@topic.command("list")
@client_command
def topic_list(bootstrap: str) -> None:
    """List topics with their partition count and replication factor."""

    async def go() -> list[TopicDescription]:
        async with AsyncAdmin(bootstrap, client_id="minibroker-cli") as admin:
            return await admin.describe_topics(include_offsets=False)

    topics = run(go)
    rows = [[t.name, str(len(t.partitions)), str(t.replication_factor)] for t in topics]
    click.echo(_table(["NAME", "PARTITIONS", "REPLICAS"], rows))


@topic.command("describe")
@click.argument("names", nargs=-1)
@click.option(
    "--under-replicated",
    "--under-replicated-partitions",
    "under_replicated",
    is_flag=True,
    help="Only partitions whose ISR is smaller than their replica set.",
)
@click.option(
    "--unavailable",
    "--unavailable-partitions",
    "unavailable",
    is_flag=True,
    help="Only partitions without a leader. With --under-replicated: partitions that are either.",
)
@client_command
def topic_describe(
    names: tuple[str, ...], under_replicated: bool, unavailable: bool, bootstrap: str
) -> None:
    """Describe topics (all when no NAME): per partition its leader, leader epoch,
    replicas, ISR, offline replicas (on a broker that is down or fenced, e.g. for a
    failed disk), status, log start offset and high watermark (as the leader reports
    them). STATUS is `ok`, or `under-replicated` (ISR smaller than the replicas)
    and/or `leaderless` (no leader: unavailable until an ISR member returns)."""

    async def go() -> list[TopicDescription]:
        async with AsyncAdmin(bootstrap, client_id="minibroker-cli") as admin:
            return await admin.describe_topics(list(names) or None)

    topics = run(go)

    def wanted(p: PartitionDescription) -> bool:
        if not (under_replicated or unavailable):
            return True
        return (under_replicated and is_under_replicated(p.replicas, p.isr)) or (
            unavailable and is_leaderless(p.leader)
        )

    blocks = []
    for t in topics:
        shown = [p for p in t.partitions if wanted(p)]
        if not shown and (under_replicated or unavailable):
            continue
        with_error = any(q.error for q in shown)
        rows = [
            [
                str(p.partition),
                str(p.leader) if p.leader >= 0 else "none",
                str(p.leader_epoch),
                _nodes(p.replicas),
                _nodes(p.isr),
                _nodes(p.offline_replicas) if p.offline_replicas else "-",
                _partition_status(p),
                str(p.log_start_offset) if p.log_start_offset >= 0 else "-",
                str(p.high_watermark) if p.high_watermark >= 0 else "-",
            ]
            + ([p.error or ""] if with_error else [])
            for p in shown
        ]
        header = [
            "PARTITION",
            "LEADER",
            "EPOCH",
            "REPLICAS",
            "ISR",
            "OFFLINE",
            "STATUS",
            "LOG-START-OFFSET",
            "HIGH-WATERMARK",
        ]
        if with_error:
            header.append("ERROR")
        n_under = sum(is_under_replicated(p.replicas, p.isr) for p in t.partitions)
        n_leaderless = sum(is_leaderless(p.leader) for p in t.partitions)
        notes = [f"{n_under} under-replicated"] if n_under else []
        notes += [f"{n_leaderless} leaderless"] if n_leaderless else []
        summary = (
            f"{t.name}  ({_plural(len(t.partitions), 'partition')}, replication factor "
            f"{t.replication_factor}, id {t.topic_id or '-'}"
            + "".join(f", {n}" for n in notes)
            + ")"
        )
        blocks.append(summary + "\n" + _table(header, rows))
    if blocks:
        click.echo("\n\n".join(blocks))
    elif under_replicated or unavailable:
        which = " or ".join(
            w
            for w, on in (("under-replicated", under_replicated), ("leaderless", unavailable))
            if on
        )
        click.echo(f"no {which} partitions", err=True)


def _partition_status(p: PartitionDescription) -> str:
    states = []
    if is_leaderless(p.leader):
        states.append("leaderless")
    if is_under_replicated(p.replicas, p.isr):
        states.append("under-replicated")
    return ",".join(states) or "ok"


@topic.command("delete")
@click.argument("names", nargs=-1, required=True)
@client_command
def topic_delete(names: tuple[str, ...], bootstrap: str) -> None:
    """Delete topics."""

    async def go() -> None:
        async with AsyncAdmin(bootstrap, client_id="minibroker-cli") as admin:
            await admin.delete_topics(names)

    run(go)
    for name in names:
        click.echo(f"deleted topic {name}")


@topic.command("elect-leader")
@click.argument("name")
@click.option(
    "-p",
    "--partition",
    "partitions",
    type=int,
    multiple=True,
    required=True,
    metavar="N",
    help="A leaderless partition of NAME (repeat for several).",
)
@click.option(
    "--unclean",
    is_flag=True,
    help="Required: elect a replica outside the ISR when no in-sync replica is up, "
    "accepting the loss of acknowledged records it lacks.",
)
@click.option(
    "--replica",
    type=int,
    default=None,
    metavar="ID",
    help="The broker whose replica to elect (compare them with `minibroker debug "
    "replica-log`).  [default: the controller's choice: the first live replica in "
    "replica order, one known to have lost its data last]",
)
@client_command
def topic_elect_leader(
    name: str, partitions: tuple[int, ...], unclean: bool, replica: int | None, bootstrap: str
) -> None:
    """Elect a leader for leaderless partitions (kafka-leader-election.sh --election-type
    unclean): the way back when no in-sync replica can return, e.g. the last one lost
    its disk. Partitions that have a leader are left alone."""
    if not unclean:
        _fail(
            "only unclean elections are supported (a leaderless partition gets its in-sync "
            "replica back as leader by itself); pass --unclean to elect a replica outside the "
            "ISR, accepting the loss of acknowledged records it lacks"
        )

    async def go() -> dict[TopicPartition, LeaderElection]:
        async with AsyncAdmin(bootstrap, client_id="minibroker-cli") as admin:
            tps = [TopicPartition(name, p) for p in partitions]
            return await admin.elect_leaders(tps, unclean=True, replica=replica)

    failed = 0
    for tp, result in sorted(run(go).items()):
        if result.error is None:
            click.echo(f"{tp}: broker {result.leader} leads at leader epoch {result.leader_epoch}")
        elif result.error.error_code == ErrorCode.ELECTION_NOT_NEEDED:
            click.echo(f"{tp}: nothing to do, {result.error.message}")
        else:
            click.echo(f"{tp}: {result.error}", err=True)
            failed += 1
    if failed:
        _fail(f"no leader elected for {_plural(failed, 'partition')}")


# ------------------------------------------------------------------ debug


@cli.group("debug")
def debug_group() -> None:
    """Inspect the internals of a running cluster (read-only)."""


@debug_group.command("replica-log")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("partition", type=click.IntRange(min=0))
@click.option(
    "--broker",
    "broker_id",
    type=click.IntRange(min=0),
    default=None,
    metavar="ID",
    help="The broker whose replica to show (its address comes from the cluster "
    "metadata; fenced brokers that still run can be inspected too).",
)
@click.option(
    "--at",
    "address",
    default=None,
    metavar="HOST:PORT",
    help="Ask the broker at this address instead (no bootstrap needed).",
    callback=lambda _ctx, _param, value: _check_address(_ctx, _param, value, default_port=None),
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for tools).")
@click.option(
    "--no-batches",
    is_flag=True,
    help="Leave out the batch list (offsets, epochs and the epoch cache only).",
)
@click.option(
    "--max-batches",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_BATCHES,
    show_default=True,
    help="List at most this many batches, from the log start (the broker caps it too).",
)
@client_command
def debug_replica_log(
    topic_name: str,
    partition: int,
    broker_id: int | None,
    address: str | None,
    as_json: bool,
    no_batches: bool,
    max_batches: int,
    bootstrap: str,
) -> None:
    """One broker's replica of TOPIC PARTITION, as it is on that broker's disk (in the
    manner of kafka-dump-log): log start offset, log end offset, high watermark, the
    leader, leader epoch, partition epoch and ISR that broker knows, its leader-epoch
    cache, and a table of batches (base offset, last offset, leader epoch, CRC, size).

    Pass --broker ID or --at HOST:PORT."""
    if (broker_id is None) == (address is None):
        raise click.UsageError("pass exactly one of --broker ID and --at HOST:PORT")

    async def go() -> ReplicaLogDescription:
        admin = AsyncAdmin(bootstrap, client_id="minibroker-cli")
        try:
            if broker_id is not None:
                await admin.start()
            return await admin.describe_replica_log(
                broker_id if broker_id is not None else str(address),
                topic_name,
                partition,
                include_batches=not no_batches,
                max_batches=max_batches,
            )
        finally:
            await admin.close()

    replica = run(go)
    if as_json:
        click.echo(json.dumps(replica.to_dict()))
        return
    click.echo(render_replica_log(replica, batches=not no_batches))


def render_replica_log(r: ReplicaLogDescription, *, batches: bool = True) -> str:
    where = f"broker {r.broker_id} at " if r.broker_id >= 0 else ""
    leader = str(r.leader_id) if r.leader_id >= 0 else "none"
    lines = [
        f"replica of {r.topic}-{r.partition} on {where}{r.host}:{r.port}",
        f"log start offset:  {r.log_start_offset}",
        f"log end offset:    {r.log_end_offset}",
        f"high watermark:    {r.high_watermark}",
        f"leader:            {leader} (leader epoch {r.leader_epoch}, "
        f"partition epoch {r.partition_epoch})",
        f"ISR:               {_nodes(r.isr)}",
        "",
        f"leader-epoch cache ({len(r.epoch_entries)} "
        f"{'entry' if len(r.epoch_entries) == 1 else 'entries'}):",
    ]
    if r.epoch_entries:
        lines.append(
            _table(
                ["EPOCH", "START-OFFSET"],
                [[str(e.epoch), str(e.start_offset)] for e in r.epoch_entries],
            )
        )
    if batches:
        listed_to = r.batches[-1].last_offset + 1 if r.batches else r.log_start_offset
        more = (
            ", the first ones only: more with --max-batches" if listed_to < r.log_end_offset else ""
        )
        lines += ["", f"batches ({len(r.batches)}{more}):"]
        if r.batches:
            lines.append(
                _table(
                    ["BASE-OFFSET", "LAST-OFFSET", "EPOCH", "CRC", "SIZE"],
                    [
                        [
                            str(b.base_offset),
                            str(b.last_offset),
                            str(b.leader_epoch),
                            f"{b.crc:08x}",
                            str(b.size),
                        ]
                        for b in r.batches
                    ],
                )
            )
    return "\n".join(lines)


# ------------------------------------------------------------------ produce


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "-k",
    "--key-separator",
    default=None,
    metavar="SEP",
    help="Split each line at the first SEP into key and value (a line without SEP "
    "is an error). Default: no key.",
)
@click.option(
    "--acks",
    type=click.Choice(["0", "1", "all", "-1"]),
    default="all",
    show_default=True,
    help="0: do not wait; 1: the leader wrote it; all: every in-sync replica has it.",
)
@click.option(
    "-p",
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="Write every record to this partition. Default: murmur2 of the key, or "
    "sticky batches across partitions without a key.",
)
@click.option(
    "-z",
    "--compression",
    type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
    default="none",
    show_default=True,
    help="Batch compression.",
)
@click.option(
    "--linger-ms",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How long a batch waits for more records.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=16_384,
    show_default=True,
    help="Bytes per partition batch.",
)
@click.option(
    "--delivery-timeout-ms",
    type=click.IntRange(min=1),
    default=30_000,
    show_default=True,
    help="Give up on a record (retrying included) after this long.",
)
@client_command
def produce(
    topic_name: str,
    key_separator: str | None,
    acks: str,
    partition: int | None,
    compression: str,
    linger_ms: int,
    batch_size: int,
    delivery_timeout_ms: int,
    bootstrap: str,
) -> None:
    """Produce stdin lines to TOPIC, one record per line (the newline stripped).

    A summary goes to stderr; the exit code is 1 if any record was not delivered."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    sep = key_separator.encode() if key_separator is not None else None
    stats = run(
        _produce,
        bootstrap,
        topic_name,
        sep,
        parse_acks(acks),
        partition,
        compression,
        linger_ms,
        batch_size,
        delivery_timeout_ms,
    )
    ok, failed, first_error, per_partition, seconds = stats
    parts = ", ".join(f"{p}: {n}" for p, n in sorted(per_partition.items()))
    click.echo(
        f"produced {ok} records to {topic_name} in {seconds:.2f} s"
        + (f" (partition {parts})" if parts else ""),
        err=True,
    )
    if failed:
        _fail(f"{failed} records were not delivered; first error: {first_error}")


async def _produce(
    bootstrap: str,
    topic_name: str,
    sep: bytes | None,
    acks: int,
    partition: int | None,
    compression: str,
    linger_ms: int,
    batch_size: int,
    delivery_timeout_ms: int,
) -> tuple[int, int, BaseException | None, Counter[int], float]:
    started = time.monotonic()
    per_partition: Counter[int] = Counter()
    failures: list[BaseException] = []

    def tally(future: asyncio.Future[RecordMetadata]) -> None:
        if future.cancelled():
            failures.append(asyncio.CancelledError())
            return
        exc = future.exception()
        if exc is not None:
            failures.append(exc)
        else:
            per_partition[future.result().partition] += 1

    producer = AsyncProducer(
        bootstrap,
        client_id="minibroker-cli",
        acks=acks,
        compression_type=compression,
        linger_ms=linger_ms,
        batch_size=batch_size,
        delivery_timeout_ms=delivery_timeout_ms,
        request_timeout_ms=min(delivery_timeout_ms, 30_000),
        max_block_ms=TOPIC_WAIT_MS,
    )
    async with producer:
        await producer.partitions_for(topic_name)  # fail fast on a missing topic
        chunks = _stdin_chunks()
        tail = b""
        lineno = 0
        while True:
            chunk = await chunks.get()
            if not chunk:
                break
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                lineno += 1
                await _send_line(producer, topic_name, line, sep, partition, lineno, tally)
        if tail:
            lineno += 1
            await _send_line(producer, topic_name, tail, sep, partition, lineno, tally)
        await producer.flush()
    first = failures[0] if failures else None
    ok = sum(per_partition.values())
    return ok, len(failures), first, per_partition, time.monotonic() - started


def _stdin_chunks(max_chunks: int = 16) -> asyncio.Queue[bytes]:
    """Chunks of stdin (b"" at the end) from a daemon thread: a read blocked on a
    terminal must not keep the process alive after Ctrl-C, as an executor thread would."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(max_chunks)
    # The raw fd, not sys.stdin.buffer: a daemon thread blocked inside the buffered
    # reader holds its lock, which aborts the interpreter at exit.
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):  # no stdin at all: nothing to send
        chunks.put_nowait(b"")
        return chunks

    def pump() -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone
            if not chunk:
                return

    threading.Thread(target=pump, name="minibroker-stdin", daemon=True).start()
    return chunks


async def _send_line(
    producer: AsyncProducer,
    topic_name: str,
    line: bytes,
    sep: bytes | None,
    partition: int | None,
    lineno: int,
    tally: Callable[[asyncio.Future[RecordMetadata]], None],
) -> None:
    key = None
    if sep is not None:
        key, found, value = line.partition(sep)
        if not found:
            raise ValueError(
                f"line {lineno} has no key separator {sep.decode()!r} (records before it were sent)"
            )
    else:
        value = line
    future = await producer.send(topic_name, value, key=key, partition=partition)
    future.add_done_callback(tally)


# ------------------------------------------------------------------ consume

_FORMATS = ("value", "full", "json")


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode(errors="backslashreplace")


def _formatter(fmt: str) -> Callable[[ConsumerRecord], bytes]:
    if fmt == "value":
        return lambda r: (r.value or b"") + b"\n"
    if fmt == "full":
        return lambda r: (
            f"partition={r.partition} offset={r.offset} leader_epoch={r.leader_epoch} "
            f"timestamp={r.timestamp} key={_text(r.key)} value={_text(r.value)}\n"
        ).encode()
    if fmt == "json":
        return lambda r: (
            json.dumps(
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "offset": r.offset,
                    "leader_epoch": r.leader_epoch,
                    "timestamp": r.timestamp,
                    "key": None if r.key is None else _text(r.key),
                    "value": None if r.value is None else _text(r.value),
                    "headers": {k: _text(v) for k, v in r.headers},
                }
            )
            + "\n"
        ).encode()
    template = codecs.decode(fmt, "unicode_escape")  # "\n", "\t" as typed in a shell

    def render(r: ConsumerRecord) -> bytes:
        fields = {
            "t": r.topic,
            "p": str(r.partition),
            "o": str(r.offset),
            "e": str(r.leader_epoch),
            "T": str(r.timestamp),
            "k": _text(r.key),
            "v": _text(r.value),
            "%": "%",
        }
        out: list[str] = []
        i = 0
        while i < len(template):
            c = template[i]
            if c == "%" and i + 1 < len(template) and template[i + 1] in fields:
                out.append(fields[template[i + 1]])
                i += 2
            else:
                out.append(c)
                i += 1
        return "".join(out).encode()

    return render


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the log start offset. Default: only new records.",
)
@click.option(
    "-o",
    "--offset",
    type=click.IntRange(min=0),
    default=None,
    help="Start at this offset (in every consumed partition).",
)
@click.option(
    "-p",
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Consume only this partition (repeatable). Default: all partitions.",
)
@click.option(
    "-n", "--num", type=click.IntRange(min=1), default=None, help="Exit after this many records."
)
@click.option(
    "-f",
    "--format",
    "fmt",
    default="value",
    show_default=True,
    help="value (the value and a newline), full (partition, offset, leader epoch, "
    "timestamp, key, value), json (one object per line), or a template with "
    "%t topic, %p partition, %o offset, %e leader epoch, %T timestamp, %k key, "
    "%v value, and \\n, \\t escapes.",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=None,
    help="Exit when no record arrived for this long. Default: wait forever.",
)
@click.option(
    "--reset",
    "reset",
    type=click.Choice(["none", "earliest", "latest"]),
    default="none",
    show_default=True,
    help="On a detected log truncation (KIP-320) or an offset out of range: 'none' "
    "reports it and exits 1; 'earliest'/'latest' print a warning and continue from the "
    "divergence offset (out of range: from the log start / end).",
)
@client_command
def consume(
    topic_name: str,
    from_beginning: bool,
    offset: int | None,
    partitions: tuple[int, ...],
    num: int | None,
    fmt: str,
    timeout_ms: int | None,
    reset: str,
    bootstrap: str,
) -> None:
    """Print records of TOPIC to stdout (Ctrl-C to stop)."""
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    render = _formatter(fmt)
    count = run(
        _consume,
        bootstrap,
        topic_name,
        from_beginning,
        offset,
        partitions,
        num,
        render,
        timeout_ms,
        reset,
    )
    if num is not None and count < num:
        _fail(f"only {count} of {num} records arrived before --timeout-ms {timeout_ms} passed")


async def _consume(
    bootstrap: str,
    topic_name: str,
    from_beginning: bool,
    offset: int | None,
    partitions: tuple[int, ...],
    num: int | None,
    render: Callable[[ConsumerRecord], bytes],
    timeout_ms: int | None,
    reset: str = "none",
) -> int:
    out = sys.stdout.buffer
    count = 0

    def warn_truncation(tp: TopicPartition, position: int, divergence: OffsetAndMetadata) -> None:
        click.echo(
            f"warning: log truncation on topic {tp.topic} partition {tp.partition}: position "
            f"{position}, divergence offset {divergence.offset}; continuing from "
            f"{divergence.offset} (--reset {reset})",
            err=True,
        )

    consumer = AsyncConsumer(
        bootstrap,
        client_id="minibroker-cli",
        auto_offset_reset=reset,
        on_truncation=warn_truncation,
    )
    async with consumer:
        existing = await consumer.partitions_for_topic(topic_name, timeout_ms=TOPIC_WAIT_MS)
        wanted = sorted(partitions) if partitions else sorted(existing)
        missing = [p for p in wanted if p not in existing]
        if missing:
            raise ValueError(
                f"topic {topic_name} has no partition {missing[0]} (it has {len(existing)})"
            )
        tps = [TopicPartition(topic_name, p) for p in wanted]
        consumer.assign(tps)
        for tp in tps:
            if offset is not None:
                consumer.seek(tp, offset)
        if offset is None:
            if from_beginning:
                consumer.seek_to_beginning(*tps)
            else:
                consumer.seek_to_end(*tps)
        last_record = time.monotonic()
        try:
            while num is None or count < num:
                wait_ms = 1_000
                if timeout_ms is not None:
                    left = timeout_ms - (time.monotonic() - last_record) * 1000
                    if left <= 0:
                        break
                    wait_ms = int(min(wait_ms, left)) + 1
                limit = None if num is None else num - count
                batches = await consumer.poll(timeout_ms=wait_ms, max_records=limit)
                if not batches:
                    continue
                last_record = time.monotonic()
                for records in batches.values():
                    for record in records:
                        out.write(render(record))
                        count += 1
                out.flush()
        except LogTruncationError as exc:
            out.flush()
            tp, divergence = next(iter(exc.divergent_offsets.items()))
            _fail(
                f"log truncation on topic {tp.topic} partition {tp.partition}: position "
                f"{exc.positions.get(tp, -1)}, divergence offset {divergence.offset} "
                "(records consumed from there on are gone); rerun with --offset "
                f"{divergence.offset} or --reset earliest to continue"
            )
        except BrokenPipeError:
            # `consume ... | head`: the reader is gone; stop quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    return count


def _reserve_std_fds() -> None:
    # With stdin/stdout/stderr closed (`<&-`), sockets would get fds 0-2, which uvloop
    # refuses to close; park /dev/null there (open() takes the lowest free fd).
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def main() -> None:
    _reserve_std_fds()
    cli(prog_name="minibroker")


if __name__ == "__main__":
    main()
