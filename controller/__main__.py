"""`python -m controller`: the controller's command line.

Every option also reads `MINIBROKER_<NAME>` from the environment and `<name>` (with
dashes) from the TOML file given with `--config`; precedence is flag > environment >
file > default.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import click

from controller.config import DEFAULT_DATA_DIR, DEFAULT_LISTEN, ControllerConfig, parse_listen
from protocol.connection_limits import parse_per_ip_overrides


def _load_config_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """Eager: read the TOML file into click's default_map before the other options."""
    if not value:
        return
    path = Path(value)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path} is not valid TOML: {exc}") from None
    known = {p.name for p in ctx.command.params if p.name and p.name != "config"}
    defaults: dict[str, Any] = {}
    for key, item in data.items():
        name = key.replace("-", "_")
        if name not in known:
            names = ", ".join(sorted(k.replace("_", "-") for k in known))
            raise click.BadParameter(f"unknown key {key!r} in {path}; known keys: {names}")
        defaults[name] = str(item).lower() if isinstance(item, bool) else item
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _validate_listen(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _env(name: str) -> str:
    return f"MINIBROKER_{name}"


def _default(name: str) -> Any:
    """The ControllerConfig default of `name`, so --help and the config never disagree."""
    return {f.name: f.default for f in dataclasses.fields(ControllerConfig)}[name]


def _validate_overrides(_ctx: click.Context, param: click.Parameter, value: str) -> dict[str, int]:
    try:
        return parse_per_ip_overrides(value or "", option=f"--{param.name}".replace("_", "-"))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command(
    name="controller",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    is_eager=True,
    expose_value=False,
    callback=_load_config_file,
    envvar=_env("CONFIG"),
    show_envvar=True,
    help="TOML file of settings, keys named like the options without dashes in front "
    "(e.g. node-id = 1). Flags and environment variables override it.",
)
@click.option(
    "--node-id",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    envvar=_env("NODE_ID"),
    show_envvar=True,
    help="Controller id, reported to clients as controller_id.",
)
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    callback=_validate_listen,
    envvar=_env("LISTEN"),
    show_envvar=True,
    help="HOST:PORT to listen on for brokers and tools (port 0 picks a free one).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    envvar=_env("DATA_DIR"),
    show_envvar=True,
    help="Directory of the metadata log, its snapshots and meta.properties (created if missing).",
)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(min=1),
    default=4000,
    show_default=True,
    envvar=_env("SESSION_TIMEOUT_MS"),
    show_envvar=True,
    help="A broker without a heartbeat for this long is fenced (its leaderships move).",
)
@click.option(
    "--default-partitions",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    envvar=_env("DEFAULT_PARTITIONS"),
    show_envvar=True,
    help="Partitions of a new topic that does not say.",
)
@click.option(
    "--default-replication-factor",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    envvar=_env("DEFAULT_REPLICATION_FACTOR"),
    show_envvar=True,
    help="Replication factor of a new topic that does not say.",
)
@click.option(
    "--default-min-insync-replicas",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    envvar=_env("DEFAULT_MIN_INSYNC_REPLICAS"),
    show_envvar=True,
    help="min.insync.replicas of a new topic that does not set it.",
)
@click.option(
    "--default-unclean-leader-election",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    show_default=True,
    envvar=_env("DEFAULT_UNCLEAN_LEADER_ELECTION"),
    show_envvar=True,
    help="unclean.leader.election.enable of a new topic that does not set it (bare flag = true).",
)
@click.option(
    "--snapshot-every",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    envvar=_env("SNAPSHOT_EVERY"),
    show_envvar=True,
    help="Metadata records between snapshots; older log files are deleted after one.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=_default("max_connections"),
    show_default=True,
    envvar=_env("MAX_CONNECTIONS"),
    show_envvar=True,
    help="Connections open at once; when full, a new connection replaces the oldest one "
    "that has sent no request, else it is refused (max.connections).",
)
@click.option(
    "--reserved-broker-connections",
    type=click.IntRange(min=0),
    default=_default("reserved_broker_connections"),
    show_default=True,
    envvar=_env("RESERVED_BROKER_CONNECTIONS"),
    show_envvar=True,
    help="Of --max-connections, slots only brokers use (a connection whose first request "
    "is a broker API); a broker opens 3. Other connections beyond the rest are closed.",
)
@click.option(
    "--max-connections-per-ip",
    type=click.IntRange(min=0),
    default=_default("max_connections_per_ip"),
    show_default=True,
    envvar=_env("MAX_CONNECTIONS_PER_IP"),
    show_envvar=True,
    help="Connections from one IP address that are not brokers'; past it a connection is "
    "closed unless its first request is a broker API (max.connections.per.ip).",
)
@click.option(
    "--max-connections-per-ip-overrides",
    default="",
    callback=_validate_overrides,
    envvar=_env("MAX_CONNECTIONS_PER_IP_OVERRIDES"),
    show_envvar=True,
    help="Per-address limits that replace --max-connections-per-ip: ADDRESS:COUNT,... "
    "(IP addresses) (max.connections.per.ip.overrides). [default: none]",
)
@click.option(
    "--first-request-timeout-ms",
    type=click.IntRange(min=1),
    default=_default("first_request_timeout_ms"),
    show_default=True,
    envvar=_env("FIRST_REQUEST_TIMEOUT_MS"),
    show_envvar=True,
    help="Close a connection that sends no whole request within this long of connecting.",
)
@click.option(
    "--connections-max-idle-ms",
    type=click.IntRange(min=1),
    default=_default("connections_max_idle_ms"),
    show_default=True,
    envvar=_env("CONNECTIONS_MAX_IDLE_MS"),
    show_envvar=True,
    help="Close a connection that is not a broker's with nothing received, nothing of its "
    "answers taken and no request in service for this long (connections.max.idle.ms).",
)
@click.option(
    "--request-frame-timeout-ms",
    type=click.IntRange(min=1),
    default=_default("request_frame_timeout_ms"),
    show_default=True,
    envvar=_env("REQUEST_FRAME_TIMEOUT_MS"),
    show_envvar=True,
    help="Close a connection whose request frame, once begun, is not complete within this "
    "long (slowloris); the clock stops while the controller itself is not reading it.",
)
@click.option(
    "--max-pending-bytes-per-connection",
    type=click.IntRange(min=1),
    default=_default("max_pending_bytes_per_connection"),
    show_default=True,
    envvar=_env("MAX_PENDING_BYTES_PER_CONNECTION"),
    show_envvar=True,
    help="Bytes one connection may make the controller hold (requests in service, answers "
    "not yet taken); past it the connection is not read. One request at a time always runs.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    envvar=_env("LOG_LEVEL"),
    show_envvar=True,
    help="Logging threshold (logs go to stderr).",
)
@click.option(
    "--enable-test-faults",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    show_default=True,
    envvar=_env("ENABLE_TEST_FAULTS"),
    show_envvar=True,
    help="TEST ONLY: serve the FaultControl API (delay, drop or hold chosen requests, e.g. an "
    "AlterPartition until released) and allow the --unsafe-* switches. Logged loudly; never "
    "in production (bare flag = true).",
)
@click.option(
    "--unsafe-ignore-broker-epochs",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    show_default=True,
    envvar=_env("UNSAFE_IGNORE_BROKER_EPOCHS"),
    show_envvar=True,
    help="TEST ONLY: accept AlterPartition ISR members with a stale broker epoch (turns the "
    "KIP-903 protection off). Refused unless --enable-test-faults "
    "(MINIBROKER_ENABLE_TEST_FAULTS=1).",
)
@click.option(
    "--unsafe-keep-restarted-replicas-in-isr",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    show_default=True,
    envvar=_env("UNSAFE_KEEP_RESTARTED_REPLICAS_IN_ISR"),
    show_envvar=True,
    help="TEST ONLY: a broker that registers again stays in the ISRs it was in (the "
    "ZooKeeper-era behaviour of KIP-101 scenario 1); only its leaderships move. Refused "
    "unless --enable-test-faults (MINIBROKER_ENABLE_TEST_FAULTS=1).",
)
def main(
    node_id: int,
    listen: tuple[str, int],
    data_dir: Path,
    session_timeout_ms: int,
    default_partitions: int,
    default_replication_factor: int,
    default_min_insync_replicas: int,
    default_unclean_leader_election: bool,
    snapshot_every: int,
    max_connections: int,
    reserved_broker_connections: int,
    max_connections_per_ip: int,
    max_connections_per_ip_overrides: dict[str, int],
    first_request_timeout_ms: int,
    connections_max_idle_ms: int,
    request_frame_timeout_ms: int,
    max_pending_bytes_per_connection: int,
    log_level: str,
    enable_test_faults: bool,
    unsafe_ignore_broker_epochs: bool,
    unsafe_keep_restarted_replicas_in_isr: bool,
) -> None:
    """Run the minibroker controller: the cluster's metadata log, broker liveness and
    leader elections."""
    host, port = listen
    try:
        config = ControllerConfig(
            node_id=node_id,
            listen_host=host,
            listen_port=port,
            data_dir=data_dir,
            session_timeout_ms=session_timeout_ms,
            default_partitions=default_partitions,
            default_replication_factor=default_replication_factor,
            default_min_insync_replicas=default_min_insync_replicas,
            default_unclean_leader_election=default_unclean_leader_election,
            snapshot_every=snapshot_every,
            max_connections=max_connections,
            reserved_broker_connections=reserved_broker_connections,
            max_connections_per_ip=max_connections_per_ip,
            max_connections_per_ip_overrides=max_connections_per_ip_overrides,
            first_request_timeout_ms=first_request_timeout_ms,
            connections_max_idle_ms=connections_max_idle_ms,
            request_frame_timeout_ms=request_frame_timeout_ms,
            max_pending_bytes_per_connection=max_pending_bytes_per_connection,
            log_level=log_level.upper(),
            enable_test_faults=enable_test_faults,
            unsafe_ignore_broker_epochs=unsafe_ignore_broker_epochs,
            unsafe_keep_restarted_replicas_in_isr=unsafe_keep_restarted_replicas_in_isr,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    # Imported here so `--help` and flag errors stay fast.
    from controller.app import run

    sys.exit(run(config))


if __name__ == "__main__":
    main(prog_name=f"{os.path.basename(sys.executable)} -m controller")
