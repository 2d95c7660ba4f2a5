"""SCRAM against a server that is not the cluster's (issue 18), on a real socket: a
listener that answers SaslHandshake and the client-first message itself, asking for an
iteration count of its choosing.

With 1 iteration the proof a client sends is as cheap to crack as a bare hash of the
password (PBKDF2 is what makes a stolen exchange expensive), so a server that asks for
fewer than the 4,096 iterations no credential of a cluster has is refused before any
proof goes out, as Kafka's client refuses it; one that asks for more than 16,384 (the
most a credential may have) is refused too, before the client spends its event loop on
PBKDF2. Both are told why. The client computed and sent the proof for any count.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest

from protocol.api import ApiKey
from protocol.messages import Message
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeResponse
from runtime.peer_rpc import RpcError
from runtime.sasl import SaslCredentials
from runtime.scram import MAX_ITERATIONS
from runtime.scram import MIN_ITERATIONS
from runtime.server import ListenerServer
from runtime.server import RequestContext
from tests.unit.tls.test_tls_listener import connection

pytestmark = pytest.mark.timeout(60)


class Rogue:
    """Answers a SCRAM client-first with `iterations`; keeps every token it is sent."""

    def __init__(self) -> None:
        self.iterations = 1
        self.tokens: list[bytes] = []

    async def handshake(self, ctx: RequestContext, body: Message) -> Message:
        return SaslHandshakeResponse(mechanisms=["SCRAM-SHA-256"])

    async def authenticate(self, ctx: RequestContext, body: Message) -> Message:
        assert isinstance(body, SaslAuthenticateRequest)
        self.tokens.append(bytes(body.auth_bytes))
        if len(self.tokens) > 1:  # a proof: the rogue has what it came for
            return SaslAuthenticateResponse(auth_bytes=b"v=AAAA")
        nonce = dict(p.split("=", 1) for p in self.tokens[0].decode().split(",")[2:])["r"]
        salt = base64.b64encode(b"rogue-salt").decode()
        first = f"r={nonce}rogue,s={salt},i={self.iterations}"
        return SaslAuthenticateResponse(auth_bytes=first.encode())


@pytest.fixture
async def rogue() -> AsyncIterator[tuple[ListenerServer, Rogue]]:
    served = Rogue()
    server = ListenerServer(
        "ROGUE",
        "127.0.0.1",
        0,
        {
            int(ApiKey.SASL_HANDSHAKE): served.handshake,
            int(ApiKey.SASL_AUTHENTICATE): served.authenticate,
        },
    )
    await server.bind()
    await server.start_serving()
    yield server, served
    await server.close()


@pytest.mark.parametrize("iterations", [1, MIN_ITERATIONS - 1, MAX_ITERATIONS + 1])
async def test_a_client_sends_no_proof_for_an_iteration_count_no_credential_has(
    rogue: tuple[ListenerServer, Rogue], iterations: int
) -> None:
    server, served = rogue
    served.iterations = iterations
    alice = SaslCredentials("SCRAM-SHA-256", "alice", "alice-secret")
    conn = connection(server.port, None, sasl=alice)
    with pytest.raises(RpcError, match=f"asks for {iterations} SCRAM iterations"):
        await conn.connect()
    assert len(served.tokens) == 1, "the client sent its proof"
    assert served.tokens[0].startswith(b"n,,n=alice,r=")
