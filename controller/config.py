"""The controller's settings, each declared once (a field below), with its default.

`python -m controller` fills a `ControllerConfig` from flags > `MINIBROKER_*`
environment > TOML file > these defaults; the flag, environment variable, TOML key,
checks, `--help` line and README row of each setting come from its declaration
(runtime/settings.py). Fields without a declaration are internal bounds. Tests build
a ControllerConfig directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.api import ApiKey
from protocol.connection_limits import ConnectionLimits
from protocol.topic_configs import MIN_INSYNC_REPLICAS
from protocol.topic_configs import UNCLEAN_LEADER_ELECTION
from runtime.authorization_settings import allow_everyone_if_no_acl_found_setting
from runtime.authorization_settings import authorizer_enabled_setting
from runtime.authorization_settings import super_users_setting
from runtime.connection_settings import connection_limits
from runtime.connection_settings import frame_timeout_setting
from runtime.connection_settings import idle_timeout_setting
from runtime.connection_settings import pending_bytes_setting
from runtime.connection_settings import per_ip_overrides_setting
from runtime.sasl_settings import BOOTSTRAP_PASSWORD_ENV
from runtime.sasl_settings import password_file_setting
from runtime.sasl_settings import read_password
from runtime.sasl_settings import sasl_enabled_mechanisms_setting
from runtime.sasl_settings import username_setting
from runtime.settings import TEST_FAULTS_ENV
from runtime.settings import ConfigError
from runtime.settings import Setting
from runtime.settings import enable_test_faults_switch
from runtime.settings import parse_host_port
from runtime.settings import problems
from runtime.settings import refusal
from runtime.settings import setting
from runtime.settings import topic_setting
from runtime.settings import unsafe_switch
from runtime.settings import unsafe_switches_on
from runtime.tls import SASL_SSL
from runtime.tls import uses_sasl
from runtime.tls import uses_tls
from runtime.tls_settings import security_protocol_setting
from runtime.tls_settings import ssl_cafile_setting
from runtime.tls_settings import ssl_certfile_setting
from runtime.tls_settings import ssl_client_auth_setting
from runtime.tls_settings import ssl_keyfile_setting
from runtime.tls_settings import ssl_problems

__all__ = ["BROKER_API_KEYS", "TEST_FAULTS_ENV", "ControllerConfig", "parse_listen"]

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
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        ApiKey.CREATE_ACLS,
        ApiKey.DELETE_ACLS,
        ApiKey.ALTER_CLIENT_QUOTAS,
    )
)


def parse_listen(value: str, *, option: str = "--listen") -> tuple[str, int]:
    """Split `HOST:PORT` (IPv6 as `[::1]:9093`); port 0 picks a free port."""
    return parse_host_port(value, option=option, allow_port_zero=True)


def parse_quorum_voters(
    value: str, *, option: str = "--quorum-voters"
) -> dict[int, tuple[str, int]]:
    """`ID@HOST:PORT,...` (KRaft's controller.quorum.voters); empty: this controller
    alone."""
    voters: dict[int, tuple[str, int]] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        node, sep, address = part.partition("@")
        if not sep or not node.isdigit():
            raise ConfigError(
                f"{option}: {part!r} is not ID@HOST:PORT (e.g. 1@127.0.0.1:9093,2@...,3@...)"
            )
        if int(node) in voters:
            raise ConfigError(f"{option}: controller {node} is listed twice")
        voters[int(node)] = parse_host_port(address, option=option)
    if len(voters) % 2 == 0 and voters:
        raise ConfigError(
            f"{option}: {len(voters)} voters; use an odd number (1, 3 or 5): an even one "
            "tolerates no more failures than the odd number below it"
        )
    return voters


# One flag, two fields: `--listen HOST:PORT` fills listen_host and listen_port.
LISTEN = Setting(
    name="listen",
    kind="text",
    default="127.0.0.1:9093",
    parse=parse_listen,
    doc="HOST:PORT to listen on for brokers and tools (port 0 picks a free one; the "
    "listening log line names it).",
)


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    node_id: int = setting(0, minimum=0, doc="Controller id, reported to clients as controller_id.")
    listen_host: str = LISTEN.part(0)
    listen_port: int = LISTEN.part(1)
    data_dir: Path = setting(
        "./minibroker-data/controller",
        kind="path",
        doc="Directory of the metadata log, its snapshots and meta.properties (created if "
        "missing).",
    )
    session_timeout_ms: int = setting(
        4000,
        minimum=1,
        doc="A broker without a heartbeat for this long (while the controller runs) is "
        "fenced: its leaderships move.",
    )
    auto_leader_rebalance_enable: bool = setting(
        True,
        doc="Move leaderships back to each partition's preferred replica (the first "
        "listed) once it is in sync again, when a broker leads fewer of its preferred "
        "partitions than --leader-imbalance-per-broker-percentage allows "
        "(auto.leader.rebalance.enable).",
    )
    leader_imbalance_check_interval_ms: int = setting(
        300_000,
        minimum=100,
        doc="How often the active controller checks the leader imbalance "
        "(leader.imbalance.check.interval.seconds, in ms).",
    )
    leader_imbalance_per_broker_percentage: int = setting(
        10,
        minimum=0,
        maximum=100,
        doc="The share of a broker's preferred partitions that may be led by others before "
        "the check moves them back (leader.imbalance.per.broker.percentage).",
    )
    default_partitions: int = setting(
        1, minimum=1, doc="Partitions of a new topic that does not say."
    )
    default_replication_factor: int = setting(
        1, minimum=1, doc="Replication factor of a new topic that does not say."
    )
    default_min_insync_replicas: int = topic_setting(MIN_INSYNC_REPLICAS, at_creation=True)
    default_unclean_leader_election: bool = topic_setting(UNCLEAN_LEADER_ELECTION, at_creation=True)
    snapshot_every: int = setting(
        10_000,
        minimum=1,
        doc="Metadata records between snapshots; older log files are deleted after one.",
    )
    # Connection bounds (Kafka's names where Kafka has the setting).
    max_connections: int = setting(
        1000,
        minimum=1,
        doc="Connections open at once; when full, a new connection replaces the oldest one "
        "that has sent no request, else it is refused (max.connections).",
    )
    # Slots only connections whose first request is a broker API may use.
    reserved_broker_connections: int = setting(
        300,
        minimum=0,
        doc="Of --max-connections, slots only brokers use (a connection whose first request "
        "is a broker API); a broker opens 3. Must be below --max-connections.",
    )
    max_connections_per_ip: int = setting(
        100,
        minimum=0,
        doc="Connections from one IP address that are not brokers'; past it a connection is "
        "closed unless its first request is a broker API (max.connections.per.ip).",
    )
    max_connections_per_ip_overrides: dict[str, int] = per_ip_overrides_setting()
    first_request_timeout_ms: int = setting(
        10_000,
        minimum=1,
        doc="Close a connection that sends no whole request within this long of connecting.",
    )
    connections_max_idle_ms: int = idle_timeout_setting(exempt="a broker's")
    request_frame_timeout_ms: int = frame_timeout_setting("controller")
    max_pending_bytes_per_connection: int = pending_bytes_setting(
        "controller", held="requests in service, answers not yet taken"
    )
    security_protocol: str = security_protocol_setting(
        "Of --listen: PLAINTEXT, SSL (TLS 1.2+), SASL_PLAINTEXT or SASL_SSL (brokers and "
        "tools prove a user, checked against this controller's metadata); brokers use the "
        "same --controller-security-protocol. The quorum's controllers reach each other "
        "with its TLS, never SASL: a SASL quorum of several needs SASL_SSL and "
        "--ssl-client-auth (they prove themselves by certificate)."
    )
    sasl_enabled_mechanisms: tuple[str, ...] = sasl_enabled_mechanisms_setting(
        "a SASL_PLAINTEXT or SASL_SSL --listen"
    )
    sasl_bootstrap_username: str | None = username_setting(
        "A user the active controller creates (SCRAM-SHA-256 and -512 credentials) when the "
        "metadata has none of that name, so the first broker can authenticate to a SASL "
        "controller (as KIP-900's storage format --add-scram). Never changes an existing "
        "user."
    )
    sasl_bootstrap_password_file: Path | None = password_file_setting(
        "--sasl-bootstrap-username", BOOTSTRAP_PASSWORD_ENV
    )
    ssl_certfile: Path | None = ssl_certfile_setting()
    ssl_keyfile: Path | None = ssl_keyfile_setting()
    ssl_cafile: Path | None = ssl_cafile_setting()
    ssl_client_auth: str = ssl_client_auth_setting()
    authorizer_enabled: bool = authorizer_enabled_setting()
    super_users: frozenset[str] = super_users_setting()
    allow_everyone_if_no_acl_found: bool = allow_everyone_if_no_acl_found_setting()
    quorum_voters: dict[int, tuple[str, int]] = setting(
        "",
        parse=parse_quorum_voters,
        shown_default="this controller alone",
        doc="The controller quorum: ID@HOST:PORT of every voter, this one included, the "
        "same list on each (controller.quorum.voters). One leader (the active controller) "
        "at a time; a majority must be up.",
    )
    cluster_id: str = setting(
        "",
        kind="text",
        shown_default="made up by a single controller",
        doc="The cluster id an empty data dir is formatted with; every voter of a quorum "
        "must be given the same one (a single controller makes one up). A data dir of "
        "another cluster is refused.",
    )
    quorum_fetch_timeout_ms: int = setting(
        1000,
        minimum=100,
        doc="A voter that has not heard from the quorum leader for this long stands for "
        "election; a leader not heard from by a majority for this long steps down "
        "(controller.quorum.fetch.timeout.ms).",
    )
    quorum_election_timeout_ms: int = setting(
        500,
        minimum=50,
        doc="An election round lasts a random time between this and twice this "
        "(controller.quorum.election.timeout.ms).",
    )
    log_level: str = setting(
        "INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        doc="Logging threshold (logs go to stderr).",
    )

    # Bounds (not settings: they protect the process, not tune it).
    max_request_bytes: int = 16 * 1024 * 1024  # controller requests are small
    max_in_flight_per_connection: int = 100
    max_metadata_waiters: int = 1000  # parked FetchMetadata long-polls
    max_metadata_wait_ms: int = 30_000  # cap on a FetchMetadata max_wait_ms
    max_metadata_records: int = 10_000  # cap on entries per FetchMetadata answer
    max_partitions_per_topic: int = 10_000

    # TEST ONLY: serve FaultControl (controller/faults.py) and allow the unsafe switches
    # below. Built directly (tests), it follows MINIBROKER_ENABLE_TEST_FAULTS.
    enable_test_faults: bool = enable_test_faults_switch(follow_environment=True)
    # (KIP-903 scenario) skip the check that each new ISR member's broker epoch in
    # AlterPartition equals its registered epoch, so a test can show the data loss the
    # check prevents.
    unsafe_ignore_broker_epochs: bool = unsafe_switch(
        "TEST ONLY (needs --enable-test-faults): AlterPartition accepts ISR members with a "
        "stale broker epoch (pre-KIP-903)."
    )
    # (KIP-101 scenario 1) a broker that registers again (a restart) stays in the ISRs it
    # was in, as under ZooKeeper when it came back within the lag time; only its
    # leaderships move. Without it the new incarnation leaves every ISR (KIP-903).
    unsafe_keep_restarted_replicas_in_isr: bool = unsafe_switch(
        "TEST ONLY (needs --enable-test-faults): a re-registering broker stays in the ISRs "
        "it was in (the ZooKeeper-era behaviour of KIP-101 scenario 1); only its "
        "leaderships move."
    )

    def __post_init__(self) -> None:
        found = problems(self)
        if not 0 <= self.listen_port <= 65535:
            found.append(f"--listen: port {self.listen_port} is outside 0..65535")
        if not 0 <= self.reserved_broker_connections < self.max_connections:
            found.append(
                f"--reserved-broker-connections ({self.reserved_broker_connections}) must be "
                f"below --max-connections ({self.max_connections})"
            )
        elif not found:
            try:
                self.connection_limits()
            except ValueError as exc:
                found.append(str(exc))
        if self.quorum_voters and self.node_id not in self.quorum_voters:
            found.append(
                f"--quorum-voters does not list this controller's --node-id {self.node_id}"
            )
        found.extend(ssl_problems(self, uses_ssl=uses_tls(self.security_protocol)))
        if (
            uses_sasl(self.security_protocol)
            and len(self.voters) > 1
            and (self.security_protocol != SASL_SSL or self.ssl_client_auth.upper() == "NONE")
        ):
            found.append(
                f"--security-protocol {self.security_protocol} with {len(self.voters)} voters: "
                "the quorum's controllers do not use SASL with each other (a new voter has no "
                "users yet), they prove themselves by TLS certificate: use SASL_SSL with "
                "--ssl-client-auth requested or required"
            )
        refused = refusal(self)
        if refused:
            found.append(refused)
        if found:
            raise ConfigError("; ".join(found))

    def connection_limits(self) -> ConnectionLimits:
        return connection_limits(
            self,
            max_frame_bytes=self.max_request_bytes,
            reserved_connections=self.reserved_broker_connections,
            privileged_api_keys=BROKER_API_KEYS,
            first_request_timeout_ms=self.first_request_timeout_ms,
        )

    def bootstrap_password(self) -> str | None:
        """The bootstrap user's password (None: no bootstrap user). Raises ConfigError."""
        if not self.sasl_bootstrap_username:
            return None
        return read_password(
            self.sasl_bootstrap_password_file,
            BOOTSTRAP_PASSWORD_ENV,
            option="--sasl-bootstrap-password-file",
        )

    @property
    def protections_off(self) -> tuple[str, ...]:
        """The unsafe switches that are on, by flag name."""
        return unsafe_switches_on(self)

    @property
    def voters(self) -> dict[int, tuple[str, int]]:
        """The quorum's voters: --quorum-voters, or this controller alone."""
        return self.quorum_voters or {self.node_id: (self.listen_host, self.listen_port)}

    @property
    def session_timeout_s(self) -> float:
        return self.session_timeout_ms / 1000.0

    @property
    def listen(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"
