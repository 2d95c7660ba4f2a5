"""`python -m broker`: the broker process.

Configuration precedence: flags > environment (MINIBROKER_*) > TOML file given with
--config (keys are the option names with dashes, e.g. `node-id = 1`) > defaults.
Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when start-up or the broker
fails (one `error: ...` line on stderr says what and what to do), 2 for bad flags
(including an --unsafe-* switch without --enable-test-faults).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import uvloop

from broker.config import (
    DEFAULT_CONTROLLER,
    DEFAULT_LISTENERS,
    BrokerConfig,
    ConfigError,
    parse_host_port,
    parse_listeners,
)
from protocol.connection_limits import parse_per_ip_overrides

LOG_FORMAT = "%(asctime)s %(levelname)s [node {node}] %(name)s: %(message)s"


def _load_toml(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Eager: read the TOML file into click's default_map before the other options."""
    if not value:
        return value
    try:
        with open(value, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {value}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{value} is not valid TOML: {exc}") from exc
    known = {p.name for p in ctx.command.params if p.name}
    defaults: dict[str, Any] = {}
    for key, item in data.items():
        name = key.replace("-", "_")
        if name not in known or name == "config":
            raise click.BadParameter(f"{value}: unknown setting {key!r}")
        defaults[name] = item
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _opt(name: str, env: str, **kwargs: Any) -> Any:
    return click.option(name, envvar=f"MINIBROKER_{env}", show_envvar=True, **kwargs)


def _default(field: str) -> Any:
    """The BrokerConfig default of `field`, so --help and the config never disagree."""
    return {f.name: f.default for f in dataclasses.fields(BrokerConfig)}[field]


_UNSAFE_FLAGS = (
    "unsafe_truncate_to_high_watermark",
    "unsafe_ignore_leader_epoch",
    "unsafe_skip_fsync",
)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    envvar="MINIBROKER_CONFIG",
    show_envvar=True,
    is_eager=True,
    expose_value=False,
    callback=_load_toml,
    help="TOML file with settings (keys: option names with dashes); flags and env win.",
)
@_opt("--node-id", "NODE_ID", type=click.IntRange(min=0), required=True, help="Broker id, >= 0.")
@_opt(
    "--listeners",
    "LISTENERS",
    default=DEFAULT_LISTENERS,
    show_default=True,
    help="Comma-separated NAME://HOST:PORT to listen on; port 0 picks a free port.",
)
@_opt(
    "--advertised-listeners",
    "ADVERTISED_LISTENERS",
    default=None,
    help="NAME://HOST:PORT clients are told to use, per listener name "
    "[default: the listeners, with their actual ports].",
)
@_opt(
    "--controller",
    "CONTROLLER",
    default=DEFAULT_CONTROLLER,
    show_default=True,
    help="HOST:PORT of the controller.",
)
@_opt(
    "--data-dir",
    "DATA_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the logs and checkpoints [default: ./minibroker-data/broker-<node-id>].",
)
@_opt(
    "--heartbeat-interval-ms",
    "HEARTBEAT_INTERVAL_MS",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Interval between heartbeats to the controller.",
)
@_opt(
    "--segment-bytes",
    "SEGMENT_BYTES",
    type=click.IntRange(min=1024),
    default=134_217_728,
    show_default=True,
    help="Roll a new segment when the active one reaches this size (topic: segment.bytes).",
)
@_opt(
    "--segment-ms",
    "SEGMENT_MS",
    type=click.IntRange(min=1),
    default=604_800_000,
    show_default=True,
    help="Roll a new segment after this age (topic: segment.ms).",
)
@_opt(
    "--retention-ms",
    "RETENTION_MS",
    type=click.IntRange(min=-1),
    default=604_800_000,
    show_default=True,
    help="Delete segments older than this; -1 keeps them (topic: retention.ms).",
)
@_opt(
    "--retention-bytes",
    "RETENTION_BYTES",
    type=click.IntRange(min=-1),
    default=-1,
    show_default=True,
    help="Delete old segments while a partition is larger; -1: no limit (retention.bytes).",
)
@_opt(
    "--flush-messages",
    "FLUSH_MESSAGES",
    type=click.IntRange(min=1),
    default=None,
    help="fsync a partition after this many messages, before acknowledging "
    "(topic: flush.messages) [default: none, durability from replication].",
)
@_opt(
    "--flush-ms",
    "FLUSH_MS",
    type=click.IntRange(min=1),
    default=None,
    help="fsync a partition with unflushed data this often (topic: flush.ms) [default: none].",
)
@_opt(
    "--max-message-bytes",
    "MAX_MESSAGE_BYTES",
    type=click.IntRange(min=1),
    default=1_048_588,
    show_default=True,
    help="Largest record batch accepted (topic: max.message.bytes).",
)
@_opt(
    "--replica-lag-time-max-ms",
    "REPLICA_LAG_TIME_MAX_MS",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="A follower that has not caught up for this long leaves the ISR.",
)
@_opt(
    "--offsets-topic-num-partitions",
    "OFFSETS_TOPIC_NUM_PARTITIONS",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Partitions of the internal topic __consumer_offsets when a broker creates it "
    "(offsets.topic.num.partitions; Kafka's default is 50). Use the same value on every broker.",
)
@_opt(
    "--offsets-topic-replication-factor",
    "OFFSETS_TOPIC_REPLICATION_FACTOR",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Replication factor of __consumer_offsets (offsets.topic.replication.factor); "
    "lowered to the number of live brokers, with a warning, when fewer are up.",
)
@_opt(
    "--controller-connect-timeout-ms",
    "CONTROLLER_CONNECT_TIMEOUT_MS",
    type=click.IntRange(min=1),
    default=30_000,
    show_default=True,
    help="How long start-up keeps trying to reach the controller before it gives up.",
)
@_opt(
    "--controlled-shutdown-timeout-ms",
    "CONTROLLED_SHUTDOWN_TIMEOUT_MS",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="How long SIGTERM waits for the controller to move leaderships away.",
)
@_opt(
    "--retention-check-interval-ms",
    "RETENTION_CHECK_INTERVAL_MS",
    type=click.IntRange(min=1),
    default=300_000,
    show_default=True,
    help="How often retention looks for segments to delete.",
)
@_opt(
    "--hw-checkpoint-interval-ms",
    "HW_CHECKPOINT_INTERVAL_MS",
    type=click.IntRange(min=1),
    default=5_000,
    show_default=True,
    help="How often high watermarks and recovery points are checkpointed.",
)
@_opt(
    "--replica-fetch-wait-max-ms",
    "REPLICA_FETCH_WAIT_MAX_MS",
    type=click.IntRange(min=0),
    default=_default("replica_fetch_wait_max_ms"),
    show_default=True,
    help="Longest a follower's fetch waits at the leader for new data (replica.fetch.wait.max.ms).",
)
@_opt(
    "--replica-fetch-max-bytes",
    "REPLICA_FETCH_MAX_BYTES",
    type=click.IntRange(min=1),
    default=_default("replica_fetch_max_bytes"),
    show_default=True,
    help="Bytes a follower asks for per partition and fetch (replica.fetch.max.bytes).",
)
@_opt(
    "--replica-fetch-response-max-bytes",
    "REPLICA_FETCH_RESPONSE_MAX_BYTES",
    type=click.IntRange(min=1),
    default=_default("replica_fetch_response_max_bytes"),
    show_default=True,
    help="Bytes a follower asks for per fetch, all partitions together, and the most a "
    "follower's fetch gets from this broker as leader (replica.fetch.response.max.bytes).",
)
@_opt(
    "--replica-fetch-backoff-ms",
    "REPLICA_FETCH_BACKOFF_MS",
    type=click.IntRange(min=0),
    default=_default("replica_fetch_backoff_ms"),
    show_default=True,
    help="Pause of a follower's fetcher after a failed fetch (replica.fetch.backoff.ms).",
)
@_opt(
    "--fetch-max-bytes",
    "FETCH_MAX_BYTES",
    type=click.IntRange(min=1),
    default=_default("fetch_max_bytes"),
    show_default=True,
    help="Most record bytes a consumer's fetch gets, all partitions together, whatever it "
    "asks for; the first batch comes whole even when larger (fetch.max.bytes).",
)
@_opt(
    "--max-connections",
    "MAX_CONNECTIONS",
    type=click.IntRange(min=1),
    default=_default("max_connections"),
    show_default=True,
    help="Connections open at once, all listeners together; when full, a new connection "
    "replaces the oldest one that has sent no request, else it is refused (max.connections).",
)
@_opt(
    "--max-connections-per-ip",
    "MAX_CONNECTIONS_PER_IP",
    type=click.IntRange(min=0),
    default=_default("max_connections_per_ip"),
    show_default=True,
    help="Connections open at once from one IP address, all listeners together; more are "
    "refused (max.connections.per.ip).",
)
@_opt(
    "--max-connections-per-ip-overrides",
    "MAX_CONNECTIONS_PER_IP_OVERRIDES",
    default="",
    help="Per-address limits that replace --max-connections-per-ip: ADDRESS:COUNT,... "
    "(IP addresses, e.g. 10.0.0.5:5000) (max.connections.per.ip.overrides). [default: none]",
)
@_opt(
    "--connections-max-idle-ms",
    "CONNECTIONS_MAX_IDLE_MS",
    type=click.IntRange(min=1),
    default=_default("connections_max_idle_ms"),
    show_default=True,
    help="Close a connection with nothing received, nothing of its answers taken and no "
    "request in service for this long (connections.max.idle.ms).",
)
@_opt(
    "--request-frame-timeout-ms",
    "REQUEST_FRAME_TIMEOUT_MS",
    type=click.IntRange(min=1),
    default=_default("request_frame_timeout_ms"),
    show_default=True,
    help="Close a connection whose request frame, once begun, is not complete within this "
    "long (slowloris); the clock stops while the broker itself is not reading it.",
)
@_opt(
    "--max-pending-bytes-per-connection",
    "MAX_PENDING_BYTES_PER_CONNECTION",
    type=click.IntRange(min=1),
    default=_default("max_pending_bytes_per_connection"),
    show_default=True,
    help="Bytes one connection may make the broker hold: requests in service, the record "
    "bytes their fetches may return, answers not yet taken by the client. Past it the "
    "broker stops reading that connection; one request at a time always runs.",
)
@_opt(
    "--enable-test-faults",
    "ENABLE_TEST_FAULTS",
    is_flag=True,
    default=False,
    show_default=True,
    help="TEST ONLY: serve the FaultControl API (delay, drop or hold chosen RPCs) and allow "
    "the --unsafe-* switches. Logged loudly; never in production. [default: off]",
)
@_opt(
    "--unsafe-truncate-to-high-watermark",
    "UNSAFE_TRUNCATE_TO_HIGH_WATERMARK",
    is_flag=True,
    default=False,
    show_default=True,
    help="TEST ONLY (needs --enable-test-faults): a follower truncates to its high watermark "
    "instead of reconciling by leader epoch (KIP-101 protection off). [default: off]",
)
@_opt(
    "--unsafe-ignore-leader-epoch",
    "UNSAFE_IGNORE_LEADER_EPOCH",
    is_flag=True,
    default=False,
    show_default=True,
    help="TEST ONLY (needs --enable-test-faults): the leader ignores current_leader_epoch in "
    "requests (KIP-320/KIP-359 protection off). [default: off]",
)
@_opt(
    "--unsafe-skip-fsync",
    "UNSAFE_SKIP_FSYNC",
    is_flag=True,
    default=False,
    show_default=True,
    help="TEST ONLY (needs --enable-test-faults): never fsync log data (flush.messages and "
    "flush.ms do nothing; the recovery point stays put). [default: off]",
)
@_opt(
    "--log-level",
    "LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Logging level.",
)
def main(**options: Any) -> None:
    """Run a minibroker broker: registers with the controller, leads and follows the
    partitions assigned to it, and serves clients."""
    node_id = options["node_id"]
    unsafe = [name for name in _UNSAFE_FLAGS if options[name]]
    if unsafe and not options["enable_test_faults"]:
        flags = ", ".join("--" + name.replace("_", "-") for name in unsafe)
        raise click.UsageError(
            f"{flags}: test-only switch(es) that turn a protection off; they are refused "
            "unless --enable-test-faults (or MINIBROKER_ENABLE_TEST_FAULTS=1) is given too. "
            "Never use them in production."
        )
    try:
        listeners = parse_listeners(options["listeners"])
        advertised = (
            parse_listeners(options["advertised_listeners"], option="--advertised-listeners")
            if options["advertised_listeners"]
            else None
        )
        controller = parse_host_port(options["controller"], option="--controller")
        config = BrokerConfig(
            node_id=node_id,
            listeners=listeners,
            advertised_listeners=advertised,
            controller=controller,
            data_dir=options["data_dir"] or Path("minibroker-data") / f"broker-{node_id}",
            heartbeat_interval_ms=options["heartbeat_interval_ms"],
            segment_bytes=options["segment_bytes"],
            segment_ms=options["segment_ms"],
            retention_ms=options["retention_ms"],
            retention_bytes=options["retention_bytes"],
            flush_messages=options["flush_messages"],
            flush_ms=options["flush_ms"],
            max_message_bytes=options["max_message_bytes"],
            replica_lag_time_max_ms=options["replica_lag_time_max_ms"],
            offsets_topic_num_partitions=options["offsets_topic_num_partitions"],
            offsets_topic_replication_factor=options["offsets_topic_replication_factor"],
            log_level=options["log_level"].upper(),
            controller_connect_timeout_ms=options["controller_connect_timeout_ms"],
            controlled_shutdown_timeout_ms=options["controlled_shutdown_timeout_ms"],
            retention_check_interval_ms=options["retention_check_interval_ms"],
            hw_checkpoint_interval_ms=options["hw_checkpoint_interval_ms"],
            replica_fetch_wait_max_ms=options["replica_fetch_wait_max_ms"],
            replica_fetch_max_bytes=options["replica_fetch_max_bytes"],
            replica_fetch_response_max_bytes=options["replica_fetch_response_max_bytes"],
            replica_fetch_backoff_ms=options["replica_fetch_backoff_ms"],
            fetch_max_bytes=options["fetch_max_bytes"],
            max_connections=options["max_connections"],
            max_connections_per_ip=options["max_connections_per_ip"],
            max_connections_per_ip_overrides=parse_per_ip_overrides(
                options["max_connections_per_ip_overrides"],
                option="--max-connections-per-ip-overrides",
            ),
            connections_max_idle_ms=options["connections_max_idle_ms"],
            request_frame_timeout_ms=options["request_frame_timeout_ms"],
            max_pending_bytes_per_connection=options["max_pending_bytes_per_connection"],
            enable_test_faults=options["enable_test_faults"],
            unsafe_truncate_to_high_watermark=options["unsafe_truncate_to_high_watermark"],
            unsafe_ignore_leader_epoch=options["unsafe_ignore_leader_epoch"],
            unsafe_skip_fsync=options["unsafe_skip_fsync"],
        )
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    sys.exit(run(config))


def run(config: BrokerConfig) -> int:
    logging.basicConfig(
        level=config.log_level,
        format=LOG_FORMAT.format(node=config.node_id),
        stream=sys.stderr,
        force=True,
    )
    # Imported here so that `--help` and flag errors do not load the whole broker.
    from broker.server import Broker, StartupError

    async def _main() -> int:
        broker = Broker(config)
        return await broker.run()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(_main())
    except StartupError as exc:
        click.echo(f"error: broker {config.node_id}: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    main()
