"""Where the cluster under test runs, and how faults reach it.

Both backends run the controllers (one, node "controller", or a quorum of 3 or 5,
"controller-0".."controller-N-1" with node ids 0..N-1) and brokers "broker-1".."broker-N"
(node ids 1..N), and offer the same operations to the nemesis: kill (SIGKILL), start,
pause / resume (SIGSTOP / SIGCONT, or the cgroup freezer), isolate / reconnect (a
network partition of one node from the others), wipe (kill, delete the node's data,
start again: a disk lost, KIP-903).

- DockerBackend: the repository's docker-compose.yml under a compose project of its
  own (`minibroker-chaos-<seed>-<pid>`, so runs never collide), on free host ports;
  three controllers and three brokers, as the compose file has them.
  A partition is `docker network disconnect` (the node then reaches nobody, clients
  included) and `docker network connect` with its service alias back. Always torn
  down with `down -v` (in `down()`, and from atexit should the run die); the logs
  are saved with `collect_logs()` before.
- ProcessBackend: local processes on 127.0.0.1 (like tests/integration/cluster.py):
  signals, and `rm -r` of a data directory. No network partitions: `isolate`
  raises Unsupported (the nemesis logs the reason and records the fault as skipped).
  The children die with this process (PR_SET_PDEATHSIG), and `down()` (also from
  atexit) stops them.

`copy_data(node, dest)` copies a node's data directory while it runs (the checker
reads the controllers' metadata logs from such copies).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from abc import ABC
from abc import abstractmethod
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from client.admin import AsyncAdmin
from client.security import create_ssl_context
from client.throwaway_ca import ThrowawayCA
from runtime.acl import AclBinding
from runtime.acl import AclOperation
from runtime.acl import AclPermission
from runtime.acl import PatternType
from runtime.acl import ResourceType
from runtime.sasl import SaslCredentials
from tests.integration.cluster import run_command
from tests.integration.cluster import spawn_logged
from tests.integration.cluster import stop_in_order

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DEFAULT_IMAGE = "minibroker:latest"
CONTROLLER = "controller"  # the node name of a single controller
QUORUM_CLUSTER_ID = "minibroker-chaos"


# Faults the process backend cannot inject, and why.
_NO_NETWORK = (
    "the process backend cannot partition the network (all nodes share 127.0.0.1); use "
    "--backend docker"
)
PROCESS_UNSUPPORTED = {"partition": _NO_NETWORK, "partition-controller": _NO_NETWORK}


def unsupported_faults(backend: str, faults: list[str]) -> dict[str, str]:
    """The faults among `faults` that `backend` cannot inject, with the reason."""
    table = PROCESS_UNSUPPORTED if backend == "process" else {}
    return {f: table[f] for f in faults if f in table}


class Unsupported(Exception):
    """This backend cannot inject that fault; the message says why."""


class BackendError(Exception):
    """A backend operation failed (the message carries the command's output)."""


def broker_name(node_id: int) -> str:
    return f"broker-{node_id}"


def broker_id(node: str) -> int | None:
    m = re.fullmatch(r"broker-(\d+)", node)
    return int(m[1]) if m else None


def controller_name(node_id: int, controllers: int) -> str:
    """ "controller" when it is the only one, else "controller-<id>"."""
    return CONTROLLER if controllers == 1 else f"controller-{node_id}"


def controller_id(node: str) -> int | None:
    if node == CONTROLLER:
        return 0
    m = re.fullmatch(r"controller-(\d+)", node)
    return int(m[1]) if m else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A secure run's users: the servers' own (the controllers' bootstrap user, a super user)
# and the workload's, allowed its topics and group by ACLs (prefixed WORKLOAD_PREFIX).
SERVER_USER = "chaos-server"
WORKLOAD_USER = "chaos-workload"
WORKLOAD_PREFIX = "chaos"
SCRAM_SHA_512 = "SCRAM-SHA-512"
ALLOW = AclPermission.ALLOW


@dataclass
class ClusterSettings:
    """What the servers are started with (both backends)."""

    brokers: int = 3
    controllers: int = 1  # 1, or a quorum of 3 or 5 (the docker backend: 3)
    # TLS on every listener and between the servers, certificates from a throwaway CA
    # (process backend); the workload's clients connect with SSL too.
    tls: bool = False
    # On top of TLS: SASL_SSL (SCRAM) on every listener, between the servers too, and
    # the authorizer on; the workload runs as a user with ACLs on its topic and group
    # (process backend).
    secure: bool = False
    session_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 250
    replica_lag_time_max_ms: int = 5000
    # Extra MINIBROKER_* settings for every broker / the controller.
    broker_env: dict[str, str] = field(default_factory=dict)
    controller_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ChaosTls:
    """What the run's clients need to reach a cluster whose listeners are all SSL, or
    all SASL_SSL (`sasl`: the workload's user; `admin`: a super user, for the checker's
    own requests). The checker presents `certfile` (a super user's certificate): the
    controllers of a secure run answer the quorum's APIs to servers' certificates."""

    cafile: Path
    certfile: Path | None = None
    keyfile: Path | None = None
    sasl: SaslCredentials | None = None
    admin: SaslCredentials | None = None

    def library(self) -> dict[str, Any]:
        """Options of minibroker's clients (AsyncProducer, AsyncConsumer, AsyncAdmin)."""
        if self.sasl is None:
            return {"security_protocol": "SSL", "ssl_context": self.context()}
        return {
            "security_protocol": "SASL_SSL",
            "ssl_context": self.context(),
            "sasl_mechanism": self.sasl.mechanism,
            "sasl_plain_username": self.sasl.username,
            "sasl_plain_password": self.sasl.password,
        }

    def librdkafka(self) -> dict[str, str]:
        if self.sasl is None:
            return {"security.protocol": "ssl", "ssl.ca.location": str(self.cafile)}
        return {
            "security.protocol": "sasl_ssl",
            "ssl.ca.location": str(self.cafile),
            "sasl.mechanisms": self.sasl.mechanism,
            "sasl.username": self.sasl.username,
            "sasl.password": self.sasl.password,
        }

    def context(self) -> ssl.SSLContext:
        return create_ssl_context(cafile=self.cafile, certfile=self.certfile, keyfile=self.keyfile)


class Backend(ABC):
    name = "abstract"
    tls: ChaosTls | None = None  # set by up() when settings.tls

    def __init__(self, settings: ClusterSettings, workdir: Path) -> None:
        self.settings = settings
        self.workdir = workdir
        self.broker_ids = list(range(1, settings.brokers + 1))
        if settings.controllers not in (1, 3, 5):
            raise ValueError(f"controllers: 1, 3 or 5, not {settings.controllers}")
        self.controller_ids = list(range(settings.controllers))

    def tls_context(self) -> ssl.SSLContext | None:
        """For raw connections to the servers (None: plaintext)."""
        return self.tls.context() if self.tls is not None else None

    def admin_sasl(self) -> SaslCredentials | None:
        """The super user raw connections to the brokers authenticate as (None: none)."""
        return self.tls.admin if self.tls is not None else None

    def client_options(self) -> dict[str, Any]:
        """minibroker's clients' security options ({} when plaintext)."""
        return self.tls.library() if self.tls is not None else {}

    @property
    def controller_nodes(self) -> list[str]:
        return [controller_name(i, len(self.controller_ids)) for i in self.controller_ids]

    @property
    def nodes(self) -> list[str]:
        """Controllers first: brokers register with them."""
        return [*self.controller_nodes, *(broker_name(i) for i in self.broker_ids)]

    @abstractmethod
    async def up(self) -> None:
        """Start the cluster; return when every node is up."""

    @abstractmethod
    async def down(self) -> None:
        """Stop everything and remove what up() created (idempotent)."""

    @abstractmethod
    def bootstrap_servers(self) -> str: ...

    @abstractmethod
    def kafka_bootstrap_servers(self) -> str:
        """The brokers' Kafka listeners, for Kafka clients (librdkafka)."""

    @abstractmethod
    def broker_addresses(self) -> dict[int, tuple[str, int]]:
        """node id -> (host, port) reachable from this process."""

    @abstractmethod
    def controller_addresses(self) -> dict[int, tuple[str, int]]:
        """controller node id -> (host, port) reachable from this process."""

    @abstractmethod
    async def copy_data(self, node: str, dest: Path) -> None:
        """Copy the node's data directory (as it is now) to `dest`."""

    @abstractmethod
    async def kill(self, node: str) -> None: ...

    @abstractmethod
    async def start(self, node: str) -> None:
        """Start a killed node again (no-op when it runs); waits until it is up."""

    @abstractmethod
    async def pause(self, node: str) -> None: ...

    @abstractmethod
    async def resume(self, node: str) -> None: ...

    @abstractmethod
    async def isolate(self, node: str) -> None: ...

    @abstractmethod
    async def reconnect(self, node: str) -> None: ...

    @abstractmethod
    async def wipe(self, node: str) -> None:
        """Kill the node, delete its data, start it again."""

    @abstractmethod
    async def running(self, node: str) -> bool: ...

    @abstractmethod
    async def collect_logs(self, dest: Path) -> None:
        """Copy every node's log into `dest`."""

    def unsupported(self, fault: str) -> str | None:
        """Why this backend cannot inject `fault` (None: it can)."""
        return None


# ------------------------------------------------------------------ local processes

_CONTROLLER_READY = re.compile(r"controller \d+ listening on")
_BROKER_READY = re.compile(r"broker \d+ started")
_PR_SET_PDEATHSIG = 1


# Resolved here, in the parent: loading a library in a forked child of a threaded
# process can deadlock.
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the children then outlive a killed runner
    _prctl = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Proc:
    node: str
    args: list[str]
    log_path: Path
    data_dir: Path
    ready: re.Pattern[str]
    popen: subprocess.Popen[bytes] | None = None
    log_start: int = 0
    paused: bool = False

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class ProcessBackend(Backend):
    """The cluster as local processes under `workdir` (logs: `<node>.log`)."""

    name = "process"
    START_TIMEOUT_S = 60.0

    def __init__(self, settings: ClusterSettings, workdir: Path) -> None:
        super().__init__(settings, workdir)
        self.controller_ports = {i: free_port() for i in self.controller_ids}
        self.ports = {i: free_port() for i in self.broker_ids}
        self.kafka_ports = {i: free_port() for i in self.broker_ids}  # the Kafka listeners
        self.procs: dict[str, _Proc] = {}
        self._env: dict[str, dict[str, str]] = {}  # node -> its MINIBROKER_* settings
        self._down = False
        atexit.register(self._down_sync)

    def unsupported(self, fault: str) -> str | None:
        return PROCESS_UNSUPPORTED.get(fault)

    def _make(self) -> None:
        s = self.settings
        self.workdir.mkdir(parents=True, exist_ok=True)
        py = sys.executable
        ctl_env = {
            "MINIBROKER_SESSION_TIMEOUT_MS": str(s.session_timeout_ms),
            **s.controller_env,
        }
        ca = ThrowawayCA.create(self.workdir / "tls") if s.tls or s.secure else None
        if ca is not None:
            self.tls = ChaosTls(ca.cafile)
        # Secure: SASL_SSL everywhere as SERVER_USER (the controllers' bootstrap user), the
        # authorizer on with the servers (and the checker's certificate) as super users.
        protocol = "SASL_SSL" if s.secure else "SSL"
        secure_controller: list[str] = []
        secure_broker: list[str] = []
        if ca is not None and s.secure:
            checker = ca.issue("chaos-checker")
            password_file = self.workdir / "tls" / "server.pw"
            password_file.write_text(f"{uuid.uuid4().hex}\n")
            password_file.chmod(0o600)
            server_password = password_file.read_text().strip()
            self.tls = ChaosTls(
                ca.cafile,
                checker.certfile,
                checker.keyfile,
                sasl=SaslCredentials(SCRAM_SHA_512, WORKLOAD_USER, uuid.uuid4().hex),
                admin=SaslCredentials(SCRAM_SHA_512, SERVER_USER, server_password),
            )
            supers = ";".join(
                [f"User:{SERVER_USER}", "User:CN=chaos-checker"]
                + [f"User:CN={node}" for node in self.controller_nodes]
            )
            authorizer = ["--authorizer-enabled", "true", "--super-users", supers]
            secure_controller = [
                *("--ssl-client-auth", "requested"),
                *("--sasl-bootstrap-username", SERVER_USER),
                *("--sasl-bootstrap-password-file", str(password_file)),
                *authorizer,
            ]
            secure_broker = [
                *("--sasl-server-username", SERVER_USER),
                *("--sasl-server-password-file", str(password_file)),
                *authorizer,
            ]

        def tls_flags(node: str) -> list[str]:
            if ca is None:
                return []
            cert = ca.issue(node, hosts=["127.0.0.1", "localhost"])
            return [
                *("--ssl-certfile", str(cert.certfile), "--ssl-keyfile", str(cert.keyfile)),
                *("--ssl-cafile", str(ca.cafile)),
            ]

        quorum: list[str] = []
        if len(self.controller_ids) > 1:
            voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in self.controller_ports.items())
            quorum = ["--quorum-voters", voters, "--cluster-id", QUORUM_CLUSTER_ID]
        for i, node in zip(self.controller_ids, self.controller_nodes, strict=True):
            data = self.workdir / node
            self.procs[node] = _Proc(
                node,
                [
                    *(py, "-m", "controller", "--node-id", str(i)),
                    *("--listen", f"127.0.0.1:{self.controller_ports[i]}"),
                    *("--data-dir", str(data)),
                    *quorum,
                    *(["--security-protocol", protocol, *tls_flags(node)] if ca else []),
                    *secure_controller,
                ],
                self.workdir / f"{node}.log",
                data,
                _CONTROLLER_READY,
            )
            self._env[node] = ctl_env
        controllers = ",".join(f"127.0.0.1:{p}" for p in self.controller_ports.values())
        for i in self.broker_ids:
            node = broker_name(i)
            data = self.workdir / node
            self.procs[node] = _Proc(
                node,
                [
                    *(py, "-m", "broker", "--node-id", str(i)),
                    *(
                        "--listeners",
                        f"PLAINTEXT://127.0.0.1:{self.ports[i]},"
                        f"KAFKA://127.0.0.1:{self.kafka_ports[i]}",
                    ),
                    *("--kafka-listeners", "KAFKA"),
                    *("--controller", controllers),
                    *("--data-dir", str(data)),
                    *(
                        [
                            *(
                                "--listener-security-protocol-map",
                                f"PLAINTEXT:{protocol},KAFKA:{protocol}",
                            ),
                            *("--controller-security-protocol", protocol),
                            *tls_flags(node),
                            *secure_broker,
                        ]
                        if ca
                        else []
                    ),
                ],
                self.workdir / f"{node}.log",
                data,
                _BROKER_READY,
            )
            self._env[node] = {
                "MINIBROKER_HEARTBEAT_INTERVAL_MS": str(s.heartbeat_interval_ms),
                "MINIBROKER_REPLICA_LAG_TIME_MAX_MS": str(s.replica_lag_time_max_ms),
                "MINIBROKER_CONTROLLER_CONNECT_TIMEOUT_MS": "120000",
                **s.broker_env,
            }

    def _spawn(self, proc: _Proc) -> None:
        assert not proc.alive, f"{proc.node} is running"
        proc.log_start = proc.log_path.stat().st_size if proc.log_path.exists() else 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINIBROKER_")}
        env.update(PYTHONUNBUFFERED="1", **self._env[proc.node])
        # Spawned from the event loop's (main) thread: PDEATHSIG fires when the
        # spawning thread exits.
        proc.popen = spawn_logged(proc.args, proc.log_path, env, preexec_fn=_die_with_parent)
        proc.paused = False

    async def _wait_ready(self, proc: _Proc, timeout: float | None = None) -> None:
        timeout = timeout or self.START_TIMEOUT_S
        deadline = time.monotonic() + timeout
        while True:
            text = proc.log_path.read_bytes()[proc.log_start :].decode(errors="replace")
            if proc.ready.search(text):
                return
            if not proc.alive:
                tail = "\n".join(text.splitlines()[-20:])
                raise BackendError(f"{proc.node} exited before it was ready:\n{tail}")
            if time.monotonic() > deadline:
                raise BackendError(f"{proc.node} not ready after {timeout}s")
            await asyncio.sleep(0.05)

    async def up(self) -> None:
        self._make()
        controllers = [self.procs[node] for node in self.controller_nodes]
        for c in controllers:
            self._spawn(c)
        await asyncio.gather(*(self._wait_ready(c) for c in controllers))
        brokers = [self.procs[broker_name(i)] for i in self.broker_ids]
        for b in brokers:
            self._spawn(b)
        await asyncio.gather(*(self._wait_ready(b) for b in brokers))
        if self.settings.secure:
            await self._grant_workload()

    async def _grant_workload(self) -> None:
        """The workload's user, with what it needs on its topics and group (chaos*),
        created by the servers' user (a super user)."""
        assert self.tls is not None and self.tls.sasl is not None and self.tls.admin is not None
        admin_options = {
            **self.tls.library(),
            "sasl_plain_username": self.tls.admin.username,
            "sasl_plain_password": self.tls.admin.password,
        }
        async with AsyncAdmin(self.bootstrap_servers(), **admin_options) as admin:
            await admin.create_user(
                self.tls.sasl.username, self.tls.sasl.password, mechanism=SCRAM_SHA_512
            )
            await admin.create_acls(
                [
                    AclBinding(kind, WORKLOAD_PREFIX, PatternType.PREFIXED, user, "*", op, ALLOW)
                    for kind, op in (
                        (ResourceType.TOPIC, AclOperation.ALL),
                        (ResourceType.GROUP, AclOperation.READ),
                        (ResourceType.GROUP, AclOperation.DESCRIBE),
                    )
                    for user in (f"User:{self.tls.sasl.username}",)
                ]
            )

    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[i]}" for i in self.broker_ids)

    def kafka_bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_ports[i]}" for i in self.broker_ids)

    def broker_addresses(self) -> dict[int, tuple[str, int]]:
        return {i: ("127.0.0.1", self.ports[i]) for i in self.broker_ids}

    def controller_addresses(self) -> dict[int, tuple[str, int]]:
        return {i: ("127.0.0.1", p) for i, p in self.controller_ports.items()}

    async def copy_data(self, node: str, dest: Path) -> None:
        source = self.procs[node].data_dir
        await asyncio.to_thread(shutil.copytree, source, dest, dirs_exist_ok=True)

    async def kill(self, node: str) -> None:
        proc = self.procs[node]
        if proc.popen is not None and proc.popen.poll() is None:
            proc.popen.kill()  # SIGKILL works on a stopped process too
            await asyncio.to_thread(proc.popen.wait, 10)
        proc.paused = False

    async def start(self, node: str) -> None:
        proc = self.procs[node]
        if proc.alive:
            if proc.paused:
                await self.resume(node)
            return
        self._spawn(proc)
        await self._wait_ready(proc)

    async def pause(self, node: str) -> None:
        proc = self.procs[node]
        if proc.alive:
            assert proc.popen is not None
            proc.popen.send_signal(signal.SIGSTOP)
            proc.paused = True

    async def resume(self, node: str) -> None:
        proc = self.procs[node]
        if proc.alive:
            assert proc.popen is not None
            proc.popen.send_signal(signal.SIGCONT)
        proc.paused = False

    async def isolate(self, node: str) -> None:
        raise Unsupported(self.unsupported("partition") or "")

    async def reconnect(self, node: str) -> None:
        return None  # nothing is ever isolated

    async def wipe(self, node: str) -> None:
        await self.kill(node)
        proc = self.procs[node]
        shutil.rmtree(proc.data_dir, ignore_errors=True)
        self._spawn(proc)
        await self._wait_ready(proc)

    async def running(self, node: str) -> bool:
        return self.procs[node].alive

    async def collect_logs(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for proc in self.procs.values():
            if proc.log_path.exists() and proc.log_path.parent != dest:
                shutil.copy2(proc.log_path, dest / proc.log_path.name)

    async def down(self) -> None:
        await asyncio.to_thread(self._down_sync)

    def _down_sync(self) -> None:
        if self._down:
            return
        self._down = True
        controllers = set(self.controller_nodes)
        groups = [
            [p.popen for n, p in self.procs.items() if n not in controllers],
            [p.popen for n, p in self.procs.items() if n in controllers],
        ]
        stop_in_order(groups, 15.0)
        atexit.unregister(self._down_sync)


# ------------------------------------------------------------------ docker compose


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) if it works, else `docker-compose`, else None."""
    if shutil.which("docker") is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = run_command(["docker", "compose", "version"], timeout=20)
        if r.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    return None


def docker_unavailable(image: str | None = DEFAULT_IMAGE) -> str | None:
    """Why the docker backend cannot run here (None: it can); `image` None skips the
    image check."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        r = run_command(["docker", "version", "--format", "{{.Server.Version}}"], timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run docker: {exc}"
    if r.returncode != 0:
        return f"cannot reach the Docker daemon: {r.stderr.strip() or r.stdout.strip()}"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    if image is None:
        return None
    r = run_command(["docker", "image", "inspect", image], timeout=20)
    if r.returncode != 0:
        return f"the image {image} is missing: build it with docker/build-images.sh"
    return None


def project_name(seed: int) -> str:
    return f"minibroker-chaos-{seed}-{os.getpid()}"


class DockerBackend(Backend):
    """The compose cluster under its own project name and host ports."""

    name = "docker"
    HEALTHY_TIMEOUT_S = 120.0

    def __init__(
        self,
        settings: ClusterSettings,
        workdir: Path,
        *,
        seed: int,
        image: str = DEFAULT_IMAGE,
        compose_file: Path = COMPOSE_FILE,
    ) -> None:
        super().__init__(settings, workdir)
        if settings.brokers != 3 or settings.controllers != 3:
            raise ValueError("docker-compose.yml has exactly three controllers and three brokers")
        compose = compose_command()
        if compose is None:
            raise BackendError("neither `docker compose` nor `docker-compose` is installed")
        self.compose = compose
        self.project = project_name(seed)
        self.image = image
        self.compose_file = compose_file
        self.controller_ports = {i: free_port() for i in self.controller_ids}
        self.ports = {i: free_port() for i in self.broker_ids}
        self.kafka_ports = {i: free_port() for i in self.broker_ids}  # the Kafka listeners
        self.override = workdir / "compose.chaos.yml"
        self._isolated: dict[str, list[tuple[str, list[str]]]] = {}
        self.image_id = ""
        self._created = False
        self._down = False
        atexit.register(self._down_sync)

    # -------------------------------------------------------------- plumbing

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            MINIBROKER_IMAGE=self.image,
            **{f"CONTROLLER_{i}_PORT": str(p) for i, p in self.controller_ports.items()},
            **{f"BROKER_{i}_PORT": str(p) for i, p in self.ports.items()},
            **{f"BROKER_{i}_KAFKA_PORT": str(p) for i, p in self.kafka_ports.items()},
        )
        return env

    def _compose_args(self, *args: str) -> list[str]:
        return [
            *self.compose,
            "-p",
            self.project,
            "-f",
            str(self.compose_file),
            "-f",
            str(self.override),
            *args,
        ]

    async def _run(
        self, args: list[str], *, timeout: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        def run() -> subprocess.CompletedProcess[str]:
            return run_command(args, timeout=timeout, env=self._env())

        try:
            r = await asyncio.to_thread(run)
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"{' '.join(args)}: no answer in {timeout}s") from exc
        if check and r.returncode != 0:
            raise BackendError(
                f"{' '.join(args)} exited with {r.returncode}: {(r.stderr or r.stdout).strip()}"
            )
        return r

    def _write_override(self) -> None:
        s = self.settings
        controller = {"MINIBROKER_SESSION_TIMEOUT_MS": str(s.session_timeout_ms)}
        controller.update(s.controller_env)
        broker = {
            "MINIBROKER_HEARTBEAT_INTERVAL_MS": str(s.heartbeat_interval_ms),
            "MINIBROKER_REPLICA_LAG_TIME_MAX_MS": str(s.replica_lag_time_max_ms),
            "MINIBROKER_CONTROLLER_CONNECT_TIMEOUT_MS": "120000",
        }
        broker.update(s.broker_env)
        services: dict[str, object] = {
            node: {"environment": controller} for node in self.controller_nodes
        }
        for i in self.broker_ids:
            services[broker_name(i)] = {"environment": broker}
        self.workdir.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: no YAML library needed.
        self.override.write_text(json.dumps({"services": services}, indent=2) + "\n")

    async def _container(self, node: str) -> str:
        r = await self._run(self._compose_args("ps", "-a", "-q", node), timeout=30)
        cid = r.stdout.strip().splitlines()
        if not cid:
            raise BackendError(f"no container for {node} in project {self.project}")
        return cid[-1]

    async def _inspect(self, cid: str) -> dict[str, object]:
        r = await self._run(["docker", "inspect", cid], timeout=30)
        return json.loads(r.stdout)[0]

    async def _wait_healthy(self, nodes: list[str], timeout: float | None = None) -> None:
        timeout = timeout or self.HEALTHY_TIMEOUT_S
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        status: dict[str, str] = {}
        while pending:
            for node in list(pending):
                state = (await self._inspect(await self._container(node)))["State"]
                assert isinstance(state, dict)
                health = state.get("Health") or {}
                status[node] = f"{state.get('Status')}/{health.get('Status', 'no healthcheck')}"
                if state.get("Status") == "running" and health.get("Status") in (None, "healthy"):
                    pending.remove(node)
                elif state.get("Status") in ("exited", "dead"):
                    raise BackendError(f"{node} is {state.get('Status')}: {status}")
            if not pending:
                return
            if time.monotonic() > deadline:
                raise BackendError(f"not healthy after {timeout}s: {status}")
            await asyncio.sleep(0.5)

    # -------------------------------------------------------------- lifecycle

    async def up(self) -> None:
        r = await self._run(
            ["docker", "image", "inspect", "--format", "{{.Id}} {{.Created}}", self.image]
        )
        self.image_id = r.stdout.strip()  # which build the run tested
        self._write_override()
        self._created = True
        log.info(
            "docker: project %s, controller ports %s, broker ports %s",
            self.project,
            self.controller_ports,
            self.ports,
        )
        await self._run(self._compose_args("up", "-d"), timeout=self.HEALTHY_TIMEOUT_S)
        await self._wait_healthy(self.nodes)

    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[i]}" for i in self.broker_ids)

    def kafka_bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_ports[i]}" for i in self.broker_ids)

    def broker_addresses(self) -> dict[int, tuple[str, int]]:
        return {i: ("127.0.0.1", self.ports[i]) for i in self.broker_ids}

    def controller_addresses(self) -> dict[int, tuple[str, int]]:
        return {i: ("127.0.0.1", p) for i, p in self.controller_ports.items()}

    async def copy_data(self, node: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        cid = await self._container(node)
        await self._run(["docker", "cp", f"{cid}:/var/lib/minibroker", str(dest)])

    async def kill(self, node: str) -> None:
        cid = await self._container(node)
        await self._run(["docker", "kill", "--signal", "KILL", cid], check=False)

    async def start(self, node: str) -> None:
        cid = await self._container(node)
        state = (await self._inspect(cid))["State"]
        assert isinstance(state, dict)
        if state.get("Paused"):
            await self._run(["docker", "unpause", cid])
        elif state.get("Status") != "running":
            await self._run(["docker", "start", cid])
        await self._wait_healthy([node])

    async def pause(self, node: str) -> None:
        await self._run(["docker", "pause", await self._container(node)])

    async def resume(self, node: str) -> None:
        cid = await self._container(node)
        state = (await self._inspect(cid))["State"]
        assert isinstance(state, dict)
        if state.get("Paused"):
            await self._run(["docker", "unpause", cid])

    async def isolate(self, node: str) -> None:
        cid = await self._container(node)
        settings = (await self._inspect(cid))["NetworkSettings"]
        assert isinstance(settings, dict)
        networks = settings.get("Networks") or {}
        saved: list[tuple[str, list[str]]] = []
        for net, conf in networks.items():
            aliases = [a for a in (conf.get("Aliases") or []) if not cid.startswith(a)]
            await self._run(["docker", "network", "disconnect", net, cid])
            saved.append((net, aliases or [node]))
        self._isolated[node] = saved

    async def reconnect(self, node: str) -> None:
        saved = self._isolated.pop(node, [])
        if not saved:
            return
        cid = await self._container(node)
        for net, aliases in saved:
            args = ["docker", "network", "connect"]
            for alias in aliases:
                args += ["--alias", alias]
            r = await self._run([*args, net, cid], check=False)
            if r.returncode != 0 and "already exists" not in (r.stderr + r.stdout):
                raise BackendError(f"reconnecting {node} to {net}: {r.stderr.strip()}")

    async def wipe(self, node: str) -> None:
        cid = await self._container(node)
        mounts = (await self._inspect(cid))["Mounts"]
        assert isinstance(mounts, list)
        volumes = [m["Name"] for m in mounts if m.get("Type") == "volume"]
        self._isolated.pop(node, None)  # a new container is on the network again
        await self._run(["docker", "rm", "--force", cid])
        for v in volumes:
            await self._run(["docker", "volume", "rm", v])
        await self._run(self._compose_args("up", "-d", "--no-deps", node))
        await self._wait_healthy([node])

    async def running(self, node: str) -> bool:
        state = (await self._inspect(await self._container(node)))["State"]
        assert isinstance(state, dict)
        return state.get("Status") == "running" and not state.get("Paused")

    async def collect_logs(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            r = await self._run(
                self._compose_args("logs", "--no-color", "--timestamps", node),
                timeout=60,
                check=False,
            )
            (dest / f"{node}.log").write_text(r.stdout + r.stderr)

    async def down(self) -> None:
        await asyncio.to_thread(self._down_sync)

    def _down_sync(self) -> None:
        if self._down or not self._created:
            return
        self._down = True
        env = self._env()
        # Paused containers cannot be stopped: unpause them first.
        r = run_command(self._compose_args("ps", "-a", "-q"), timeout=60, env=env)
        for cid in r.stdout.split():
            run_command(["docker", "unpause", cid], timeout=30)
        r = run_command(
            self._compose_args("down", "-v", "--remove-orphans", "-t", "5"), timeout=180, env=env
        )
        if r.returncode != 0:
            log.error("docker compose down failed for %s: %s", self.project, r.stderr.strip())
        atexit.unregister(self._down_sync)
