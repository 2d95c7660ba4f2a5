"""The controller's settings, in one place with their defaults.

`python -m controller` fills a `ControllerConfig` from flags > `MINIBROKER_*`
environment > TOML file > these defaults; tests build one directly.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from protocol.api import ApiKey
from protocol.connection_limits import ConnectionLimits

# Test-only fault switches are refused unless test faults are enabled (--enable-test-faults,
# or this environment variable is "1"), so a production deployment cannot turn a
# protection off by accident.
TEST_FAULTS_ENV = "MINIBROKER_ENABLE_TEST_FAULTS"


def _test_faults_env() -> bool:
    return os.environ.get(TEST_FAULTS_ENV) == "1"


DEFAULT_LISTEN = "127.0.0.1:9093"
DEFAULT_DATA_DIR = "./minibroker-data/controller"

log = logging.getLogger(__name__)

# The APIs brokers send the controller (CreateTopics/DeleteTopics/ElectLeaders too:
# clients reach them only through a broker, which forwards them). A connection whose
# first request is one of these may use the slots kept for brokers.
BROKER_API_KEYS = frozenset(
    int(key)
    for key in (
        ApiKey.BROKER_REGISTRATION,
        ApiKey.BROKER_HEARTBEAT,
        ApiKey.FETCH_METADATA,
        ApiKey.ALTER_PARTITION,
        ApiKey.ALLOCATE_PRODUCER_IDS,
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.ELECT_LEADERS,
    )
)


def parse_listen(value: str) -> tuple[str, int]:
    """Split `HOST:PORT` (IPv6 as `[::1]:9093`); raise ValueError with a helpful message."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text:
        raise ValueError(f"{value!r} is not HOST:PORT (for example 127.0.0.1:9093)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port {port_text!r} in {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} in {value!r} is outside 0..65535")
    return host, port


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    node_id: int = 0
    listen_host: str = "127.0.0.1"
    listen_port: int = 9093  # 0: pick a free port (the listening log line names it)
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    session_timeout_ms: int = 4000
    default_partitions: int = 1
    default_replication_factor: int = 1
    default_min_insync_replicas: int = 1
    default_unclean_leader_election: bool = False
    snapshot_every: int = 10_000
    log_level: str = "INFO"

    # Connection bounds (flags; Kafka's names where Kafka has the setting).
    max_connections: int = 1000
    max_connections_per_ip: int = 100
    max_connections_per_ip_overrides: dict[str, int] = field(default_factory=dict)
    # Slots only connections whose first request is a broker API may use.
    reserved_broker_connections: int = 300
    first_request_timeout_ms: int = 10_000
    connections_max_idle_ms: int = 600_000
    request_frame_timeout_ms: int = 30_000
    max_pending_bytes_per_connection: int = 64 * 1024 * 1024

    # Bounds (not on the command line: they protect the process, not tune it).
    max_request_bytes: int = 16 * 1024 * 1024  # controller requests are small
    max_in_flight_per_connection: int = 100
    max_metadata_waiters: int = 1000  # parked FetchMetadata long-polls
    max_metadata_wait_ms: int = 30_000  # cap on a FetchMetadata max_wait_ms
    max_metadata_records: int = 10_000  # cap on entries per FetchMetadata answer
    max_partitions_per_topic: int = 10_000

    # TEST ONLY: serve FaultControl (controller/faults.py) and allow the unsafe switches
    # below. Built directly (tests), it follows MINIBROKER_ENABLE_TEST_FAULTS.
    enable_test_faults: bool = field(default_factory=_test_faults_env)
    # TEST ONLY (KIP-903 scenario): skip the check that each new ISR member's broker
    # epoch in AlterPartition equals its registered epoch, so a test can show the
    # data loss the check prevents.
    unsafe_ignore_broker_epochs: bool = False
    # TEST ONLY (KIP-101 scenario 1): a broker that registers again (a restart) stays in
    # the ISRs it was in, as under ZooKeeper when it came back within the lag time; only
    # its leaderships move. Without it the new incarnation leaves every ISR (KIP-903).
    unsafe_keep_restarted_replicas_in_isr: bool = False

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.node_id < 0:
            problems.append(f"node id {self.node_id} must be >= 0")
        if not 0 <= self.listen_port <= 65535:
            problems.append(f"listen port {self.listen_port} is outside 0..65535")
        if self.session_timeout_ms < 1:
            problems.append(f"session timeout {self.session_timeout_ms} ms must be >= 1")
        for name in (
            "default_partitions",
            "default_replication_factor",
            "default_min_insync_replicas",
            "snapshot_every",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name.replace('_', '-')} must be >= 1")
        if logging.getLevelName(self.log_level.upper()) not in (
            logging.DEBUG,
            logging.INFO,
            logging.WARNING,
            logging.ERROR,
            logging.CRITICAL,
        ):
            problems.append(f"log level {self.log_level!r} is not DEBUG/INFO/WARNING/ERROR")
        if not 0 <= self.reserved_broker_connections < self.max_connections:
            problems.append(
                f"--reserved-broker-connections ({self.reserved_broker_connections}) must be "
                f"below --max-connections ({self.max_connections})"
            )
        else:
            try:
                self.connection_limits()
            except ValueError as exc:
                problems.append(str(exc))
        for name in self.protections_off:
            if not self.enable_test_faults:
                problems.append(
                    f"--{name} is a test-only switch that turns a protection off; it is refused "
                    f"unless --enable-test-faults (or {TEST_FAULTS_ENV}=1) is given too "
                    "(never in production)"
                )
        if problems:
            raise ValueError("; ".join(problems))

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            max_connections_per_ip_overrides=self.max_connections_per_ip_overrides,
            reserved_connections=self.reserved_broker_connections,
            privileged_api_keys=BROKER_API_KEYS,
            max_in_flight=self.max_in_flight_per_connection,
            max_frame_bytes=self.max_request_bytes,
            max_pending_bytes=self.max_pending_bytes_per_connection,
            idle_timeout_ms=self.connections_max_idle_ms,
            frame_timeout_ms=self.request_frame_timeout_ms,
            first_request_timeout_ms=self.first_request_timeout_ms,
        )

    @property
    def protections_off(self) -> tuple[str, ...]:
        """The unsafe switches that are on, by flag name."""
        return tuple(
            name.replace("_", "-")
            for name in ("unsafe_ignore_broker_epochs", "unsafe_keep_restarted_replicas_in_isr")
            if getattr(self, name)
        )

    @property
    def session_timeout_s(self) -> float:
        return self.session_timeout_ms / 1000.0

    @property
    def listen(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"
