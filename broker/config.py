"""The broker's configuration: one immutable object built once from flags, environment
and TOML (`python -m broker`), then passed down to every part of the process.

Every setting is declared once, as a field below (`setting(...)`, or
`topic_setting(...)` for the broker-wide default of a topic config): its flag, its
MINIBROKER_* environment variable, its TOML key, its checks, its `--help` line and its
README row all come from that declaration (runtime/settings.py). Fields without a
declaration are internal bounds, not settings. Tests build a BrokerConfig directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from broker.storage.file_handles import DEFAULT_MAX_OPEN_SEGMENT_FILES
from broker.storage.file_handles import MIN_OPEN_SEGMENT_FILES
from broker.storage.log_config import LogConfig
from protocol.connection_limits import ConnectionLimits
from protocol.topic_configs import FLUSH_MESSAGES
from protocol.topic_configs import FLUSH_MS
from protocol.topic_configs import MAX_MESSAGE_BYTES
from protocol.topic_configs import RETENTION_BYTES
from protocol.topic_configs import RETENTION_MS
from protocol.topic_configs import SEGMENT_BYTES
from protocol.topic_configs import SEGMENT_MS
from runtime.allocator import DEFAULT_ALLOCATOR_RETAIN_BYTES
from runtime.authorization_settings import allow_everyone_if_no_acl_found_setting
from runtime.authorization_settings import authorizer_enabled_setting
from runtime.authorization_settings import super_users_setting
from runtime.connection_settings import connection_limits
from runtime.connection_settings import frame_timeout_setting
from runtime.connection_settings import idle_timeout_setting
from runtime.connection_settings import pending_bytes_setting
from runtime.connection_settings import per_ip_overrides_setting
from runtime.sasl import SaslCredentials
from runtime.sasl_settings import SERVER_PASSWORD_ENV
from runtime.sasl_settings import password_file_setting
from runtime.sasl_settings import sasl_enabled_mechanisms_setting
from runtime.sasl_settings import sasl_mechanism_setting
from runtime.sasl_settings import server_credentials
from runtime.sasl_settings import username_setting
from runtime.settings import ConfigError
from runtime.settings import enable_test_faults_switch
from runtime.settings import parse_host_port
from runtime.settings import problems
from runtime.settings import setting
from runtime.settings import topic_defaults
from runtime.settings import topic_setting
from runtime.settings import unsafe_switch
from runtime.tls import LISTENER_PROTOCOLS
from runtime.tls import PLAINTEXT
from runtime.tls import SSL
from runtime.tls import uses_sasl
from runtime.tls import uses_tls
from runtime.tls_settings import security_protocol_setting
from runtime.tls_settings import ssl_cafile_setting
from runtime.tls_settings import ssl_certfile_setting
from runtime.tls_settings import ssl_client_auth_setting
from runtime.tls_settings import ssl_keyfile_setting
from runtime.tls_settings import ssl_problems

__all__ = [
    "BrokerConfig",
    "ConfigError",
    "ListenerSpec",
    "parse_host_port",
    "parse_listeners",
]

_LISTENER_RE = re.compile(
    r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)://(?P<host>\[[^\]]+\]|[^:/\s]*):(?P<port>\d+)$"
)


def parse_controllers(value: str, *, option: str = "--controller") -> tuple[tuple[str, int], ...]:
    """`HOST:PORT[,HOST:PORT...]`: controllers to ask for the active one."""
    addresses = tuple(
        parse_host_port(part, option=option) for part in value.split(",") if part.strip()
    )
    if not addresses:
        raise ConfigError(f"{option}: give at least one HOST:PORT of a controller")
    return addresses


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


def parse_listener_names(value: str, *, option: str = "--kafka-listeners") -> tuple[str, ...]:
    """Parse `NAME[,NAME...]` (listener names, any case)."""
    names = tuple(n.strip().upper() for n in value.split(",") if n.strip())
    for name in names:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            raise ConfigError(f"{option}: {name!r} is not a listener name")
    return names


def parse_security_protocol_map(
    value: str, *, option: str = "--listener-security-protocol-map"
) -> dict[str, str]:
    """Parse `NAME:PROTOCOL[,NAME:PROTOCOL...]` (listener.security.protocol.map)."""
    out: dict[str, str] = {}
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or protocol not in LISTENER_PROTOCOLS or not name:
            raise ConfigError(
                f"{option}: {item!r} is not NAME:PROTOCOL with PROTOCOL one of "
                f"{', '.join(LISTENER_PROTOCOLS)} (e.g. INTERNAL:SSL)"
            )
        out[name] = protocol
    return out


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    node_id: int = setting(minimum=0, doc="Broker id, >= 0.")
    listeners: list[ListenerSpec] = setting(
        "PLAINTEXT://127.0.0.1:9092",
        parse=parse_listeners,
        doc="Comma-separated NAME://HOST:PORT to listen on; port 0 picks a free port.",
    )
    # None: advertise each listener's own address (with its actual port once bound).
    advertised_listeners: list[ListenerSpec] | None = setting(
        None,
        parse=parse_listeners,
        shown_default="the listeners",
        doc="NAME://HOST:PORT clients are told to use, per listener name (a client gets "
        "the address of the listener it came in on).",
    )
    kafka_listeners: tuple[str, ...] = setting(
        "",
        parse=parse_listener_names,
        shown_default="none",
        doc="Names of --listeners that speak Apache Kafka's protocol (for Kafka clients "
        "and tools) instead of minibroker's; not the first listener: brokers replicate "
        "over it.",
    )
    listener_security_protocol_map: dict[str, str] = setting(
        "",
        parse=parse_security_protocol_map,
        shown_default="a listener named SSL is SSL, the others PLAINTEXT",
        doc="NAME:PROTOCOL per listener: PLAINTEXT, SSL (TLS 1.2+), SASL_PLAINTEXT or "
        "SASL_SSL (a client proves a user first: --sasl-enabled-mechanisms); brokers reach "
        "each other over the first listener, with its protocol (a SASL one: as "
        "--sasl-server-username) (listener.security.protocol.map).",
    )
    ssl_certfile: Path | None = ssl_certfile_setting()
    ssl_keyfile: Path | None = ssl_keyfile_setting()
    ssl_cafile: Path | None = ssl_cafile_setting()
    ssl_client_auth: str = ssl_client_auth_setting()
    authorizer_enabled: bool = authorizer_enabled_setting()
    super_users: frozenset[str] = super_users_setting()
    allow_everyone_if_no_acl_found: bool = allow_everyone_if_no_acl_found_setting()
    sasl_enabled_mechanisms: tuple[str, ...] = sasl_enabled_mechanisms_setting(
        "SASL_PLAINTEXT and SASL_SSL listeners"
    )
    sasl_mechanism_inter_broker_protocol: str = sasl_mechanism_setting(
        "the other brokers' first listener", "sasl.mechanism.inter.broker.protocol"
    )
    sasl_mechanism_controller_protocol: str = sasl_mechanism_setting(
        "the controllers", "sasl.mechanism.controller.protocol"
    )
    sasl_server_username: str | None = username_setting(
        "The user this broker authenticates as when the first listener (brokers replicate "
        "over it) or the controllers' listener is SASL_PLAINTEXT or SASL_SSL; the same on "
        "every broker, or one each (the controller's --sasl-bootstrap-username makes the "
        "first)."
    )
    sasl_server_password_file: Path | None = password_file_setting(
        "--sasl-server-username", SERVER_PASSWORD_ENV
    )
    controller: tuple[tuple[str, int], ...] = setting(
        "127.0.0.1:9093",
        parse=parse_controllers,
        doc="HOST:PORT of the controller, or of any of the quorum's controllers "
        "(comma-separated): the broker finds the active one and follows it across "
        "failovers.",
    )
    controller_security_protocol: str = security_protocol_setting(
        "How this broker connects to the controllers: their --security-protocol "
        "(SASL_PLAINTEXT or SASL_SSL: as --sasl-server-username)."
    )
    # None: ./minibroker-data/broker-<node id> (filled in by __post_init__).
    data_dir: Path = setting(
        None,
        kind="path",
        shown_default="./minibroker-data/broker-<node-id>",
        doc="Directory of the logs and checkpoints.",
    )
    heartbeat_interval_ms: int = setting(
        500, minimum=1, doc="Interval between heartbeats to the controller."
    )
    segment_bytes: int = topic_setting(SEGMENT_BYTES)
    segment_ms: int = topic_setting(SEGMENT_MS)
    retention_ms: int = topic_setting(RETENTION_MS)
    retention_bytes: int = topic_setting(RETENTION_BYTES)
    flush_messages: int | None = topic_setting(FLUSH_MESSAGES)
    flush_ms: int | None = topic_setting(FLUSH_MS)
    max_message_bytes: int = topic_setting(MAX_MESSAGE_BYTES)
    max_open_segment_files: int = setting(
        DEFAULT_MAX_OPEN_SEGMENT_FILES,
        minimum=MIN_OPEN_SEGMENT_FILES,
        doc="Most segment files (.log, .index, .timeindex of every partition) open at "
        "once: files are opened when used and the least recently used are closed beyond "
        "this, so open files do not grow with the partition count. Keep it well below "
        "the open-file limit (ulimit -n), which sockets share.",
    )
    allocator_retain_bytes: int = setting(
        DEFAULT_ALLOCATOR_RETAIN_BYTES,
        minimum=0,
        maximum=1 << 30,
        doc="Freed memory the C allocator keeps for reuse (glibc's mallopt trim and mmap "
        "thresholds), so the 1 MiB buffers of produce requests and fetch answers are "
        "recycled instead of page-faulted in again for every request; the broker's RSS "
        "may stay this much above what it uses. 0 leaves the C library's defaults; less "
        "than 32 MiB counts as 32 MiB (a fixed smaller threshold is worse than glibc's).",
    )
    replica_lag_time_max_ms: int = setting(
        10_000, minimum=1, doc="A follower that has not caught up for this long leaves the ISR."
    )
    # The offsets coordinator's internal topic __consumer_offsets (Kafka's settings;
    # Kafka defaults to 50 partitions, we default to 10: small clusters, cheap start).
    offsets_topic_num_partitions: int = setting(
        10,
        minimum=1,
        doc="Partitions of the internal topic __consumer_offsets when a broker creates it "
        "(offsets.topic.num.partitions; Kafka's default is 50). Use the same value on "
        "every broker.",
    )
    offsets_topic_replication_factor: int = setting(
        3,
        minimum=1,
        doc="Replication factor of __consumer_offsets (offsets.topic.replication.factor); "
        "lowered to the number of live brokers, with a warning, when fewer are up.",
    )
    # Consumer groups (Kafka's names and defaults, group.max.size excepted: bounded).
    group_min_session_timeout_ms: int = setting(
        6_000,
        minimum=1,
        doc="Shortest session timeout a group member may ask for "
        "(group.min.session.timeout.ms); shorter ones get INVALID_SESSION_TIMEOUT.",
    )
    group_max_session_timeout_ms: int = setting(
        1_800_000,
        minimum=1,
        doc="Longest session timeout a group member may ask for (group.max.session.timeout.ms).",
    )
    group_initial_rebalance_delay_ms: int = setting(
        3_000,
        minimum=0,
        doc="How long an empty group's first rebalance waits for more members to join, "
        "each new one extending the wait up to the rebalance timeout "
        "(group.initial.rebalance.delay.ms); 0 forms the generation at once.",
    )
    group_max_size: int = setting(
        1_000,
        minimum=1,
        doc="Most members a group may have (group.max.size; Kafka's is unbounded): "
        "one more gets GROUP_MAX_SIZE_REACHED.",
    )
    controller_connect_timeout_ms: int = setting(
        30_000,
        minimum=1,
        doc="How long start-up keeps trying to reach the controller before it gives up.",
    )
    controlled_shutdown_timeout_ms: int = setting(
        10_000, minimum=1, doc="How long SIGTERM waits for the controller to move leaderships away."
    )
    retention_check_interval_ms: int = setting(
        300_000, minimum=1, doc="How often retention looks for segments to delete."
    )
    hw_checkpoint_interval_ms: int = setting(
        5_000, minimum=1, doc="How often high watermarks and recovery points are checkpointed."
    )
    # Follower fetcher (Kafka's replica.fetch.* settings).
    replica_fetch_wait_max_ms: int = setting(
        500,
        minimum=0,
        doc="Longest a follower's fetch waits at the leader for new data "
        "(replica.fetch.wait.max.ms).",
    )
    replica_fetch_max_bytes: int = setting(
        1_048_576,
        minimum=1,
        doc="Bytes a follower asks for per partition and fetch (replica.fetch.max.bytes).",
    )
    replica_fetch_response_max_bytes: int = setting(
        10_485_760,
        minimum=1,
        doc="Bytes a follower asks for per fetch, all partitions together, and the most a "
        "follower's fetch gets from this broker as leader (replica.fetch.response.max.bytes).",
    )
    replica_fetch_backoff_ms: int = setting(
        200,
        minimum=0,
        doc="Pause of a follower's fetcher after a failed fetch (replica.fetch.backoff.ms).",
    )
    # Incremental fetch sessions (KIP-227, broker/fetch_sessions.py), Kafka's names.
    max_incremental_fetch_session_cache_slots: int = setting(
        1000,
        minimum=0,
        doc="Followers' fetch sessions this broker keeps as leader (one per follower); "
        "0 turns sessions off and every follower fetch names all its partitions "
        "(max.incremental.fetch.session.cache.slots).",
    )
    min_incremental_fetch_session_eviction_ms: int = setting(
        120_000,
        minimum=0,
        doc="How long a fetch session must have been unused before a new one may take its "
        "slot when all are taken (min.incremental.fetch.session.eviction.ms).",
    )
    # What one Fetch may return, all partitions (KIP-74: at least the first batch
    # whole): a consumer's is capped at fetch.max.bytes, a follower's at
    # replica.fetch.response.max.bytes above.
    fetch_max_bytes: int = setting(
        57_671_680,
        minimum=1,
        doc="Most record bytes a consumer's fetch gets, all partitions together, whatever it "
        "asks for; the first batch comes whole even when larger (fetch.max.bytes).",
    )
    # Connection bounds (Kafka's names where Kafka has the setting).
    max_connections: int = setting(
        10_000,
        minimum=1,
        doc="Connections open at once, all listeners together; when full, a new connection "
        "replaces the oldest one that has sent no request, else it is refused "
        "(max.connections).",
    )
    max_connections_per_ip: int = setting(
        1_000,
        minimum=0,
        doc="Connections open at once from one IP address, all listeners together; more are "
        "refused (max.connections.per.ip).",
    )
    max_connections_per_ip_overrides: dict[str, int] = per_ip_overrides_setting()
    connections_max_idle_ms: int = idle_timeout_setting()
    request_frame_timeout_ms: int = frame_timeout_setting("broker")
    max_pending_bytes_per_connection: int = pending_bytes_setting(
        "broker",
        held="requests in service, the record bytes their fetches may return, answers not "
        "yet taken by the client",
    )
    # Client quotas (broker/quota_enforcement.py): the windows rates are measured over.
    quota_window_num: int = setting(
        11,
        minimum=2,
        maximum=3600,
        doc="Windows a client's quota rate is measured over: a quota allows a burst of "
        "num - 1 windows' worth before the first throttle (quota.window.num).",
    )
    quota_window_size_seconds: int = setting(
        1,
        minimum=1,
        maximum=3600,
        doc="Length of one quota window, seconds; a request_percentage throttle is at most "
        "one window (quota.window.size.seconds).",
    )
    log_level: str = setting(
        "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), doc="Logging level (stderr)."
    )
    # Test-only switches (refused unless test faults are enabled, logged loudly): each
    # turns one protection off so a scenario test can show the failure it guards.
    enable_test_faults: bool = enable_test_faults_switch()
    unsafe_truncate_to_high_watermark: bool = unsafe_switch(
        "TEST ONLY (needs --enable-test-faults): a follower truncates to its high watermark "
        "instead of reconciling by leader epoch (pre-KIP-101): acknowledged records can be "
        "lost and replicas can diverge."
    )
    unsafe_ignore_leader_epoch: bool = unsafe_switch(
        "TEST ONLY (needs --enable-test-faults): the leader ignores current_leader_epoch in "
        "Produce, Fetch, ListOffsets and OffsetsForLeaderEpoch (pre-KIP-320/359): a deposed "
        "leader accepts writes."
    )
    unsafe_skip_fsync: bool = unsafe_switch(
        "TEST ONLY (needs --enable-test-faults): log data is never fsynced (flush.messages "
        "and flush.ms do nothing) and the recovery point stays put: a machine crash loses "
        "whatever the page cache held."
    )
    # Not settings: internal bounds with Kafka-like values.
    request_timeout_ms: int = 30_000
    metadata_max_wait_ms: int = 1_000
    max_in_flight_per_connection: int = 100
    max_frame_bytes: int = 100 * 1024 * 1024
    max_fetch_wait_ms: int = 30_000
    max_delayed_operations: int = 10_000
    flush_check_interval_ms: int = 100

    def __post_init__(self) -> None:
        if self.data_dir is None:
            object.__setattr__(self, "data_dir", Path("minibroker-data") / f"broker-{self.node_id}")
        found = problems(self)
        if found:
            raise ConfigError("; ".join(found))
        try:
            self.connection_limits()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        names = [spec.name for spec in self.listeners]
        unknown = [n for n in self.kafka_listeners if n not in names]
        if unknown:
            raise ConfigError(
                f"--kafka-listeners: {', '.join(unknown)} not among --listeners "
                f"({', '.join(names)})"
            )
        if names[0] in self.kafka_listeners:
            raise ConfigError(
                f"--kafka-listeners: {names[0]} is the first listener, which brokers "
                "replicate over in minibroker's protocol; list a native listener first"
            )
        not_listeners = sorted(set(self.listener_security_protocol_map) - set(names))
        if not_listeners:
            raise ConfigError(
                f"--listener-security-protocol-map: {', '.join(not_listeners)} not among "
                f"--listeners ({', '.join(names)})"
            )
        uses_ssl = any(uses_tls(self.security_protocol(n)) for n in names)
        sasl_out = uses_sasl(self.inter_broker_protocol) or uses_sasl(
            self.controller_security_protocol
        )
        if sasl_out and not self.sasl_server_username:
            raise ConfigError(
                "the first listener (brokers replicate over it) or "
                "--controller-security-protocol is SASL: give --sasl-server-username, "
                "the user this broker authenticates as, and its password "
                f"(--sasl-server-password-file or ${SERVER_PASSWORD_ENV})"
            )
        inter_broker_mechanism = self.sasl_mechanism_inter_broker_protocol
        if (
            uses_sasl(self.inter_broker_protocol)
            and inter_broker_mechanism not in self.sasl_enabled_mechanisms
        ):
            raise ConfigError(
                f"--sasl-mechanism-inter-broker-protocol {inter_broker_mechanism} is not among "
                f"--sasl-enabled-mechanisms ({', '.join(self.sasl_enabled_mechanisms)}): the "
                "other brokers would refuse it"
            )
        tls_problems = ssl_problems(
            self, uses_ssl=uses_ssl or uses_tls(self.controller_security_protocol)
        )
        if tls_problems:
            raise ConfigError("; ".join(tls_problems))
        if self.advertised_listeners is not None:
            adv = {spec.name for spec in self.advertised_listeners}
            if set(names) != adv:
                raise ConfigError(
                    "--advertised-listeners must name the same listeners as --listeners "
                    f"({', '.join(sorted(names))}), got {', '.join(sorted(adv))}"
                )
            for spec in self.advertised_listeners:
                if not spec.host:
                    raise ConfigError(f"--advertised-listeners: {spec} needs a host")

    @property
    def inter_broker_protocol(self) -> str:
        """Brokers replicate over the first listener, with its security protocol."""
        return self.security_protocol(self.listeners[0].name)

    def server_sasl(self, protocol: str, mechanism: str) -> SaslCredentials | None:
        """This broker's user toward servers that listen with `protocol` (None: no SASL).
        Reads the password; raises ConfigError when there is none."""
        if not uses_sasl(protocol):
            return None
        return server_credentials(
            self.sasl_server_username, self.sasl_server_password_file, mechanism
        )

    def inter_broker_sasl(self) -> SaslCredentials | None:
        """How this broker authenticates to the other brokers' first listener."""
        return self.server_sasl(
            self.inter_broker_protocol, self.sasl_mechanism_inter_broker_protocol
        )

    def controller_sasl(self) -> SaslCredentials | None:
        """How this broker authenticates to the controllers."""
        return self.server_sasl(
            self.controller_security_protocol, self.sasl_mechanism_controller_protocol
        )

    def security_protocol(self, listener: str) -> str:
        """The map's, else Kafka's default (a listener named SSL is SSL)."""
        return self.listener_security_protocol_map.get(
            listener, SSL if listener == SSL else PLAINTEXT
        )

    def log_config(self) -> LogConfig:
        """The broker-wide storage settings that a topic's configs override."""
        return LogConfig(**topic_defaults(self))

    def connection_limits(self) -> ConnectionLimits:
        return connection_limits(self, max_frame_bytes=self.max_frame_bytes)

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
