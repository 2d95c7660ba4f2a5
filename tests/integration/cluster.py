"""Start real controller and broker processes for integration tests, the way a user
does (`python -m controller`, `python -m broker` with flags), on 127.0.0.1 in a temp
directory, and talk to them over real sockets.

- every process writes its log to `<tmp>/<name>.log` (appended across restarts);
- readiness is a log line (`controller N listening on H:P`, `broker N started ...`),
  polled with a bounded timeout; a process that exits early fails the wait with the
  tail of its log;
- `Cluster.stop_all()` (call it in a `finally`, the `cluster` fixtures do) terminates
  everything and SIGKILLs what does not exit in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import signal
import socket
import ssl as ssl_module
import subprocess
import sys
import time
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from protocol.api import CONSUMER_REPLICA_ID
from protocol.api import DEBUGGING_REPLICA_ID
from protocol.connection import ClientConnection
from protocol.connection import Response
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import Message
from protocol.record_batch import iter_records

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

_CONTROLLER_READY = re.compile(r"controller (\d+) listening on ([\w.:-]+):(\d+)")
_BROKER_READY = re.compile(r"broker (\d+) started: listeners \w+://([\w.-]+):(\d+)(.*)")
_KAFKA_LISTENER = re.compile(r"KAFKA://([\w.-]+):(\d+)")


# The CLI as a user runs it (`minibroker` is `python -m client.cli`), without the
# caller's MINIBROKER_* defaults for where the cluster is.
CLI = [sys.executable, "-m", "client.cli"]
CLI_ENV = {
    **{
        k: v
        for k, v in os.environ.items()
        if k not in ("MINIBROKER_BOOTSTRAP_SERVERS", "MINIBROKER_CONTROLLER")
    },
    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    "PYTHONUNBUFFERED": "1",
}
CLI_TIMEOUT_S = 60.0


def run_command(
    args: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`args` run to its end from the repository (bounded by `timeout`), its output
    captured as text; a failure is the caller's to read from the return code."""
    return subprocess.run(
        args, input=stdin, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def mb(
    *args: str, stdin: str | None = None, timeout: float = CLI_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """One CLI command to its end: its exit code, stdout and stderr."""
    return run_command([*CLI, *args], timeout=timeout, env=CLI_ENV, stdin=stdin)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_logged(
    args: list[str], log_path: Path, env: dict[str, str], **popen: Any
) -> subprocess.Popen[bytes]:
    """A server process started from the repository, its output appended to `log_path`."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=env,
            **popen,
        )


def stop_in_order(groups: list[list[subprocess.Popen[bytes] | None]], timeout_s: float) -> None:
    """Stop server processes group after group (brokers before the controller: their
    controlled shutdown needs it): SIGCONT first, so a process a test stopped (SIGSTOP)
    can act on the SIGTERM that follows; whatever has not exited within `timeout_s` of
    its group's SIGTERM is killed."""
    for group in groups:
        running = [p for p in group if p is not None and p.poll() is None]
        for popen in running:
            popen.send_signal(signal.SIGCONT)
            popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for popen in running:
            try:
                popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(STOP_TIMEOUT_S)


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> list[str]:
    """What process `pid` has open: the targets of /proc/<pid>/fd (sockets as
    `socket:[inode]`), for a count and, when a count is off, a diff."""
    out = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed while we list
            out.append(os.readlink(entry))
    return out


def open_file_budget(wanted: int) -> int:
    """Raise this process's descriptor limit toward `wanted` + room (children inherit
    it); return how many connections a test may open (fewer when the hard limit is
    lower, at least 60)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted + 300
    if soft < target:
        new_soft = target if hard == resource.RLIM_INFINITY else min(hard, target)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        soft = new_soft
    return max(60, min(wanted, soft - 300))


def count_lines(text: str, needle: str) -> int:
    return sum(1 for line in text.splitlines() if needle in line)


@dataclass
class Process:
    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    _log_start: int = 0

    def start(self) -> None:
        assert self.popen is None or self.popen.poll() is not None, f"{self.name} is running"
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.popen = spawn_logged(
            self.args, self.log_path, {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        )

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def log_text(self, *, since_start: bool = True) -> str:
        if not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[self._log_start if since_start else 0 :].decode(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for(
        self, pattern: re.Pattern[str] | str, timeout: float = START_TIMEOUT_S
    ) -> re.Match[str]:
        """Poll this run's log until `pattern` appears."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.log_text())
            if match:
                return match
            if not self.alive:
                raise AssertionError(
                    f"{self.name} exited with {self.popen.returncode if self.popen else None} "
                    f"before logging {regex.pattern!r}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} did not log {regex.pattern!r} within {timeout}s:\n{self.tail()}"
                )
            time.sleep(0.05)

    def wait_exit(self, timeout: float = STOP_TIMEOUT_S) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. The exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.returncode

    def kill(self) -> None:
        """kill -9."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(STOP_TIMEOUT_S)


@dataclass
class ControllerProcess(Process):
    host: str = "127.0.0.1"
    port: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class BrokerProcess(Process):
    node_id: int = 0
    data_dir: Path = Path()
    host: str = "127.0.0.1"
    port: int = 0
    kafka_port: int | None = None  # its Kafka listener (--kafka-listeners KAFKA), if any

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def kafka_address(self) -> str:
        assert self.kafka_port is not None, "started without a Kafka listener"
        return f"{self.host}:{self.kafka_port}"


class Cluster:
    """One controller and any number of brokers under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.controller: ControllerProcess | None = None
        self.brokers: dict[int, BrokerProcess] = {}
        # Brokers' --controller when it is not `controller`: a quorum (start_quorum),
        # or controllers a test started itself. HOST:PORT,...
        self.controller_bootstrap: str | None = None
        self.quorum: dict[int, ControllerProcess] = {}  # node id -> voter (start_quorum)
        self._quorum_args: list[str] = []

    def start_controller(self, *extra: str, session_timeout_ms: int = 3000) -> ControllerProcess:
        port = self.controller.port if self.controller is not None else 0
        proc = ControllerProcess(
            name="controller",
            args=[
                sys.executable,
                "-m",
                "controller",
                "--listen",
                f"127.0.0.1:{port}",
                "--data-dir",
                str(self.root / "controller"),
                "--session-timeout-ms",
                str(session_timeout_ms),
                *extra,
            ],
            log_path=self.root / "controller.log",
        )
        proc.start()
        self.controller = proc
        match = proc.wait_for(_CONTROLLER_READY)
        proc.host, proc.port = match[2], int(match[3])
        return proc

    def start_quorum(self, voters: int = 3, *extra: str, session_timeout_ms: int = 3000) -> None:
        """A controller quorum of `voters` (node ids 0..N-1, in controller-<id>/); the
        brokers started afterwards are given every voter's address."""
        ports = {n: free_port() for n in range(voters)}
        self._quorum_args = [
            "--quorum-voters",
            ",".join(f"{n}@127.0.0.1:{p}" for n, p in ports.items()),
            "--cluster-id",
            "test-quorum",
            "--session-timeout-ms",
            str(session_timeout_ms),
            *extra,
        ]
        for n, port in ports.items():
            self.quorum[n] = ControllerProcess(
                name=f"controller-{n}", args=[], log_path=self.root / f"controller-{n}.log"
            )
            self.quorum[n].port = port
        for n in ports:
            self.start_voter(n, wait=False)
        for proc in self.quorum.values():
            proc.wait_for(_CONTROLLER_READY)
        self.controller_bootstrap = ",".join(p.address for p in self.quorum.values())

    def start_voter(self, node_id: int, *, wait: bool = True) -> ControllerProcess:
        """(Re)start voter `node_id` of the quorum on its port and data dir."""
        old = self.quorum[node_id]
        proc = ControllerProcess(
            name=old.name,
            args=[
                sys.executable,
                "-m",
                "controller",
                "--node-id",
                str(node_id),
                "--listen",
                old.address,
                "--data-dir",
                str(self.root / f"controller-{node_id}"),
                *self._quorum_args,
            ],
            log_path=old.log_path,
        )
        proc.port = old.port
        proc.start()
        self.quorum[node_id] = proc
        if wait:
            proc.wait_for(_CONTROLLER_READY)
        return proc

    def broker_args(
        self, node_id: int, port: int, *extra: str, kafka_port: int | None = None
    ) -> list[str]:
        """A broker's command line; with `kafka_port`, a Kafka listener KAFKA too."""
        controllers = self.controller_bootstrap
        if controllers is None:
            assert self.controller is not None, "start the controller first"
            controllers = self.controller.address
        kafka = [] if kafka_port is None else [f"KAFKA://127.0.0.1:{kafka_port}"]
        return [
            sys.executable,
            "-m",
            "broker",
            "--node-id",
            str(node_id),
            "--listeners",
            ",".join([f"PLAINTEXT://127.0.0.1:{port}", *kafka]),
            *(["--kafka-listeners", "KAFKA"] if kafka else []),
            "--controller",
            controllers,
            "--data-dir",
            str(self.root / f"broker-{node_id}"),
            "--heartbeat-interval-ms",
            "200",
            "--controller-connect-timeout-ms",
            "20000",
            *extra,
        ]

    def start_broker(
        self,
        node_id: int,
        *extra: str,
        wait: bool = True,
        kafka: bool | None = None,
        launcher: tuple[str, ...] = (),
    ) -> BrokerProcess:
        """Start (or restart, on the same ports and data dir) broker `node_id`; with
        `kafka`, it has a Kafka listener as well (`kafka_address`); None: as before.
        `launcher` runs the command (e.g. `prlimit --nofile=512 --`)."""
        old = self.brokers.get(node_id)
        port = old.port if old is not None else 0
        old_kafka = old.kafka_port if old is not None else None
        if kafka is None:
            kafka = old_kafka is not None
        kafka_port = (old_kafka or 0) if kafka else None
        proc = BrokerProcess(
            name=f"broker-{node_id}",
            args=[*launcher, *self.broker_args(node_id, port, *extra, kafka_port=kafka_port)],
            log_path=self.root / f"broker-{node_id}.log",
            node_id=node_id,
            data_dir=self.root / f"broker-{node_id}",
            port=port,
            kafka_port=kafka_port,
        )
        proc.start()
        self.brokers[node_id] = proc
        if wait:
            self.wait_ready(proc)
        return proc

    def start_brokers(
        self,
        node_ids: Iterable[int],
        *extra: str,
        kafka: bool | None = None,
        launcher: tuple[str, ...] = (),
        flags_of: Mapping[int, Sequence[str]] | None = None,
    ) -> dict[int, BrokerProcess]:
        """`start_broker` for each of `node_ids` with the same flags (and each node's
        own `flags_of[n]` before them), all started before any is waited for: a broker's
        start-up is ~0.4 s, mostly imports, and three of them overlap on two cores."""
        own = flags_of or {}
        procs = {
            n: self.start_broker(
                n, *own.get(n, ()), *extra, wait=False, kafka=kafka, launcher=launcher
            )
            for n in node_ids
        }
        for proc in procs.values():
            self.wait_ready(proc)
        return procs

    @staticmethod
    def wait_ready(proc: BrokerProcess, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for a started broker's ready line and take its bound ports from it."""
        match = proc.wait_for(_BROKER_READY, timeout)
        proc.host, proc.port = match[2], int(match[3])
        kafka_listener = _KAFKA_LISTENER.search(match[4])
        if kafka_listener is not None:
            proc.kafka_port = int(kafka_listener[2])

    def kafka_bootstrap(self) -> str:
        """The brokers' Kafka listeners, as a Kafka client's bootstrap_servers."""
        return ",".join(b.kafka_address for b in self.brokers.values())

    def stop_all(self) -> None:
        """Brokers first (their controlled shutdown needs the controller), then the
        controller; whatever does not exit in time is killed. A process a test stopped
        (SIGSTOP) is continued first: a stopped process cannot handle SIGTERM."""
        groups = [[p.popen for p in self.brokers.values()]]
        if self.controller is not None:
            groups.append([self.controller.popen])
        if self.quorum:
            groups.append([p.popen for p in self.quorum.values()])
        stop_in_order(groups, STOP_TIMEOUT_S)


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[Cluster]:
    """A Cluster under `root` whose processes are all stopped on the way out."""
    c = Cluster(root)
    try:
        yield c
    finally:
        c.stop_all()


class TestClient:
    """A raw protocol client: one connection, pipelining allowed."""

    __test__ = False  # not a pytest test class

    def __init__(self, host: str, port: int, *, ssl: ssl_module.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl  # TLS with this context (a listener's SSL)
        self.conn = ClientConnection("integration-test")
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._ready: dict[int, Response] = {}

    async def __aenter__(self) -> TestClient:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl), 5
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()

    def send(self, body: Message, *, api_version: int | None = None) -> int:
        assert self.writer is not None
        correlation_id, data = self.conn.send_request(body, api_version=api_version)
        self.writer.write(data)
        return correlation_id

    async def receive(self, correlation_id: int, timeout: float = 10.0) -> Response:
        assert self.reader is not None
        deadline = time.monotonic() + timeout
        while correlation_id not in self._ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no response to correlation id {correlation_id}")
            data = await asyncio.wait_for(self.reader.read(1 << 20), remaining)
            if not data:
                raise ConnectionError("the broker closed the connection")
            for response in self.conn.receive_data(data):
                self._ready[response.correlation_id] = response
        return self._ready.pop(correlation_id)

    async def request(
        self, body: Message, *, api_version: int | None = None, timeout: float = 10.0
    ) -> Response:
        return await self.receive(self.send(body, api_version=api_version), timeout)

    async def call(self, body: Message, *, timeout: float = 10.0) -> Message:
        """A request that must succeed at the header level; returns the body."""
        response = await self.request(body, timeout=timeout)
        assert response.error_code == ErrorCode.NONE, (
            f"{type(body).__name__}: {response.error_code.name} {response.error_message}"
        )
        assert response.body is not None
        return response.body

    async def read_partition(
        self, topic: str, *, replica: bool, partition: int = 0
    ) -> list[tuple[int, bytes]]:
        """(offset, value) of every record of the partition from offset 0: as a debugging
        replica when `replica` (so past the high watermark), else as a consumer (below
        it). Reads until a Fetch returns nothing."""
        out: list[tuple[int, bytes]] = []
        offset = 0
        while True:
            resp = await self.call(
                FetchRequest(
                    replica_id=DEBUGGING_REPLICA_ID if replica else CONSUMER_REPLICA_ID,
                    max_wait_ms=0,
                    topics=[
                        FetchTopic(
                            topic=topic,
                            partitions=[FetchPartition(partition=partition, fetch_offset=offset)],
                        )
                    ],
                )
            )
            assert isinstance(resp, FetchResponse)
            part = resp.responses[0].partitions[0]
            assert part.error_code == 0, ErrorCode(part.error_code).name
            records = list(iter_records(part.records, min_offset=offset))
            if not records:
                return out
            for _, record in records:
                assert record.value is not None
                out.append((record.offset, record.value))
                offset = record.offset + 1
