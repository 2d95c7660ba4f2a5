"""runtime/rpc.py: the one pipelined connection under the broker's RpcClient and the
client library's BrokerConnection, against real sockets whose peer misbehaves.

Invariant protected: no request waits without bound. A peer that never answers, a
full in-flight window and a peer that never reads each end in the failures' timeout
error within the request timeout, and the connection is closed so nothing queues
behind the lost request.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from protocol.messages import MetadataRequest
from runtime.peer_rpc import RPC_FAILURES
from runtime.peer_rpc import RpcConnectionError
from runtime.peer_rpc import RpcTimeoutError
from runtime.rpc import PipelinedConnection

# The broker's failures (its Rpc* errors); the client library's are client/connection.py's.
Timeout, Dropped = RpcTimeoutError, RpcConnectionError


class SilentPeer:
    """A server that accepts and then neither answers nor, if `reads` is off, reads."""

    def __init__(self, *, reads: bool) -> None:
        self.reads = reads
        self.writers: list[asyncio.StreamWriter] = []

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        while self.reads and await reader.read(1 << 16):
            pass


@pytest.fixture(params=[True, False], ids=["reads", "never-reads"])
async def silent_peer(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    peer = SilentPeer(reads=request.param)
    server = await asyncio.start_server(peer.on_client, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in peer.writers:
        writer.transport.abort()
    server.close()
    await server.wait_closed()


async def connection(
    port: int, *, timeout_s: float, max_in_flight: int = 100
) -> PipelinedConnection:
    conn = PipelinedConnection(
        "127.0.0.1",
        port,
        peer=f"test peer at 127.0.0.1:{port}",
        failures=RPC_FAILURES,
        client_id="t",
        request_timeout_s=timeout_s,
        connect_timeout_s=5.0,
        max_in_flight=max_in_flight,
    )
    await conn.connect()
    return conn


async def test_a_request_without_answer_times_out_and_closes_the_connection(
    silent_peer: int,
) -> None:
    conn = await connection(silent_peer, timeout_s=0.2)
    first = asyncio.create_task(conn.send(MetadataRequest(topics=["a"])))
    second = asyncio.create_task(conn.send(MetadataRequest(topics=["b"]), timeout_s=30))
    with pytest.raises(Timeout, match=r"no answer from test peer .* to METADATA within 200 ms"):
        await first
    # The second had 30 s left, but its answer would queue behind the lost one.
    with pytest.raises(Dropped, match="an earlier request got no answer"):
        await second
    assert not conn.connected and conn.closed_at is not None
    with pytest.raises(Dropped, match="is closed"):
        await conn.send(MetadataRequest())


async def test_a_full_in_flight_window_is_a_bounded_wait(silent_peer: int) -> None:
    conn = await connection(silent_peer, timeout_s=5.0, max_in_flight=1)
    held = asyncio.create_task(conn.send(MetadataRequest()))
    await asyncio.sleep(0)
    started = time.monotonic()
    with pytest.raises(Timeout, match=r"1 requests to test peer .* still unanswered"):
        await conn.send(MetadataRequest(), timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    held.cancel()
    await conn.close()


async def test_a_peer_that_never_reads_cannot_hold_a_fire_and_forget_sender() -> None:
    """acks=0 requests have no answer timer: the write-buffer wait is what bounds them."""
    peer = SilentPeer(reads=False)
    server = await asyncio.start_server(peer.on_client, "127.0.0.1", 0)
    conn = await connection(server.sockets[0].getsockname()[1], timeout_s=0.3)
    big = MetadataRequest(topics=["t" * 200] * 2000)  # ~400 KB a request
    started = time.monotonic()
    with pytest.raises(Timeout, match="read nothing for 300 ms"):
        async with asyncio.timeout(20):  # without the bound: stuck here, fails as TimeoutError
            for _ in range(500):  # far more than the socket buffers hold
                await conn.send(big, expect_response=False)
    assert time.monotonic() - started < 10.0
    assert not conn.connected
    for writer in peer.writers:
        writer.transport.abort()
    server.close()
    await server.wait_closed()


async def test_outgoing_connections_set_tcp_nodelay(silent_peer: int) -> None:
    # Small requests (a follower's fetch, an acks=all produce) must not wait for the
    # peer's delayed ACK (Nagle). uvloop sets it today; PipelinedConnection states it.
    conn = await connection(silent_peer, timeout_s=1.0)
    try:
        sock = conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await conn.close()
