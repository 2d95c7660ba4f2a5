"""`minibroker dev`: a local cluster (one controller or a quorum of 3 or 5, N brokers)
in the foreground.

Each server is a subprocess started by module name (`python -m controller`,
`python -m broker`): the client never imports them. Ports: brokers on base_port,
base_port+2, base_port+4, ...; the controller on base_port+1 unless given (so the
defaults, 9092 and 9093, match `python -m broker` / `python -m controller`), a quorum's
controllers on controller-port, +2, +4 (9093, 9095, 9097); each
broker's Kafka listener (Apache Kafka's protocol, for Kafka clients and tools) on
kafka_base_port, kafka_base_port+2, ... (default base_port + 10000: 19092, 19094...).

Layout under the data dir::

    controller/            the controller's metadata log (its --data-dir)
    controller-<id>/       each controller's, with --controllers 3 or 5
    broker-<id>/           each broker's log dirs (its --data-dir)
    logs/controller.log    each child's stdout and stderr, appended across runs
    logs/broker-<id>.log
    secure/                with --secure: the CA, the servers' certificates, the servers'
                           and the admin's passwords (client/secure_setup.py), reused
    dev.lock               flock held while a `minibroker dev` runs here (text: its pid)
    dev.sock               the control socket while it runs (client/dev_control.py):
                           `minibroker dev status|kill|stop|restart` from another shell

A server that dies (or is killed) once the cluster is up does not stop the others: one
line says which and how, and the cluster keeps serving; `minibroker dev restart N` starts
it again with the same data dir and ports.

Stopping (Ctrl-C or SIGTERM): SIGTERM to every broker (controlled shutdown needs the
controller, so it goes last), bounded wait, SIGKILL what is left; then the same for
the controller. A second Ctrl-C kills everything at once. Children run in their own
session, so a terminal's Ctrl-C reaches only this process, which stops them in order;
on Linux they also get SIGTERM if this process dies without cleaning up.

With --secure every listener (the brokers' native and Kafka ones, the controllers') is
SASL_SSL: the servers authenticate to each other as SERVER_USER (the controllers'
bootstrap user) and the controllers of a quorum by certificate; the authorizer is on
with the servers and the admin as super users; the admin user is created once the
brokers are up, and the client settings are printed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import IO
from typing import TextIO

from client import dev_control
from client.connection import BrokerConnection
from client.errors import MinibrokerError
from client.secure_setup import SERVER_USER
from client.secure_setup import SecureFiles
from client.secure_setup import SecureSetupError
from client.secure_setup import client_settings_lines
from client.secure_setup import ensure_admin
from client.secure_setup import prepare
from client.secure_setup import super_users
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from runtime.active_controller import ActiveController
from runtime.linux_libc import linux_libc_function
from runtime.sasl import SaslCredentials

CONTROLLER_ID = 0
POLL_INTERVAL = 0.1
LOG_TAIL_LINES = 20


class DevClusterError(Exception):
    """Startup or shutdown failed; the message says what and where to look."""


# Where the Kafka listeners start when not given: 19092 for the default base port.
KAFKA_PORT_OFFSET = 10_000


def broker_ports(base_port: int, count: int) -> list[int]:
    return [base_port + 2 * i for i in range(count)]


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Same option the servers use, so a TIME_WAIT leftover is not "busy".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# Resolved here, not in the child: between fork and exec only a plain C call is safe.
_PRCTL = linux_libc_function("prctl")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Child:
    def __init__(self, name: str, node_id: int, cmd: list[str], log_path: Path) -> None:
        self.name = name
        self.node_id = node_id
        self.cmd = cmd
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._log_file: IO[bytes] | None = None
        # Set by `minibroker dev stop/kill`: its exit is neither reported nor unclean.
        self.stopped_on_request = False
        # This incarnation's exit has been reported (once).
        self.exit_reported = False

    def start(self, env: dict[str, str]) -> None:
        self.close_log()
        self.stopped_on_request = False
        self.exit_reported = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self._log_start = self._log_file.tell()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._log_file.write(f"=== minibroker dev: {self.name} started {stamp} ===\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                data = f.read()
        except OSError:
            return "(no log)"
        text = data.decode(errors="replace").rstrip("\n").splitlines()
        return "\n".join("    " + line for line in text[-lines:]) or "    (empty)"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class DevCluster:
    def __init__(
        self,
        *,
        data_dir: Path,
        brokers: int = 3,
        controllers: int = 1,
        base_port: int = 9092,
        controller_port: int | None = None,
        kafka_base_port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        log_level: str = "INFO",
        secure: bool = False,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
    ) -> None:
        if brokers < 1:
            raise DevClusterError("--brokers must be at least 1")
        if controllers not in (1, 3, 5):
            raise DevClusterError(
                "--controllers must be 1, 3 or 5 (a quorum needs a majority up: an even "
                "number tolerates no more failures than the odd number below it)"
            )
        self.data_dir = data_dir.absolute()
        self.host = host
        self.broker_ports = broker_ports(base_port, brokers)
        first_controller = base_port + 1 if controller_port is None else controller_port
        # Controllers on the odd ports between the brokers': 9093, 9095, 9097.
        self.controller_ports = broker_ports(first_controller, controllers)
        self.controller_port = first_controller
        kafka_base = base_port + KAFKA_PORT_OFFSET if kafka_base_port is None else kafka_base_port
        self.kafka_ports = broker_ports(kafka_base, brokers)
        if set(self.controller_ports) & set(self.broker_ports):
            raise DevClusterError(
                f"--controller-port {first_controller}: the controllers' ports "
                f"({', '.join(map(str, self.controller_ports))}) clashes with a broker port "
                f"({', '.join(map(str, self.broker_ports))})"
            )
        if set(self.kafka_ports) & {*self.controller_ports, *self.broker_ports}:
            raise DevClusterError(
                f"--kafka-base-port {kafka_base}: the Kafka listeners' ports "
                f"({', '.join(map(str, self.kafka_ports))}) clash with the other ports"
            )
        if (
            max([*self.broker_ports, *self.kafka_ports, *self.controller_ports]) > 65535
            or min(base_port, kafka_base) < 1
        ):
            raise DevClusterError("ports must be between 1 and 65535")
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self.out = out
        self.err = err
        python = sys.executable
        logs = self.data_dir / "logs"
        # Paths only: the files are made (or checked) at start, under the data dir's lock.
        self.secure = SecureFiles(self.data_dir / "secure") if secure else None
        self._client_tls: ssl.SSLContext | None = None
        self._client_sasl: SaslCredentials | None = None
        self._admin_password_is_new = False
        self.controllers = self._controller_children(python, logs, log_level)
        self.brokers: list[_Child] = []
        for i, (port, kafka_port) in enumerate(
            zip(self.broker_ports, self.kafka_ports, strict=True)
        ):
            node_id = i + 1
            self.brokers.append(
                _Child(
                    f"broker {node_id}",
                    node_id,
                    [
                        python,
                        "-m",
                        "broker",
                        "--node-id",
                        str(node_id),
                        "--listeners",
                        f"{self._native_listener}://{host}:{port},KAFKA://{host}:{kafka_port}",
                        "--kafka-listeners",
                        "KAFKA",
                        *self._broker_security_flags(node_id),
                        "--controller",
                        self.controller_addresses,
                        "--data-dir",
                        str(self.data_dir / f"broker-{node_id}"),
                        "--log-level",
                        log_level,
                    ],
                    logs / f"broker-{node_id}.log",
                )
            )
        self._stop = asyncio.Event()
        self._kill_now = False
        self._lock_file: IO[str] | None = None
        self._control_server: asyncio.Server | None = None
        # One control operation at a time: a stop and a restart of one node must not mix.
        self._control_lock = asyncio.Lock()
        self._control_slots = asyncio.Semaphore(dev_control.MAX_CONNECTIONS)

    def _controller_children(self, python: str, logs: Path, log_level: str) -> list[_Child]:
        """One controller (node 0, in controller/), or a quorum of them (nodes 0..N-1,
        in controller-<id>/, one cluster id for all: the one they were formatted
        with, or a new one)."""
        if len(self.controller_ports) == 1:
            layout = [(CONTROLLER_ID, "controller", "controller", [])]
        else:
            voters = ",".join(
                f"{i}@{self.host}:{port}" for i, port in enumerate(self.controller_ports)
            )
            cluster = ["--quorum-voters", voters, "--cluster-id", self._cluster_id()]
            layout = [
                (i, f"controller {i}", f"controller-{i}", cluster)
                for i in range(len(self.controller_ports))
            ]
        return [
            _Child(
                name,
                node_id,
                [
                    python,
                    "-m",
                    "controller",
                    "--node-id",
                    str(node_id),
                    "--listen",
                    f"{self.host}:{port}",
                    "--data-dir",
                    str(self.data_dir / directory),
                    "--log-level",
                    log_level,
                    *quorum,
                    *self._controller_security_flags(node_id),
                ],
                logs / f"{directory}.log",
            )
            for (node_id, name, directory, quorum), port in zip(
                layout, self.controller_ports, strict=True
            )
        ]

    # ------------------------------------------------------------ --secure

    @property
    def _native_listener(self) -> str:
        # Named for what it is: a listener named PLAINTEXT that is SASL_SSL would mislead.
        return "PLAINTEXT" if self.secure is None else "NATIVE"

    @property
    def _controller_names(self) -> list[str]:
        return [f"controller-{i}" for i in range(len(self.controller_ports))]

    def _authorizer_flags(self) -> list[str]:
        assert self.secure is not None
        return [
            "--authorizer-enabled",
            "true",
            "--super-users",
            super_users(self._controller_names),
        ]

    def _controller_security_flags(self, node_id: int) -> list[str]:
        if self.secure is None:
            return []
        # A quorum's voters talk by certificate: they must ask for each other's.
        client_auth = ["--ssl-client-auth", "requested"] if len(self.controller_ports) > 1 else []
        return [
            *("--security-protocol", "SASL_SSL"),
            *self.secure.tls_flags(f"controller-{node_id}"),
            *client_auth,
            *("--sasl-bootstrap-username", SERVER_USER),
            *("--sasl-bootstrap-password-file", str(self.secure.server_password_file)),
            *self._authorizer_flags(),
        ]

    def _broker_security_flags(self, node_id: int) -> list[str]:
        if self.secure is None:
            return []
        return [
            *("--listener-security-protocol-map", "NATIVE:SASL_SSL,KAFKA:SASL_SSL"),
            *("--controller-security-protocol", "SASL_SSL"),
            *("--sasl-server-username", SERVER_USER),
            *("--sasl-server-password-file", str(self.secure.server_password_file)),
            *self.secure.tls_flags(f"broker-{node_id}"),
            *self._authorizer_flags(),
        ]

    def _prepare_secure(self) -> None:
        """The certificates and passwords (made or reused), and the credentials this
        process checks the servers with (the servers' user: the admin is made later)."""
        assert self.secure is not None
        hosts = list(dict.fromkeys([self.host, "127.0.0.1", "localhost"]))
        servers = {name: hosts for name in self._controller_names}
        servers |= {f"broker-{b.node_id}": hosts for b in self.brokers}
        try:
            _, self._admin_password_is_new = prepare(self.secure.directory, servers, self._say)
        except SecureSetupError as exc:
            raise DevClusterError(str(exc)) from None
        settings = self.secure.client_settings(SERVER_USER)
        self._client_tls = settings["ssl_context"]
        self._client_sasl = SaslCredentials(
            settings["sasl_mechanism"], SERVER_USER, settings["sasl_plain_password"]
        )

    async def _create_admin(self, deadline: float) -> None:
        assert self.secure is not None
        try:
            did = await ensure_admin(
                self.bootstrap,
                self.secure,
                new_password=self._admin_password_is_new,
                timeout_s=max(1.0, deadline - time.monotonic()),
            )
        except SecureSetupError as exc:
            raise DevClusterError(str(exc)) from None
        self._say(f"{did} (password in {self.secure.admin_password_file}, mode 0600)")

    def _cluster_id(self) -> str:
        """The quorum's cluster id: what its first controller was formatted with, or a
        new one (22 characters of URL-safe base64, Kafka's form)."""
        with contextlib.suppress(OSError):
            for line in (
                (self.data_dir / "controller-0" / "meta.properties").read_text().splitlines()
            ):
                key, _, value = line.partition("=")
                if key.strip() == "cluster.id" and value.strip():
                    return value.strip()
        while True:
            text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
            if not text.startswith("-"):
                return text

    @property
    def controller_addresses(self) -> str:
        """Every controller, as the brokers' --controller."""
        return ",".join(f"{self.host}:{p}" for p in self.controller_ports)

    @property
    def children(self) -> list[_Child]:
        return [*self.controllers, *self.brokers]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{p}" for p in self.broker_ports)

    @property
    def kafka_bootstrap(self) -> str:
        """The Kafka listeners, for a Kafka client's bootstrap.servers."""
        return ",".join(f"{self.host}:{p}" for p in self.kafka_ports)

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The servers must be importable even when this project is not installed.
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    # ------------------------------------------------------------ run

    async def run(self) -> int:
        """Start, wait for a signal or a dead child, stop. Returns the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            busy = [
                p
                for p in [*self.controller_ports, *self.broker_ports, *self.kafka_ports]
                if not port_is_free(self.host, p)
            ]
            if busy:
                raise DevClusterError(
                    f"port {', '.join(map(str, busy))} on {self.host} is already in use "
                    "(another `minibroker dev`, or a Kafka broker?): stop it, or choose "
                    "other ports with --base-port / --controller-port / --kafka-base-port"
                )
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock_data_dir()
            started = time.monotonic()
            if self.secure is not None:
                self._prepare_secure()
            await self._start_all()
            if self.secure is not None and not self._stop.is_set():
                await self._create_admin(started + self.startup_timeout)
            if self._stop.is_set():
                return await self._shutdown(reason="interrupted during startup")
            self._say(
                f"cluster ready in {time.monotonic() - started:.1f} s: "
                f"{'controller' if len(self.controllers) == 1 else 'controllers'} "
                f"{self.controller_addresses}, brokers "
                + ", ".join(
                    f"{b.node_id}={self.host}:{p}"
                    for b, p in zip(self.brokers, self.broker_ports, strict=True)
                )
            )
            self._say(f"data: {self.data_dir}  logs: {self.data_dir / 'logs'}")
            self._say(f"bootstrap: {self.bootstrap}")
            self._say(f"kafka bootstrap: {self.kafka_bootstrap}")
            if self.secure is not None:
                for line in client_settings_lines(
                    self.secure, self.bootstrap, self.kafka_bootstrap
                ):
                    self._say(line)
            await self._start_control_socket()
            self._say("Press Ctrl-C to stop.")
            await self._watch()
            await self._stop_control_socket()
            return await self._shutdown(reason="signal")
        except DevClusterError as exc:
            print(f"error: {exc}", file=self.err, flush=True)
            await self._shutdown(reason="startup failed", quiet=True)
            return 1
        finally:
            await self._stop_control_socket()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for child in self.children:
                child.close_log()
            if self._lock_file is not None:
                self._lock_file.close()  # releases the flock

    def _lock_data_dir(self) -> None:
        path = self.data_dir / "dev.lock"
        self._lock_file = open(path, "a+")  # noqa: SIM115 - held until this process exits
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.seek(0)
            owner = self._lock_file.read().strip() or "?"
            raise DevClusterError(
                f"another `minibroker dev` (pid {owner}) is using {self.data_dir}: stop it, "
                "or pass a different --data-dir"
            ) from None
        self._lock_file.truncate(0)
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def _on_signal(self, sig: int) -> None:
        if self._stop.is_set():
            print("second signal: killing everything now", file=self.err, flush=True)
            self._kill_now = True
            for child in self.children:
                child.signal(signal.SIGKILL)
        self._stop.set()

    async def _start_all(self) -> None:
        env = self._env()
        for controller, port in zip(self.controllers, self.controller_ports, strict=True):
            self._say(
                f"starting controller {controller.node_id} on {self.host}:{port} "
                f"(log: {controller.log_path})"
            )
            controller.start(env)
        deadline = time.monotonic() + self.startup_timeout
        await self._wait_until(
            self._controller_ready,
            deadline,
            self.controllers,
            "the controller to listen"
            if len(self.controllers) == 1
            else "the controllers to elect an active one",
        )
        if self._stop.is_set():
            return
        for broker, port in zip(self.brokers, self.broker_ports, strict=True):
            self._say(
                f"starting broker {broker.node_id} on {self.host}:{port} (log: {broker.log_path})"
            )
            broker.start(env)
        await self._wait_until(
            self._brokers_ready, deadline, self.children, "every broker to register"
        )

    async def _wait_until(
        self,
        check: Callable[[], Awaitable[bool]],
        deadline: float,
        watched: list[_Child],
        what: str,
    ) -> None:
        last_error = ""
        while not self._stop.is_set():
            for child in watched:
                code = child.returncode
                if code is not None:
                    raise DevClusterError(
                        f"{child.name} exited during startup ({describe_exit(code)}); "
                        f"last lines of {child.log_path}:\n{child.tail()}"
                    )
            try:
                if await check():
                    return
            except (MinibrokerError, OSError) as exc:
                last_error = str(exc)
            if time.monotonic() > deadline:
                tails = "\n".join(f"  {c.name} ({c.log_path}):\n{c.tail(8)}" for c in watched)
                raise DevClusterError(
                    f"timed out after {self.startup_timeout:.0f} s waiting for {what}"
                    + (f" (last error: {last_error})" if last_error else "")
                    + f"; recent log lines:\n{tails}"
                )
            await asyncio.sleep(POLL_INTERVAL)

    async def _ask(self, port: int, request: object) -> object:
        conn = BrokerConnection(
            self.host,
            port,
            client_id="minibroker-dev",
            request_timeout_ms=2_000,
            connect_timeout_ms=1_000,
            tls=self._client_tls,
            sasl=self._client_sasl,
        )
        try:
            await conn.connect()
            return await conn.send(request)  # type: ignore[arg-type]
        finally:
            await conn.close()

    async def _controller_ready(self) -> bool:
        """An active controller (a quorum of one has one at once)."""
        active = ActiveController(
            [(self.host, p) for p in self.controller_ports],
            client_id="minibroker-dev",
            tls=self._client_tls,
            sasl=self._client_sasl,
        )
        await active.find()
        return active.leader_id >= 0

    async def _brokers_ready(self) -> bool:
        expected = {b.node_id for b in self.brokers}
        for port in self.broker_ports:
            response = await self._ask(port, MetadataRequest(topics=[]))
            if not isinstance(response, MetadataResponse):
                return False
            if not expected <= {b.node_id for b in response.brokers}:
                return False
        return True

    async def _watch(self) -> None:
        """Until a signal. A server that exits is reported once (which, how, where its
        log is) and the others keep serving: it may be restarted with `minibroker dev
        restart`. A quorum says how many controllers run on."""
        while not self._stop.is_set():
            for child in self.children:
                code = child.returncode
                if code is None or child.exit_reported or child.stopped_on_request:
                    continue
                child.exit_reported = True
                print(
                    f"{child.name} exited ({describe_exit(code)}); {self._who_runs_on(child)} "
                    f"(log: {child.log_path}; `minibroker dev restart {self.node_name(child)}` "
                    "starts it again)",
                    file=self.err,
                    flush=True,
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await self._stop.wait()

    def _who_runs_on(self, dead: _Child) -> str:
        if dead in self.controllers and len(self.controllers) > 1:
            running = sum(c.returncode is None for c in self.controllers)
            return f"{running} of {len(self.controllers)} controllers run on"
        running = sum(b.returncode is None for b in self.brokers)
        return f"the others keep serving ({running} of {len(self.brokers)} brokers up)"

    # ------------------------------------------------------------ control socket

    def node_name(self, child: _Child) -> str:
        """The name `minibroker dev kill/stop/restart` takes (client/dev_control.py)."""
        return f"c{child.node_id}" if child in self.controllers else str(child.node_id)

    def _find_node(self, name: str) -> _Child:
        kind, node_id = dev_control.parse_node(name)
        group = self.controllers if kind == "controller" else self.brokers
        for child in group:
            if child.node_id == node_id:
                return child
        known = ", ".join(self.node_name(c) for c in self.children)
        raise dev_control.DevControlError(f"no node {name!r} in this dev cluster (nodes: {known})")

    async def _start_control_socket(self) -> None:
        path = dev_control.socket_path(self.data_dir)
        if len(str(path).encode()) > dev_control.MAX_SOCKET_PATH_BYTES:
            print(
                f"warning: {path} is too long for a unix socket: no `minibroker dev "
                "status/kill/stop/restart` for this cluster (use a shorter --data-dir)",
                file=self.err,
                flush=True,
            )
            return
        # A leftover of a dev that died: the data dir's lock says none other runs here.
        path.unlink(missing_ok=True)
        self._control_server = await asyncio.start_unix_server(
            self._serve_control, path=str(path), limit=dev_control.MAX_REQUEST_BYTES + 1
        )
        path.chmod(0o600)
        self._say(
            f"control: `minibroker dev status|kill|stop|restart NODE --data-dir {self.data_dir}` "
            f"(nodes: {', '.join(self.node_name(c) for c in self.children)})"
        )

    async def _stop_control_socket(self) -> None:
        if self._control_server is None:
            return
        self._control_server.close()
        self._control_server = None
        dev_control.socket_path(self.data_dir).unlink(missing_ok=True)

    async def _serve_control(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            if self._control_slots.locked():
                writer.write(
                    dev_control.encode_reply(error="too many control connections: try again")
                )
                return
            async with self._control_slots:
                try:
                    async with asyncio.timeout(dev_control.REQUEST_READ_TIMEOUT_S):
                        line = await reader.readline()
                    if len(line) > dev_control.MAX_REQUEST_BYTES:
                        raise dev_control.DevControlError(
                            f"request over {dev_control.MAX_REQUEST_BYTES} bytes"
                        )
                    op, node = dev_control.decode_request(line)
                    lines = await self._control(op, node)
                    writer.write(dev_control.encode_reply(lines=lines))
                except dev_control.DevControlError as exc:
                    writer.write(dev_control.encode_reply(error=str(exc)))
                except TimeoutError:
                    writer.write(
                        dev_control.encode_reply(
                            error="no request line within "
                            f"{dev_control.REQUEST_READ_TIMEOUT_S:.0f} s"
                        )
                    )
                except ValueError:  # readline past the stream's limit
                    writer.write(
                        dev_control.encode_reply(
                            error=f"request over {dev_control.MAX_REQUEST_BYTES} bytes"
                        )
                    )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(dev_control.REQUEST_READ_TIMEOUT_S):
                    await writer.drain()
        except (ConnectionError, OSError):
            pass  # the asking shell went away: nothing to tell it
        finally:
            writer.close()

    async def _control(self, op: str, node: str | None) -> list[str]:
        if op == "status":
            return self._status_lines()
        assert node is not None
        child = self._find_node(node)
        name = self.node_name(child)
        async with self._control_lock:
            if self._stop.is_set():
                raise dev_control.DevControlError("the dev cluster is stopping")
            running = child.returncode is None and child.proc is not None
            if op in ("kill", "stop") and not running:
                raise dev_control.DevControlError(
                    f"{child.name} is not running: `minibroker dev restart {name}` starts it"
                )
            if op == "kill":
                child.stopped_on_request = True
                child.signal(signal.SIGKILL)
                await self._wait_exit(child, self.stop_timeout)
                return self._announce(f"{child.name} killed (SIGKILL) on request")
            if op == "stop" or running:
                child.stopped_on_request = True
                child.signal(signal.SIGTERM)
                if not await self._wait_exit(child, self.stop_timeout):
                    child.signal(signal.SIGKILL)
                    await self._wait_exit(child, 5.0)
                code = child.returncode
                said = f"{child.name} stopped on request ({describe_exit(code or 0)})"
                if op == "stop":
                    return self._announce(said)
            child.start(self._env())
            try:
                await self._wait_until(
                    (lambda: self._listening(child))
                    if child in self.controllers
                    else (lambda: self._broker_registered(child)),
                    time.monotonic() + self.startup_timeout,
                    [child],
                    f"{child.name} to come back",
                )
            except DevClusterError as exc:
                child.exit_reported = True  # said here, not again by the watcher
                raise dev_control.DevControlError(str(exc).splitlines()[0]) from None
            assert child.proc is not None
            return self._announce(f"{child.name} restarted (pid {child.proc.pid})")

    def _announce(self, line: str) -> list[str]:
        """Said in the dev cluster's shell and returned to the asking one."""
        self._say(line)
        return [line]

    async def _wait_exit(self, child: _Child, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while child.returncode is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_INTERVAL)
        return True

    async def _listening(self, controller: _Child) -> bool:
        port = self.controller_ports[self.controllers.index(controller)]
        _, writer = await asyncio.open_connection(self.host, port)
        writer.close()
        return True

    async def _broker_registered(self, broker: _Child) -> bool:
        port = self.broker_ports[self.brokers.index(broker)]
        response = await self._ask(port, MetadataRequest(topics=[]))
        return isinstance(response, MetadataResponse) and broker.node_id in {
            b.node_id for b in response.brokers
        }

    def _status_lines(self) -> list[str]:
        lines = [f"{'NODE':<6} {'ROLE':<11} {'ADDRESS':<22} STATE"]
        ports = [*self.controller_ports, *self.broker_ports]
        for child, port in zip(self.children, ports, strict=True):
            code = child.returncode
            if child.proc is None:
                state = "not started"
            elif code is None:
                state = f"running (pid {child.proc.pid})"
            else:
                how = "stopped on request" if child.stopped_on_request else "dead"
                state = f"{how} ({describe_exit(code)})"
            role = "controller" if child in self.controllers else "broker"
            address = f"{self.host}:{port}"
            lines.append(f"{self.node_name(child):<6} {role:<11} {address:<22} {state}")
        return lines

    # ------------------------------------------------------------ stop

    async def _shutdown(self, *, reason: str, quiet: bool = False) -> int:
        """Brokers first (SIGTERM, bounded wait, SIGKILL), then the controller.
        Returns 0 when every child exited cleanly (code 0)."""
        running = [c for c in self.children if c.proc is not None]
        if not running:
            return 0
        # Those already dead were reported by the watcher; they make it unclean unless
        # stopped or killed on request (`minibroker dev stop/kill`).
        dead_before = {c.name for c in running if c.returncode is not None}
        clean = all(c.stopped_on_request for c in running if c.returncode is not None)
        if not quiet:
            self._say(f"stopping ({reason}): brokers first, then the controller")
        for group in (self.brokers, self.controllers):
            procs = [c for c in group if c.proc is not None]
            for child in procs:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            while any(c.returncode is None for c in procs):
                if time.monotonic() > deadline or self._kill_now:
                    for child in procs:
                        if child.returncode is None:
                            print(
                                f"{child.name} did not stop within {self.stop_timeout:.0f} s: "
                                f"killing it (log: {child.log_path})",
                                file=self.err,
                                flush=True,
                            )
                            child.signal(signal.SIGKILL)
                    clean = False
                    for child in procs:
                        assert child.proc is not None
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            await asyncio.to_thread(child.proc.wait, 5)
                    break
                await asyncio.sleep(POLL_INTERVAL)
            for child in procs:
                code = child.returncode
                if code not in (0, None) and not (
                    child.name in dead_before and child.stopped_on_request
                ):
                    clean = False
                    if not quiet and child.name not in dead_before:
                        print(
                            f"{child.name} exited with {describe_exit(code)}; "
                            f"last lines of {child.log_path}:\n{child.tail(10)}",
                            file=self.err,
                            flush=True,
                        )
        if not quiet:
            self._say("stopped" if clean else "stopped, not cleanly (see above)")
        return 0 if clean else 1
