"""`python -m controller` as a real process on 127.0.0.1, talked to over real sockets
with protocol.connection.ClientConnection: restart after kill -9, bad input, session
timeouts, and the one-line startup errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from protocol.connection import ClientConnection
from protocol.connection import Response
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.framing import encode_request_header
from protocol.framing import frame
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerHeartbeatResponse
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import FetchMetadataRequest
from protocol.messages import FetchMetadataResponse
from protocol.messages import Listener
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControllerProc:
    """One `python -m controller` subprocess; its log goes to a file."""

    def __init__(self, data_dir: Path, port: int, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra = extra
        self.log_path = data_dir.parent / f"controller-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("MINIBROKER_ENABLE_TEST_FAULTS", None)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "controller", *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()

    def log_text(self) -> str:
        return self.log_path.read_bytes()[self._log_start :].decode(errors="replace")

    async def start(self) -> None:
        self.proc = self.spawn(
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(self.data_dir),
            *self.extra,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        needle = f"controller 0 listening on 127.0.0.1:{self.port}"
        while needle not in self.log_text():
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited {self.proc.returncode}: {self.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"controller did not start: {self.log_text()}")
            await asyncio.sleep(0.05)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Client:
    """A small asyncio client around ClientConnection, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = ClientConnection("itest")

    @classmethod
    async def connect(cls, port: int) -> Client:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), REQUEST_TIMEOUT_S
        )
        return cls(reader, writer)

    async def call(self, body: Message, *, api_version: int | None = None) -> Response:
        cid, data = self.conn.send_request(body, api_version=api_version)
        self.writer.write(data)

        async def read() -> Response:
            while True:
                chunk = await self.reader.read(65536)
                if not chunk:
                    raise ConnectionError("controller closed the connection")
                for response in self.conn.receive_data(chunk):
                    assert response.correlation_id == cid
                    return response

        return await asyncio.wait_for(read(), REQUEST_TIMEOUT_S)

    async def ok(self, body: Message) -> Message:
        response = await self.call(body)
        assert response.error_code == ErrorCode.NONE, response
        assert response.body is not None
        return response.body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), REQUEST_TIMEOUT_S)


@pytest.fixture
def procs():
    started: list[ControllerProc] = []
    yield started
    for p in started:
        p.cleanup()


async def started(procs: list[ControllerProc], data_dir: Path, *extra: str) -> ControllerProc:
    """A controller on a free port, started and stopped with the test's `procs`."""
    ctl = ControllerProc(data_dir, free_port(), *extra)
    procs.append(ctl)
    await ctl.start()
    return ctl


async def started_with_client(
    procs: list[ControllerProc], data_dir: Path, *extra: str
) -> tuple[ControllerProc, Client]:
    """`started`, and a client connected to it."""
    ctl = await started(procs, data_dir, *extra)
    return ctl, await Client.connect(ctl.port)


async def register(client: Client, broker_id: int, incarnation: str) -> int:
    body = await client.ok(
        BrokerRegistrationRequest(
            broker_id=broker_id,
            incarnation_id=incarnation,
            listeners=[Listener(name="PLAINTEXT", host="127.0.0.1", port=19000 + broker_id)],
        )
    )
    assert isinstance(body, BrokerRegistrationResponse) and body.error_code == 0, body
    return body.broker_epoch


async def unfence(client: Client, broker_id: int, epoch: int) -> None:
    fetched = await client.ok(
        FetchMetadataRequest(broker_id=broker_id, broker_epoch=epoch, from_offset=0)
    )
    assert isinstance(fetched, FetchMetadataResponse)
    beat = await client.ok(
        BrokerHeartbeatRequest(
            broker_id=broker_id,
            broker_epoch=epoch,
            current_metadata_offset=fetched.next_offset - 1,
        )
    )
    assert isinstance(beat, BrokerHeartbeatResponse)
    assert beat.error_code == 0 and not beat.is_fenced, beat


async def topic_state(client: Client) -> dict[tuple[str, int], tuple[int, int, list[int]]]:
    md = await client.ok(MetadataRequest())
    assert isinstance(md, MetadataResponse)
    return {
        (t.name, p.partition_index): (p.leader_id, p.leader_epoch, p.isr_nodes)
        for t in md.topics
        for p in t.partitions
    }


async def test_restart_after_kill9_keeps_state_and_never_reuses_epochs(
    tmp_path: Path, procs: list[ControllerProc]
) -> None:
    ctl, client = await started_with_client(
        procs, tmp_path / "data", "--session-timeout-ms", "30000"
    )
    inc1, inc2 = uuid.uuid4().hex, uuid.uuid4().hex
    e1 = await register(client, 1, inc1)
    e2 = await register(client, 2, inc2)
    assert e2 > e1
    assert await register(client, 1, inc1) == e1  # retry of the same incarnation
    await unfence(client, 1, e1)
    await unfence(client, 2, e2)
    created = await client.ok(
        CreateTopicsRequest(
            topics=[CreatableTopic(name="events", num_partitions=4, replication_factor=2)]
        )
    )
    assert isinstance(created, CreateTopicsResponse)
    assert created.topics[0].error_code == 0, created
    before = await topic_state(client)
    assert len(before) == 4 and all(leader in (1, 2) for leader, _, _ in before.values())
    desc = await client.ok(DescribeClusterRequest())
    assert isinstance(desc, DescribeClusterResponse)
    offset_before = desc.metadata_offset
    await client.close()

    ctl.kill9()
    await ctl.start()
    client = await Client.connect(ctl.port)
    desc2 = await client.ok(DescribeClusterRequest())
    assert isinstance(desc2, DescribeClusterResponse)
    assert desc2.cluster_id == desc.cluster_id
    # Nothing lost, nothing added but the restarted controller's LeaderChangeRecord:
    # it leads a new quorum epoch (issue 17).
    assert desc2.metadata_offset == offset_before + 1
    assert [(b.broker_id, b.broker_epoch, b.is_fenced) for b in desc2.brokers] == [
        (1, e1, False),
        (2, e2, False),
    ]
    assert await topic_state(client) == before
    # The old incarnation's heartbeat is still valid after the controller restart ...
    beat = await client.ok(
        BrokerHeartbeatRequest(broker_id=2, broker_epoch=e2, current_metadata_offset=offset_before)
    )
    assert isinstance(beat, BrokerHeartbeatResponse) and not beat.is_fenced
    # ... and broker 1 restarting gets an epoch larger than anything before.
    e1b = await register(client, 1, uuid.uuid4().hex)
    assert e1b > max(e1, e2, offset_before)
    after = await topic_state(client)
    for tp, (leader, epoch, _isr) in before.items():
        new_leader, new_epoch, new_isr = after[tp]
        assert 1 not in new_isr
        if leader == 1:  # its leaderships moved: a new, never used, leader epoch
            assert (new_leader, new_epoch) == (2, epoch + 1)
        else:
            assert (new_leader, new_epoch) == (leader, epoch)
    await unfence(client, 1, e1b)
    await client.close()

    # Once more, with a clean SIGTERM this time: exit code 0, state intact.
    assert ctl.terminate() == 0
    assert "controller 0 stopped" in ctl.log_text()
    await ctl.start()
    client = await Client.connect(ctl.port)
    desc3 = await client.ok(DescribeClusterRequest())
    assert isinstance(desc3, DescribeClusterResponse)
    assert [(b.broker_id, b.broker_epoch) for b in desc3.brokers] == [(1, e1b), (2, e2)]
    assert await topic_state(client) == after
    e2b = await register(client, 2, uuid.uuid4().hex)
    assert e2b > e1b
    final = await topic_state(client)
    used = {tp: {before[tp][1], after[tp][1]} for tp in before}
    for tp, (_, epoch, _) in final.items():
        assert epoch >= max(used[tp])
    await client.close()
    assert ctl.terminate() == 0


async def test_bad_input_does_not_disturb_other_clients(
    tmp_path: Path, procs: list[ControllerProc]
) -> None:
    ctl = await started(procs, tmp_path / "data")
    port = ctl.port
    good = await Client.connect(port)

    async def still_served() -> None:
        body = await good.ok(ApiVersionsRequest())
        assert isinstance(body, ApiVersionsResponse) and body.api_keys

    async def closed_by_server(payload: bytes) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), REQUEST_TIMEOUT_S
        )
        writer.write(payload)
        # EOF after the garbage: random bytes may announce a frame longer than what
        # was sent; the server must then close on EOF rather than wait forever.
        writer.write_eof()
        try:
            while await asyncio.wait_for(reader.read(65536), REQUEST_TIMEOUT_S):
                pass  # the server may answer what it could parse; then it closes
        except ConnectionError:
            pass
        writer.close()

    await still_served()
    await closed_by_server(os.urandom(4096))
    await still_served()
    # A frame claiming 2 GiB (negative as an int32), and 2 GiB - 1 (over the limit).
    await closed_by_server(struct.pack(">I", 2**31) + b"x" * 64)
    await closed_by_server(struct.pack(">i", 2**31 - 1) + b"x" * 64)
    await still_served()
    # A header too short to be a request.
    await closed_by_server(frame(b"\x00\x01"))
    await still_served()

    # Unknown API key and unsupported version: an error response, connection kept.
    other = await Client.connect(port)
    unknown = frame(encode_request_header(RequestHeader(999, 0, 77, "x")) + b"\x80")
    other.writer.write(unknown)
    raw = await asyncio.wait_for(other.reader.readexactly(10), REQUEST_TIMEOUT_S)
    length, correlation_id, error = struct.unpack(">iih", raw)
    assert correlation_id == 77 and error == ErrorCode.INVALID_REQUEST
    await asyncio.wait_for(other.reader.readexactly(length - 6), REQUEST_TIMEOUT_S)
    unsupported = await other.call(ApiVersionsRequest(), api_version=42)
    assert unsupported.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert "ApiVersions" in unsupported.error_message or "API_VERSIONS" in unsupported.error_message
    # A broker-only API is not served by the controller.
    from protocol.messages import ListOffsetsRequest

    not_served = await other.call(ListOffsetsRequest(topics=[]))
    assert not_served.error_code == ErrorCode.INVALID_REQUEST
    body = await other.ok(ApiVersionsRequest())
    assert isinstance(body, ApiVersionsResponse)
    await other.close()
    await still_served()
    await good.close()
    assert ctl.proc is not None and ctl.proc.poll() is None
    log = ctl.log_text()
    assert "malformed request" in log
    assert ctl.terminate() == 0


async def test_silent_broker_is_fenced_after_session_timeout(
    tmp_path: Path, procs: list[ControllerProc]
) -> None:
    ctl, client = await started_with_client(procs, tmp_path / "data", "--session-timeout-ms", "500")
    epoch = await register(client, 1, uuid.uuid4().hex)
    await unfence(client, 1, epoch)
    deadline = time.monotonic() + 10
    while True:
        desc = await client.ok(DescribeClusterRequest())
        assert isinstance(desc, DescribeClusterResponse)
        if desc.brokers[0].is_fenced:
            break
        assert time.monotonic() < deadline, "broker never fenced"
        await asyncio.sleep(0.1)
    assert "fenced broker 1 epoch" in ctl.log_text()
    # A heartbeat with the same epoch brings it back.
    await unfence(client, 1, epoch)
    await client.close()
    assert ctl.terminate() == 0


async def test_startup_errors_are_one_clear_line(
    tmp_path: Path, procs: list[ControllerProc]
) -> None:
    ctl = ControllerProc(tmp_path / "data", free_port())

    def run(*args: str) -> tuple[int, str]:
        proc = ctl.spawn(*args)
        code = proc.wait(timeout=30)
        return code, ctl.log_text()

    code, out = run("--listen", "nowhere")
    assert code == 2 and "--listen" in out and "HOST:PORT" in out

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code, out = run("--data-dir", str(a_file / "sub"), "--listen", "127.0.0.1:0")
    assert code == 1 and "data dir" in out and out.count("Error") == 1

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        busy_port = busy.getsockname()[1]
        code, out = run("--data-dir", str(tmp_path / "d1"), "--listen", f"127.0.0.1:{busy_port}")
    assert code == 1 and "cannot listen" in out and "address already in use" in out.lower()

    # A metadata log damaged in the middle: refuse to start, say where and what to do.
    port = free_port()
    good = ControllerProc(tmp_path / "d2", port)
    procs.append(good)
    await good.start()
    client = await Client.connect(port)
    for b in (1, 2, 3):
        await register(client, b, uuid.uuid4().hex)
    await client.close()
    assert good.terminate() == 0
    log_file = tmp_path / "d2" / f"metadata-{0:020d}.log"
    data = bytearray(log_file.read_bytes())
    data[12] ^= 0xFF  # inside the first entry's payload
    log_file.write_bytes(bytes(data))
    code, out = run("--data-dir", str(tmp_path / "d2"), "--listen", "127.0.0.1:0")
    assert code == 1 and "corrupt" in out and "restore" in out
    assert [line for line in out.splitlines() if line.startswith("Error")] == [
        out.strip().splitlines()[-1]
    ]


async def test_a_controller_stopping_with_connections_open_logs_no_traceback(
    tmp_path: Path, procs: list[ControllerProc]
) -> None:
    """SIGTERM with clients connected (one idle, one that spoke) is a clean stop: exit
    code 0 and no traceback (Python 3.11's stream callback logged one per connection
    whose task was cancelled)."""
    ctl = await started(procs, tmp_path / "data")
    idle = socket.create_connection(("127.0.0.1", ctl.port))
    client = await Client.connect(ctl.port)
    await register(client, 1, uuid.uuid4().hex)
    try:
        assert ctl.terminate() == 0
    finally:
        idle.close()
        await client.close()
    out = ctl.log_text()
    assert "Traceback" not in out and "Exception in callback" not in out, out[-3000:]
