"""The operator commands: `minibroker cluster` and `cluster health`, `topic
create|list|describe|delete|elect-leader` and `debug replica-log` (one broker's replica
of a partition, batch by batch)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import click

# ------------------------------------------------------------------ cluster and topics
from client.admin import DEFAULT_MAX_BATCHES
from client.admin import AsyncAdmin
from client.admin import LeaderElection
from client.admin import PartitionDescription
from client.admin import ReplicaLogDescription
from client.admin import TopicDescription
from client.admin import parse_address
from client.cli.plumbing import BOOTSTRAP_ENV
from client.cli.plumbing import DEFAULT_BOOTSTRAP
from client.cli.plumbing import _controller_addresses
from client.cli.plumbing import _debug_option
from client.cli.plumbing import _fail
from client.cli.plumbing import _nodes
from client.cli.plumbing import _parse_configs
from client.cli.plumbing import _plural
from client.cli.plumbing import _resolve_bootstrap
from client.cli.plumbing import _table
from client.cli.plumbing import cli_admin
from client.cli.plumbing import client_command
from client.cli.plumbing import connection_options
from client.cli.plumbing import number_option
from client.cli.plumbing import run
from client.cli.root import cli
from client.health import ClusterHealth
from client.health import is_leaderless
from client.health import is_under_replicated
from client.health import render_text
from client.types import TopicPartition
from protocol.errors import ErrorCode

# ------------------------------------------------------------------ debug


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
        async with cli_admin(address) as admin:
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


def _check_address(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parse_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@cluster_cmd.command("health")
@click.option(
    "--controller",
    "controllers",
    default=None,
    metavar="HOST:PORT[,HOST:PORT...]",
    envvar="MINIBROKER_CONTROLLER",
    callback=_controller_addresses,
    help="Also ask the controller quorum, through any of its controllers (port 9093 if "
    "left out; the others are found from them): every voter must answer, the active "
    "controller's metadata is the one evaluated, and the report has a quorum section. "
    "Without it the verdict rests on a broker's metadata image and the controller's "
    "reachability is unknown.  [env MINIBROKER_CONTROLLER; default: do not ask the "
    "controller]",
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
@number_option(
    "--interval",
    at_least=0.05,
    default=1.0,
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
@number_option(
    "--request-timeout-ms",
    at_least=1,
    default=5_000,
    help="Time limit of each request (and connection attempt) of a check.",
)
@client_command
def cluster_health(
    controllers: list[tuple[str, int]] | None,
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
      controller_unreachable       no --controller answered
      no_active_controller         the controllers answer, but none is the quorum
                                   leader (no majority up, or an election under way)
      controller_voters_down       a quorum voter does not answer, or the active
                                   controller has not had a fetch from it for 3 s
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
        controllers,
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
    controllers: list[tuple[str, int]] | None,
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
        **connection_options(),
    )
    last_key: tuple[Any, ...] | None = None
    try:
        while True:
            health = await admin.cluster_health(
                controller=controllers,
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
@number_option(
    "-p",
    "--partitions",
    at_least=1,
    help="Number of partitions.  [default: the controller's --default-partitions]",
)
@number_option(
    "-r",
    "--replication-factor",
    at_least=1,
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
        async with cli_admin(bootstrap) as admin:
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
        async with cli_admin(bootstrap) as admin:
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
    and/or `leaderless` (no leader: unavailable until an ISR member returns) and/or
    `leader-unreachable` (the leader does not answer but the controller has not fenced
    it yet: its session has not expired)."""

    async def go() -> list[TopicDescription]:
        async with cli_admin(bootstrap) as admin:
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
    if p.leader_unreachable:
        states.append("leader-unreachable")
    if is_under_replicated(p.replicas, p.isr):
        states.append("under-replicated")
    return ",".join(states) or "ok"


@topic.command("delete")
@click.argument("names", nargs=-1, required=True)
@client_command
def topic_delete(names: tuple[str, ...], bootstrap: str) -> None:
    """Delete topics."""

    async def go() -> None:
        async with cli_admin(bootstrap) as admin:
            await admin.delete_topics(names)

    run(go)
    for name in names:
        click.echo(f"deleted topic {name}")


@topic.command("elect-leader")
@click.argument("name", required=False)
@click.option(
    "-p",
    "--partition",
    "partitions",
    type=int,
    multiple=True,
    metavar="N",
    help="A partition of NAME (repeat for several).  [--preferred: default every "
    "partition of NAME, or of the cluster without NAME]",
)
@click.option(
    "--preferred",
    is_flag=True,
    help="Give the leadership back to each partition's preferred replica (the first "
    "listed) where it is in sync (kafka-leader-election.sh --election-type preferred; "
    "the controller also does it by itself, see --auto-leader-rebalance-enable).",
)
@click.option(
    "--unclean",
    is_flag=True,
    help="For leaderless partitions: elect a replica outside the ISR when no in-sync "
    "replica is up, accepting the loss of acknowledged records it lacks.",
)
@click.option(
    "--replica",
    type=int,
    default=None,
    metavar="ID",
    help="With --unclean: the broker whose replica to elect (compare them with "
    "`minibroker debug replica-log`).  [default: the controller's choice: the first "
    "live replica in replica order, one known to have lost its data last]",
)
@client_command
def topic_elect_leader(
    name: str | None,
    partitions: tuple[int, ...],
    preferred: bool,
    unclean: bool,
    replica: int | None,
    bootstrap: str,
) -> None:
    """Elect leaders (kafka-leader-election.sh). --preferred: partitions led again by
    their preferred replica, once it is back in sync after a failure. --unclean: the way
    back for a leaderless partition when no in-sync replica can return, e.g. the last
    one lost its disk. Partitions that need nothing are left alone."""
    if preferred == unclean:
        _fail(
            "say which election: --preferred (back to the preferred replica, once in sync) "
            "or --unclean (a leaderless partition gets a replica outside the ISR, accepting "
            "the loss of acknowledged records it lacks)"
        )
    if preferred and replica is not None:
        _fail("--replica goes with --unclean: a preferred election elects the first replica")
    if unclean and (name is None or not partitions):
        _fail("--unclean needs NAME and the leaderless partitions (-p N)")
    if partitions and name is None:
        _fail("-p N needs the topic NAME")

    async def go() -> dict[TopicPartition, LeaderElection]:
        async with cli_admin(bootstrap) as admin:
            if unclean:
                tps = [TopicPartition(name or "", p) for p in partitions]
                return await admin.elect_leaders(tps, unclean=True, replica=replica)
            if name is not None and not partitions:
                described = await admin.describe_topics([name], include_offsets=False)
                tps = [TopicPartition(name, p.partition) for p in described[0].partitions]
            else:
                tps = [TopicPartition(name or "", p) for p in partitions]
            return await admin.elect_leaders(tps, preferred=True)

    failed = moved = 0
    for tp, result in sorted(run(go).items()):
        if result.error is None:
            moved += 1
            click.echo(f"{tp}: broker {result.leader} leads at leader epoch {result.leader_epoch}")
        elif result.error.error_code == ErrorCode.ELECTION_NOT_NEEDED:
            if unclean:
                click.echo(f"{tp}: nothing to do, {result.error.message}")
        else:
            click.echo(f"{tp}: {result.error}", err=True)
            failed += 1
    if preferred and not moved and not failed:
        click.echo("every partition is led by its preferred replica: nothing to do")
    if failed:
        _fail(f"no leader elected for {_plural(failed, 'partition')}")


@cli.group("debug")
def debug_group() -> None:
    """Inspect the internals of a running cluster (read-only)."""


@debug_group.command("replica-log")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("partition", type=click.IntRange(min=0))
@number_option(
    "--broker",
    "broker_id",
    at_least=0,
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
    callback=_check_address,
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for tools).")
@click.option(
    "--no-batches",
    is_flag=True,
    help="Leave out the batch list (offsets, epochs and the epoch cache only).",
)
@number_option(
    "--max-batches",
    at_least=0,
    default=DEFAULT_MAX_BATCHES,
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
        admin = cli_admin(bootstrap)
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
