"""What a stranger (no password) can make a listener do, on a real broker process
(issue 18's threat model: it connects, authenticates nowhere, and can slow a listener,
never hold it): raw sockets on a native and a Kafka SASL_PLAINTEXT listener.

- Memory: before authentication a frame longer than 512 KiB (Kafka's
  sasl.server.max.receive.size) closes the connection at its length prefix, on both
  protocols; so a stranger cannot make the broker buffer a 100 MiB request per
  connection (it could: four connections took 340 MiB of the broker's memory). Once
  authenticated, the listener's own bound applies again (a 700 KiB record is produced).
- Slots: a request the listener cannot serve (an unknown API, a version it does not
  have, a body it cannot decode) before authentication closes the connection
  unanswered, as any request but ApiVersions and the exchange does. It was answered,
  and that classed the connection as a client that spoke, which no newcomer displaces:
  strangers held every slot of --max-connections and an authenticated user was
  refused.
- After authentication, a SaslHandshake or SaslAuthenticate (re-authentication, which
  is not supported) is answered ILLEGAL_SASL_STATE, on the controller as on a broker.
  The controller answered UNKNOWN_SERVER_ERROR (`KeyError: 17`) and logged a
  traceback for each.
- Users: PLAIN refuses a user that does not exist as late as a wrong password (it
  hashes the password all the same); it answered a whole PBKDF2 sooner (~1 ms
  against ~6 ms), which told which users exist.
- Logs: on any listener, closures for a malformed stream and answers to requests the
  broker cannot serve are logged at most a line a kind every 10 s, like every closure
  (30 garbage connections were 30 lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import statistics
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeRequest
from runtime.peer_rpc import RpcError
from runtime.sasl import MAX_UNAUTHENTICATED_FRAME_BYTES
from runtime.sasl import SaslCredentials
from runtime.sasl import ScramClient
from runtime.scram import DEFAULT_ITERATIONS
from runtime.scram import salted_password
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient
from tests.integration.cluster import count_lines
from tests.integration.test_sasl import PASSWORD
from tests.integration.test_sasl import TOPIC
from tests.integration.test_sasl import make_users
from tests.integration.test_sasl import sasl_broker
from tests.unit.tls.test_tls_listener import connection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MAX_CONNECTIONS = 6
SERVER_USER = "minibroker-server"
SERVER_PASSWORD = "server-secret-1"
_CLIENT = re.compile(r"CLIENT://([\w.-]+):(\d+)")
_LENGTH = struct.Struct(">i")


@dataclass
class Broker:
    c: Cluster
    native: str  # SASL_PLAINTEXT native listener
    kafka: str  # SASL_PLAINTEXT Kafka listener

    def mark(self) -> int:
        return len(self.c.brokers[1].log_text())

    def log_after(self, mark: int) -> str:
        return self.c.brokers[1].log_text()[mark:]

    def alice(self) -> dict[str, object]:
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "alice",
            "sasl_plain_password": PASSWORD,
        }


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with sasl_broker(
        tmp_path,
        *("--listeners", "PLAINTEXT://127.0.0.1:0,CLIENT://127.0.0.1:0,KAFKA://127.0.0.1:0"),
        *("--kafka-listeners", "KAFKA"),
        *("--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT,KAFKA:SASL_PLAINTEXT"),
        *("--sasl-enabled-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"),
        *("--max-connections", str(MAX_CONNECTIONS)),
    ) as (c, _ca):
        asyncio.run(make_users(c))
        native = _CLIENT.search(c.brokers[1].log_text())
        assert native is not None
        yield Broker(c, f"{native[1]}:{native[2]}", c.brokers[1].kafka_address)


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def closed_without_answer(sock: socket.socket, wait_s: float = 5.0) -> bool:
    """True when the broker closes the connection having sent nothing; False when it
    answers or keeps it open for `wait_s`."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def request_frame(api_key: int, api_version: int) -> bytes:
    """A request header (the same on both protocols: key, version, correlation id, null
    client id) and a one-byte body."""
    payload = struct.pack(">hhih", api_key, api_version, 1, -1) + b"\x80"
    return _LENGTH.pack(len(payload)) + payload


async def test_a_stranger_cannot_make_the_broker_buffer_a_large_frame(broker: Broker) -> None:
    mark = broker.mark()
    for address in (broker.native, broker.kafka):
        with contextlib.closing(connect(address)) as sock:
            # A frame claiming 8 MiB, and the first 64 KiB of it: no request is read,
            # the connection goes at once (it waited for the rest, up to 100 MiB).
            sock.sendall(_LENGTH.pack(8 * 1024 * 1024) + b"\0" * (64 * 1024))
            assert closed_without_answer(sock), address
    log = broker.log_after(mark)
    assert f"exceeds the limit of {MAX_UNAUTHENTICATED_FRAME_BYTES} bytes" in log, log
    assert "before SASL authentication" in log
    # Authenticated, a request of more than that is served as before.
    value = b"v" * (700 * 1024)
    async with AsyncProducer(broker.native, **broker.alice()) as producer:
        await producer.send_and_wait(TOPIC, value, partition=0)
    async with AsyncConsumer(
        broker.native, auto_offset_reset="earliest", **broker.alice()
    ) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        batch = await consumer.poll(timeout_ms=10_000)
    assert [r.value for records in batch.values() for r in records] == [value]


async def test_strangers_cannot_hold_the_connection_slots(broker: Broker) -> None:
    mark = broker.mark()
    strangers = []
    try:
        # An unknown API, a version the listener does not have, a body it cannot decode:
        # each was answered (its error), and the connection then held its slot. (The
        # Kafka listener closed them already: such errors have no Kafka answer.)
        frames = [
            (broker.native, request_frame(999, 0)),
            (broker.native, request_frame(3, 99)),
            (broker.native, request_frame(0, 0)),
        ]
        for i in range(MAX_CONNECTIONS):
            address, frame = frames[i % len(frames)]
            sock = connect(address)
            sock.sendall(frame)
            strangers.append(sock)
        await asyncio.sleep(0.5)
        # Alice gets in: the strangers hold no slot.
        async with AsyncAdmin(broker.native, request_timeout_ms=10_000, **broker.alice()) as admin:
            assert TOPIC in await asyncio.wait_for(admin.list_topics(), 30)
        still_open = [sock for sock in strangers if not closed_without_answer(sock)]
        assert not still_open, broker.log_after(mark)
    finally:
        for sock in strangers:
            sock.close()
    assert "before SASL authentication" in broker.log_after(mark)
    assert "each has sent a request" not in broker.log_after(mark)


async def test_sasl_after_authentication_is_refused_on_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINIBROKER_SASL_BOOTSTRAP_PASSWORD", SERVER_PASSWORD)
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        controller = c.start_controller(
            *("--security-protocol", "SASL_PLAINTEXT"),
            *("--sasl-bootstrap-username", SERVER_USER),
        )
        controller.wait_for(f"bootstrap user '{SERVER_USER}' created")
        async with TestClient(controller.host, controller.port) as raw:
            scram = ScramClient("SCRAM-SHA-512", SERVER_USER, SERVER_PASSWORD)
            assert (await raw.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))).error_code == 0
            first = await raw.call(SaslAuthenticateRequest(auth_bytes=scram.first()))
            assert isinstance(first, SaslAuthenticateResponse)
            final = await raw.call(
                SaslAuthenticateRequest(auth_bytes=scram.final(first.auth_bytes))
            )
            assert isinstance(final, SaslAuthenticateResponse) and final.error_code == 0
            again = await raw.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))
            assert again.error_code == ErrorCode.ILLEGAL_SASL_STATE, again
            token = await raw.call(SaslAuthenticateRequest(auth_bytes=scram.first()))
            assert isinstance(token, SaslAuthenticateResponse)
            assert token.error_code == ErrorCode.ILLEGAL_SASL_STATE
            assert token.error_message == f"SASL: already authenticated as User:{SERVER_USER}"
            # The connection stays, still the server user's.
            assert isinstance(await raw.call(DescribeClusterRequest()), DescribeClusterResponse)
        assert "Traceback" not in controller.log_text()
    finally:
        c.stop_all()


async def test_a_stranger_sending_garbage_does_not_write_a_line_each(broker: Broker) -> None:
    """Closures for a malformed stream, and answers to requests the broker cannot serve,
    are logged at most once a kind every 10 s, as every closure is: they were a line
    each, so a stranger writing garbage wrote the broker's log as fast as it connected."""
    mark = broker.mark()
    plaintext = "{}:{}".format(*broker.c.brokers[1].address)  # no SASL: anyone's
    for _ in range(30):
        with contextlib.closing(connect(plaintext)) as sock:
            sock.sendall(_LENGTH.pack(-5))  # a negative frame length
            assert closed_without_answer(sock)
    with contextlib.closing(connect(plaintext)) as sock:
        sock.sendall(request_frame(999, 0) * 100)  # each answered INVALID_REQUEST
        sock.settimeout(10)
        answers = b""
        while answers.count(b"unknown or unserved API key") < 100:
            chunk = sock.recv(1 << 16)
            assert chunk, "the broker closed the connection"
            answers += chunk
    log = broker.log_after(mark)
    assert 1 <= count_lines(log, "malformed request stream") <= 2, log
    assert 1 <= count_lines(log, "rejected request") <= 2, log


async def test_plain_answers_as_late_for_a_user_that_does_not_exist(broker: Broker) -> None:
    """PLAIN hashes the password it is given (PBKDF2, the user's iteration count) to
    check it; for a user that does not exist it answered at once, so the time of the
    refusal told which users exist (README: an unknown user fails exactly like a wrong
    password). Now it hashes as for a real user at the default count."""
    host, port = broker.native.rsplit(":", 1)

    async def refused_after(user: str) -> float:
        wrong = SaslCredentials("PLAIN", user, "not-the-password")
        conn = connection(int(port), None, host, sasl=wrong)
        started = time.perf_counter()
        with pytest.raises(RpcError, match="SASL_AUTHENTICATION_FAILED"):
            await conn.connect()
        return time.perf_counter() - started

    known, unknown = [], []
    for _ in range(21):
        known.append(await refused_after("alice"))
        unknown.append(await refused_after("nobody"))
    started = time.perf_counter()
    salted_password("not-the-password", b"s" * 32, DEFAULT_ITERATIONS, 1)
    one_hash = time.perf_counter() - started
    # Without the hash, "nobody" was refused a whole hash sooner than alice.
    assert statistics.median(unknown) > statistics.median(known) - one_hash / 2, (
        statistics.median(known),
        statistics.median(unknown),
        one_hash,
    )
