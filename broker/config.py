"""The broker's configuration: one immutable object built once from flags, environment
and TOML (see `broker/__main__.py`), then passed down to every part of the process.

Parsing lives here (not in the click command) so that tests can build a BrokerConfig
without a command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from protocol.connection_limits import ConnectionLimits

DEFAULT_LISTENERS = "PLAINTEXT://127.0.0.1:9092"
DEFAULT_CONTROLLER = "127.0.0.1:9093"

_LISTENER_RE = re.compile(
    r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)://(?P<host>\[[^\]]+\]|[^:/\s]*):(?P<port>\d+)$"
)


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and the fix."""


@dataclass(frozen=True)
class ListenerSpec:
    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_listeners(value: str, *, option: str = "--listeners") -> list[ListenerSpec]:
    """Parse `NAME://HOST:PORT[,NAME://HOST:PORT...]`; names must be unique."""
    out: list[ListenerSpec] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        m = _LISTENER_RE.match(item)
        if m is None:
            raise ConfigError(
                f"{option}: {item!r} is not NAME://HOST:PORT (e.g. PLAINTEXT://127.0.0.1:9092)"
            )
        port = int(m["port"])
        if not 0 <= port <= 65535:
            raise ConfigError(f"{option}: port {port} in {item!r} is not in 0..65535")
        name = m["name"].upper()
        if any(spec.name == name for spec in out):
            raise ConfigError(f"{option}: listener name {name} appears twice")
        out.append(ListenerSpec(name, m["host"].strip("[]"), port))
    if not out:
        raise ConfigError(f"{option}: at least one NAME://HOST:PORT is needed")
    return out


def parse_host_port(value: str, *, option: str) -> tuple[str, int]:
    host, sep, port_s = value.strip().rpartition(":")
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) <= 65535:
        raise ConfigError(f"{option}: {value!r} is not HOST:PORT (e.g. 127.0.0.1:9093)")
    return host.strip("[]"), int(port_s)


@dataclass(frozen=True)
class BrokerConfig:
    node_id: int
    listeners: list[ListenerSpec] = field(
        default_factory=lambda: parse_listeners(DEFAULT_LISTENERS)
    )
    # None: advertise each listener's own address (with its actual port once bound).
    advertised_listeners: list[ListenerSpec] | None = None
    controller: tuple[str, int] = ("127.0.0.1", 9093)
    data_dir: Path = Path("minibroker-data/broker-0")
    heartbeat_interval_ms: int = 500
    segment_bytes: int = 134_217_728
    segment_ms: int = 604_800_000
    retention_ms: int = 604_800_000
    retention_bytes: int = -1
    flush_messages: int | None = None
    flush_ms: int | None = None
    max_message_bytes: int = 1_048_588
    replica_lag_time_max_ms: int = 10_000
    log_level: str = "INFO"
    # How long start-up keeps trying to reach the controller before giving up.
    controller_connect_timeout_ms: int = 30_000
    # How long a SIGTERM waits for the controller to move leaderships away.
    controlled_shutdown_timeout_ms: int = 10_000
    retention_check_interval_ms: int = 300_000
    hw_checkpoint_interval_ms: int = 5_000
    # Follower fetcher (Kafka's replica.fetch.* settings).
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 1_048_576
    replica_fetch_response_max_bytes: int = 10_485_760
    replica_fetch_backoff_ms: int = 200
    # What one Fetch may return, all partitions (KIP-74: at least the first batch
    # whole): a consumer's is capped at fetch.max.bytes, a follower's at
    # replica.fetch.response.max.bytes above.
    fetch_max_bytes: int = 57_671_680
    # Connection bounds (Kafka's names where Kafka has the setting).
    max_connections: int = 10_000
    max_connections_per_ip: int = 1_000
    max_connections_per_ip_overrides: dict[str, int] = field(default_factory=dict)
    connections_max_idle_ms: int = 600_000
    request_frame_timeout_ms: int = 30_000
    max_pending_bytes_per_connection: int = 64 * 1024 * 1024
    # The offsets coordinator's internal topic __consumer_offsets (Kafka's settings;
    # Kafka defaults to 50 partitions, we default to 10: small clusters, cheap start).
    offsets_topic_num_partitions: int = 10
    offsets_topic_replication_factor: int = 3
    # Test-only switches (refused unless MINIBROKER_ENABLE_TEST_FAULTS=1, logged loudly):
    # each turns one protection off so a scenario test can show the failure it guards.
    enable_test_faults: bool = False
    # Follower truncates to its high watermark (pre-KIP-101) instead of asking the leader.
    unsafe_truncate_to_high_watermark: bool = False
    # Leader ignores current_leader_epoch in Produce/Fetch/ListOffsets/OffsetsForLeaderEpoch.
    unsafe_ignore_leader_epoch: bool = False
    # Logs are never fsynced (a crash may lose what the page cache held).
    unsafe_skip_fsync: bool = False
    # Not flags: internal bounds with Kafka-like values.
    request_timeout_ms: int = 30_000
    metadata_max_wait_ms: int = 1_000
    max_in_flight_per_connection: int = 100
    max_frame_bytes: int = 100 * 1024 * 1024
    max_fetch_wait_ms: int = 30_000
    max_delayed_operations: int = 10_000
    flush_check_interval_ms: int = 100

    def __post_init__(self) -> None:
        if self.node_id < 0:
            raise ConfigError(f"--node-id must be >= 0, got {self.node_id}")
        if self.heartbeat_interval_ms <= 0:
            raise ConfigError("--heartbeat-interval-ms must be > 0")
        if self.segment_bytes < 1024:
            raise ConfigError(f"--segment-bytes must be >= 1024, got {self.segment_bytes}")
        if self.segment_ms <= 0:
            raise ConfigError("--segment-ms must be > 0")
        if self.retention_ms < -1 or self.retention_bytes < -1:
            raise ConfigError("--retention-ms / --retention-bytes must be >= -1 (-1: unlimited)")
        if self.flush_messages is not None and self.flush_messages <= 0:
            raise ConfigError("--flush-messages must be > 0")
        if self.flush_ms is not None and self.flush_ms <= 0:
            raise ConfigError("--flush-ms must be > 0")
        if self.max_message_bytes <= 0:
            raise ConfigError("--max-message-bytes must be > 0")
        if self.offsets_topic_num_partitions <= 0:
            raise ConfigError("--offsets-topic-num-partitions must be > 0")
        if self.offsets_topic_replication_factor <= 0:
            raise ConfigError("--offsets-topic-replication-factor must be > 0")
        if self.replica_lag_time_max_ms <= 0:
            raise ConfigError("--replica-lag-time-max-ms must be > 0")
        for name in (
            "controller_connect_timeout_ms",
            "controlled_shutdown_timeout_ms",
            "retention_check_interval_ms",
            "hw_checkpoint_interval_ms",
            "fetch_max_bytes",
            "max_connections",
            "connections_max_idle_ms",
            "request_frame_timeout_ms",
            "max_pending_bytes_per_connection",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
        try:
            self.connection_limits()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.advertised_listeners is not None:
            names = {spec.name for spec in self.listeners}
            adv = {spec.name for spec in self.advertised_listeners}
            if names != adv:
                raise ConfigError(
                    "--advertised-listeners must name the same listeners as --listeners "
                    f"({', '.join(sorted(names))}), got {', '.join(sorted(adv))}"
                )
            for spec in self.advertised_listeners:
                if not spec.host:
                    raise ConfigError(f"--advertised-listeners: {spec} needs a host")

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            max_connections_per_ip_overrides=self.max_connections_per_ip_overrides,
            max_in_flight=self.max_in_flight_per_connection,
            max_frame_bytes=self.max_frame_bytes,
            max_pending_bytes=self.max_pending_bytes_per_connection,
            idle_timeout_ms=self.connections_max_idle_ms,
            frame_timeout_ms=self.request_frame_timeout_ms,
        )

    def with_bound_ports(self, bound: dict[str, int]) -> BrokerConfig:
        """Replace port 0 listeners by the ports the OS picked."""
        listeners = [replace(s, port=bound.get(s.name, s.port)) for s in self.listeners]
        return replace(self, listeners=listeners)

    def advertised(self) -> dict[str, ListenerSpec]:
        """Listener name -> the address clients are told to use."""
        by_name = {s.name: s for s in self.listeners}
        if self.advertised_listeners is None:
            out = {}
            for s in self.listeners:
                # 0.0.0.0 is not an address a client can connect to.
                host = s.host if s.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
                out[s.name] = replace(s, host=host)
            return out
        out = {}
        for s in self.advertised_listeners:
            port = s.port if s.port != 0 else by_name[s.name].port
            out[s.name] = replace(s, port=port)
        return out
