"""TLS on a listener (issue 18), on real sockets and real certificates (a throwaway CA):

- a TLS client's requests are answered; the handler sees the principal of the client's
  certificate under mutual TLS (User:CN=alice), User:ANONYMOUS without one;
- a plaintext client on the TLS port is closed with one log line that says so, and a
  TLS client connected meanwhile is not affected;
- a client that trusts another CA, or reaches the server under a name its certificate
  does not carry, fails to connect with a message that says why;
- with client auth required, a client without a certificate is refused in the
  handshake, and told so by the server's alert;
- a client that closes with a TLS close_notify gets the server's at once (asyncio's
  and aiokafka's clients wait up to 30 s for it otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from client.security import create_ssl_context
from client.throwaway_ca import ThrowawayCA
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import Message
from runtime import server as server_module
from runtime.peer_rpc import RPC_FAILURES
from runtime.peer_rpc import RpcConnectionError
from runtime.rpc import PipelinedConnection
from runtime.sasl import SaslCredentials
from runtime.server import ListenerServer
from runtime.server import RequestContext
from runtime.tls import TlsFiles
from runtime.tls import server_context

pytestmark = pytest.mark.timeout(60)


class Served:
    def __init__(self) -> None:
        self.principals: list[str] = []

    async def handle(self, ctx: RequestContext, body: Message) -> Message:
        self.principals.append(ctx.principal)
        return DescribeQuorumResponse(node_id=7)


@pytest.fixture
def ca(tmp_path: Path) -> ThrowawayCA:
    return ThrowawayCA.create(tmp_path / "ca")


async def listener(context: ssl.SSLContext, served: Served) -> ListenerServer:
    server = ListenerServer(
        "SSL",
        "127.0.0.1",
        0,
        {int(API_BY_REQUEST_TYPE[DescribeQuorumRequest].key): served.handle},
        tls=context,
    )
    await server.bind()
    await server.start_serving()
    return server


@pytest.fixture
async def tls_server(ca: ThrowawayCA) -> AsyncIterator[tuple[ListenerServer, Served]]:
    cert = ca.issue("server", hosts=["127.0.0.1", "localhost"])
    served = Served()
    server = await listener(
        server_context(TlsFiles(cert.certfile, cert.keyfile, ca.cafile), "requested"), served
    )
    yield server, served
    await server.close()


def connection(
    port: int,
    tls: ssl.SSLContext | None,
    host: str = "127.0.0.1",
    sasl: SaslCredentials | None = None,
) -> PipelinedConnection:
    return PipelinedConnection(
        host,
        port,
        peer=f"test server at {host}:{port}",
        failures=RPC_FAILURES,
        client_id="test",
        request_timeout_s=5,
        connect_timeout_s=5,
        max_in_flight=4,
        tls=tls,
        sasl=sasl,
    )


async def ask(port: int, tls: ssl.SSLContext | None) -> Message:
    """One request on a connection of its own."""
    conn = connection(port, tls)
    await conn.connect()
    try:
        answer = await conn.send(DescribeQuorumRequest())
        assert answer is not None
        return answer
    finally:
        await conn.close()


async def test_tls_clients_are_answered_and_named_by_their_certificate(
    ca: ThrowawayCA, tls_server: tuple[ListenerServer, Served]
) -> None:
    server, served = tls_server
    anonymous = create_ssl_context(cafile=ca.cafile)
    alice = ca.issue("alice")
    mutual = create_ssl_context(cafile=ca.cafile, certfile=alice.certfile, keyfile=alice.keyfile)
    assert isinstance(await ask(server.port, anonymous), DescribeQuorumResponse)
    assert isinstance(await ask(server.port, mutual), DescribeQuorumResponse)
    assert served.principals == ["User:ANONYMOUS", "User:CN=alice"]


async def test_a_plaintext_client_is_closed_with_one_line_and_others_go_on(
    ca: ThrowawayCA,
    tls_server: tuple[ListenerServer, Served],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, served = tls_server
    tls = create_ssl_context(cafile=ca.cafile)
    steady = connection(server.port, tls)
    await steady.connect()
    try:
        with caplog.at_level(logging.WARNING, logger="runtime.server"):
            with pytest.raises(RpcConnectionError):
                await ask(server.port, None)  # plaintext: the server closes it
            await asyncio.sleep(0.1)
        lines = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "plaintext client" in lines[0] and "on SSL" in lines[0], lines
        assert isinstance(await steady.send(DescribeQuorumRequest()), DescribeQuorumResponse)
    finally:
        await steady.close()
    assert served.principals == ["User:ANONYMOUS"]  # the plaintext one never got through


async def test_an_untrusted_or_misnamed_server_is_refused_by_the_client(
    ca: ThrowawayCA, tls_server: tuple[ListenerServer, Served], tmp_path: Path
) -> None:
    server, served = tls_server
    other_ca = ThrowawayCA.create(tmp_path / "other")
    with pytest.raises(RpcConnectionError, match=r"TLS handshake failed.*signed by the CA file"):
        await ask(server.port, create_ssl_context(cafile=other_ca.cafile))
    # A certificate for db.example only, reached at 127.0.0.1.
    misnamed = ca.issue("elsewhere", hosts=["db.example"])
    other = await listener(
        server_context(TlsFiles(misnamed.certfile, misnamed.keyfile), "none"), served
    )
    try:
        with pytest.raises(RpcConnectionError, match="TLS handshake failed"):
            await ask(other.port, create_ssl_context(cafile=ca.cafile))
    finally:
        await other.close()
    assert served.principals == []


async def test_required_client_auth_refuses_a_client_without_a_certificate(
    ca: ThrowawayCA, caplog: pytest.LogCaptureFixture
) -> None:
    cert = ca.issue("server", hosts=["127.0.0.1"])
    served = Served()
    server = await listener(
        server_context(TlsFiles(cert.certfile, cert.keyfile, ca.cafile), "required"), served
    )
    try:
        with caplog.at_level(logging.WARNING, logger="runtime.server"):
            # TLS 1.3: the client learns of the refusal on its first read, from the
            # server's alert (not a reset: the alert was dropped with the connection).
            with pytest.raises(RpcConnectionError, match="CERTIFICATE_REQUIRED"):
                await ask(server.port, create_ssl_context(cafile=ca.cafile))
            await asyncio.sleep(0.1)
        bob = ca.issue("bob")
        with_cert = create_ssl_context(cafile=ca.cafile, certfile=bob.certfile, keyfile=bob.keyfile)
        assert isinstance(await ask(server.port, with_cert), DescribeQuorumResponse)
        assert served.principals == ["User:CN=bob"]
        assert any("certificate" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        await server.close()


async def test_a_close_notify_is_answered_at_once(
    ca: ThrowawayCA, tls_server: tuple[ListenerServer, Served]
) -> None:
    server, _ = tls_server
    _, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=create_ssl_context(cafile=ca.cafile), ssl_shutdown_timeout=10
    )
    started = asyncio.get_running_loop().time()
    writer.close()
    await writer.wait_closed()  # raises TimeoutError after 10 s without the server's
    assert asyncio.get_running_loop().time() - started < 2


async def test_a_client_that_never_finishes_the_handshake_is_closed(
    ca: ThrowawayCA,
    tls_server: tuple[ListenerServer, Served],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slowloris on TLS: a connection that sends half a ClientHello (or nothing)
    holds a slot only until the handshake deadline, then is closed with a line."""
    monkeypatch.setattr(server_module, "HANDSHAKE_TIMEOUT_S", 0.3)
    server, _ = tls_server
    with caplog.at_level(logging.WARNING, logger="runtime.server"):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\x16\x03\x01\x02\x00")  # the start of a ClientHello, no more
        await writer.drain()
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed by the server
        writer.close()
    assert any("no TLS handshake within 0.3 s" in r.getMessage() for r in caplog.records)
    assert not server.connections
