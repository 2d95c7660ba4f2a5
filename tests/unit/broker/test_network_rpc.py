"""The server glue (network.py) and the outgoing connection (runtime/peer_rpc.py) over
real sockets."""

from __future__ import annotations

import asyncio
import struct

import pytest

from protocol.api import ApiKey
from protocol.connection import ClientConnection
from protocol.connection_limits import ConnectionLimits
from protocol.connection_limits import ConnectionTable
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.framing import encode_request_header
from protocol.framing import frame
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import DescribeClusterRequest
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcConnectionError
from runtime.peer_rpc import RpcErrorResponse
from runtime.peer_rpc import RpcTimeoutError
from runtime.server import ListenerServer
from runtime.server import RequestContext


class App:
    """Handlers: Metadata answers after a delay given in the topic name (to test
    ordering), ApiVersions echoes the listener, DescribeCluster crashes."""

    def __init__(self) -> None:
        self.calls = 0

    async def metadata(self, ctx: RequestContext, req: Message) -> Message:
        assert isinstance(req, MetadataRequest)
        self.calls += 1
        delay = float(req.topics[0]) if req.topics else 0.0
        await asyncio.sleep(delay)
        return MetadataResponse(controller_id=int(delay * 1000), cluster_id=ctx.listener)

    async def api_versions(self, ctx: RequestContext, req: Message) -> Message:
        return ApiVersionsResponse(error_code=0)

    async def crash(self, ctx: RequestContext, req: Message) -> Message:
        raise RuntimeError("boom")

    def table(self) -> dict[int, object]:
        return {
            int(ApiKey.METADATA): self.metadata,
            int(ApiKey.API_VERSIONS): self.api_versions,
            int(ApiKey.DESCRIBE_CLUSTER): self.crash,
        }


@pytest.fixture
async def server():
    app = App()
    srv = ListenerServer(
        "EXTERNAL",
        "127.0.0.1",
        0,
        app.table(),  # type: ignore[arg-type]
        table=ConnectionTable(ConnectionLimits(max_in_flight=4, max_frame_bytes=1 << 20)),
    )
    await srv.bind()
    await srv.start_serving()
    yield srv, app
    await srv.close()


async def _raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _read_frames(reader: asyncio.StreamReader, conn: ClientConnection, n: int):
    out = []
    while len(out) < n:
        data = await asyncio.wait_for(reader.read(65536), 5)
        if not data:
            break
        out.extend(conn.receive_data(data))
    return out


async def test_pipelined_responses_come_in_request_order(server) -> None:
    srv, _ = server
    client = RpcClient("127.0.0.1", srv.port, name="test", client_id="t")
    delays = ["0.05", "0", "0.02", "0", "0.01", "0", "0"]  # more than max_in_flight
    results = await asyncio.gather(*(client.request(MetadataRequest(topics=[d])) for d in delays))
    assert [r.controller_id for r in results] == [int(float(d) * 1000) for d in delays]
    assert all(r.cluster_id == "EXTERNAL" for r in results)  # the handler knows its listener
    await client.close()


async def test_handler_crash_answers_unknown_server_error(server) -> None:
    srv, _ = server
    client = RpcClient("127.0.0.1", srv.port, name="test", client_id="t")
    with pytest.raises(RpcErrorResponse) as info:
        await client.request(DescribeClusterRequest())
    assert info.value.error == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "boom" in info.value.message
    # The connection still works.
    assert isinstance(await client.request(ApiVersionsRequest()), ApiVersionsResponse)
    await client.close()


async def test_unknown_api_and_version_get_error_responses(server) -> None:
    srv, _ = server
    reader, writer = await _raw(srv.port)
    body = b"\x80"  # empty msgpack map
    writer.write(frame(encode_request_header(RequestHeader(4242, 0, 7, "x")) + body))
    writer.write(
        frame(encode_request_header(RequestHeader(int(ApiKey.METADATA), 99, 8, "x")) + body)
    )
    # A served-by-spec but not-by-this-server API (Produce is not in the table).
    writer.write(frame(encode_request_header(RequestHeader(int(ApiKey.PRODUCE), 0, 9, "x")) + body))
    await writer.drain()
    frames = []
    buf = b""
    while len(frames) < 3:
        buf += await asyncio.wait_for(reader.read(65536), 5)
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
            n = struct.unpack(">i", buf[:4])[0]
            frames.append(buf[4 : 4 + n])
            buf = buf[4 + n :]
    codes = [struct.unpack(">ih", f[:6]) for f in frames]
    assert codes == [
        (7, ErrorCode.INVALID_REQUEST),
        (8, ErrorCode.UNSUPPORTED_VERSION),
        (9, ErrorCode.INVALID_REQUEST),
    ]
    writer.close()


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", 2**31 - 1),  # a frame claiming 2 GiB
        struct.pack(">i", -5),
        frame(b"\x00"),  # shorter than a request header
    ],
)
async def test_malformed_stream_closes_only_that_connection(server, garbage: bytes) -> None:
    srv, _ = server
    reader, writer = await _raw(srv.port)
    writer.write(garbage)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(100), 5) == b""  # closed by the server
    writer.close()
    client = RpcClient("127.0.0.1", srv.port, name="test", client_id="t")
    assert isinstance(await client.request(ApiVersionsRequest()), ApiVersionsResponse)
    await client.close()


async def test_client_disconnect_cancels_handlers(server) -> None:
    srv, _ = server
    client = RpcClient("127.0.0.1", srv.port, name="test", client_id="t")
    task = asyncio.create_task(client.request(MetadataRequest(topics=["30"])))
    await asyncio.sleep(0.05)
    await client.close()
    with pytest.raises(RpcConnectionError):
        await task
    await asyncio.sleep(0.05)
    assert not srv.connections


async def test_rpc_timeout_closes_and_reconnects(server) -> None:
    srv, _ = server
    client = RpcClient("127.0.0.1", srv.port, name="test", client_id="t")
    with pytest.raises(RpcTimeoutError):
        await client.request(MetadataRequest(topics=["5"]), timeout_s=0.05)
    assert not client.connected
    resp = await client.request(MetadataRequest(topics=["0"]))
    assert isinstance(resp, MetadataResponse)
    await client.close()


async def test_rpc_connection_refused_then_retry_until_deadline() -> None:
    import socket
    import time

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    client = RpcClient("127.0.0.1", port, name="nobody", client_id="t")
    with pytest.raises(RpcConnectionError, match="nobody"):
        await client.request(ApiVersionsRequest())
    start = time.monotonic()
    with pytest.raises(RpcConnectionError):
        await client.request_with_retry(ApiVersionsRequest(), deadline=time.monotonic() + 0.3)
    assert 0.25 < time.monotonic() - start < 3
    await client.close()


async def test_port_in_use(server) -> None:
    srv, _ = server
    other = ListenerServer("EXTERNAL", "127.0.0.1", srv.port, {})
    with pytest.raises(OSError):
        await other.bind()


async def test_reading_pauses_at_the_in_flight_bound(server) -> None:
    srv, app = server
    conn = ClientConnection("t")
    reader, writer = await _raw(srv.port)
    for _ in range(10):
        _, data = conn.send_request(MetadataRequest(topics=["0.02"]))
        writer.write(data)
    await writer.drain()
    responses = await _read_frames(reader, conn, 10)
    assert len(responses) == 10
    assert app.calls == 10
    writer.close()


async def test_runs_on_uvloop() -> None:
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
