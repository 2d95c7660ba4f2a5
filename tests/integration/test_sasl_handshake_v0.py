"""SaslHandshake v0 on the Kafka listener, on a real broker process (issue 18): kcat
1.7 on librdkafka 2.0 (Debian's) starts SASL only when ApiVersions offers SaslHandshake
v0 (rdkafka_feature.c: RD_KAFKA_FEATURE_SASL_HANDSHAKE depends on SaslHandshake 0..0),
though it then uses v1 and SaslAuthenticate; after a v0 handshake a client sends its
tokens as raw length-prefixed frames (KIP-43), which the broker serves too:

- kcat produces and consumes over SASL_PLAINTEXT with SCRAM-SHA-256 and over SASL_SSL
  with SCRAM-SHA-512; with a wrong password it gets nothing and the broker logs why;
- a raw-socket client does the v0 exchange (SCRAM, runtime/sasl.py's ScramClient, over
  raw frames) and then serves requests as usual; a wrong password and an unknown user
  end the same way (no answer to the final token, connection closed, the same line);
- hostile input after a v0 handshake closes only that connection, with a line saying
  why: a raw frame whose length lies (more than is sent: the frame timeout; beyond the
  frame bound: at once), an oversized token, a normal request in the middle of the raw
  exchange, a SaslAuthenticate (Kafka closes there too); none of them authenticates.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol.api import ApiKey
from protocol.kafka.apis import KAFKA_APIS
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse
from runtime.sasl import MAX_TOKEN_BYTES
from runtime.sasl import ScramClient
from tests.integration.cluster import Cluster
from tests.integration.test_sasl import PASSWORD
from tests.integration.test_sasl import TOPIC
from tests.integration.test_sasl import make_users
from tests.integration.test_sasl import sasl_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FRAME_TIMEOUT_MS = 1500
_SECURE = re.compile(r"SECURE://([\w.-]+):(\d+)")
_LENGTH = struct.Struct(">i")


@dataclass
class Broker:
    c: Cluster
    cafile: Path
    plaintext: str  # SASL_PLAINTEXT Kafka listener
    tls: str  # SASL_SSL Kafka listener

    def log_after(self, mark: int) -> str:
        return self.c.brokers[1].log_text()[mark:]

    def mark(self) -> int:
        return len(self.c.brokers[1].log_text())


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker of its own per test: a closure's log line is one per kind every 10 s
    (LogThrottle), so each test sees its own lines."""
    with sasl_broker(
        tmp_path,
        *("--listeners", "PLAINTEXT://127.0.0.1:0,KAFKA://127.0.0.1:0,SECURE://127.0.0.1:0"),
        *("--kafka-listeners", "KAFKA,SECURE"),
        *("--listener-security-protocol-map", "KAFKA:SASL_PLAINTEXT,SECURE:SASL_SSL"),
        *("--sasl-enabled-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"),
        *("--request-frame-timeout-ms", str(FRAME_TIMEOUT_MS)),
    ) as (c, ca):
        asyncio.run(make_users(c))
        secure = _SECURE.search(c.brokers[1].log_text())
        assert secure is not None
        yield Broker(c, ca.cafile, c.brokers[1].kafka_address, f"{secure[1]}:{secure[2]}")


# ------------------------------------------------------------------ kcat


def kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        pytest.fail(
            "KCAT IS MISSING: this test needs Debian's kcat (librdkafka 2.0): run "
            "tests/install_tools.sh (apt-get install kcat)"
        )
    return path


def kcat_run(
    settings: list[str], *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kcat(), *settings, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def kcat_settings(bootstrap: str, protocol: str, mechanism: str, password: str) -> list[str]:
    return [
        *("-b", bootstrap),
        *("-X", f"security.protocol={protocol}"),
        *("-X", f"sasl.mechanisms={mechanism}"),
        *("-X", "sasl.username=alice"),
        *("-X", f"sasl.password={password}"),
    ]


def test_kcat_produces_and_consumes_with_scram_on_sasl_plaintext_and_sasl_ssl(
    broker: Broker,
) -> None:
    """The invariant: a SASL Kafka listener offers SaslHandshake v0, so librdkafka 2.0
    starts SASL; without v0 kcat stops at 'SASL Handshake not supported by broker'."""
    runs = [
        (kcat_settings(broker.plaintext, "SASL_PLAINTEXT", "SCRAM-SHA-256", PASSWORD), "256"),
        (
            [
                *kcat_settings(broker.tls, "SASL_SSL", "SCRAM-SHA-512", PASSWORD),
                *("-X", f"ssl.ca.location={broker.cafile}"),
            ],
            "512",
        ),
    ]
    sent: list[str] = []
    for settings, name in runs:
        lines = [f"kcat-scram-{name}-{i}" for i in range(5)]
        produced = kcat_run(
            settings, "-P", "-t", TOPIC, "-p", "0", "-X", "acks=all", stdin="\n".join(lines)
        )
        assert produced.returncode == 0, produced.stderr
        sent += lines
        consumed = kcat_run(settings, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-e", "-q")
        assert consumed.returncode == 0, consumed.stderr
        assert consumed.stdout.split() == sent
    log = broker.c.brokers[1].log_text()
    assert "authenticated as alice (SCRAM-SHA-256)" in log
    assert "authenticated as alice (SCRAM-SHA-512)" in log


def test_kcat_with_a_wrong_password_gets_nothing(broker: Broker) -> None:
    mark = broker.mark()
    settings = kcat_settings(broker.plaintext, "SASL_PLAINTEXT", "SCRAM-SHA-256", "not-it")
    listing = kcat_run(settings, "-L", "-t", TOPIC, "-m", "5")
    assert listing.returncode != 0
    assert f'topic "{TOPIC}"' not in listing.stdout
    assert "Authentication failed" in listing.stderr or "authentication" in listing.stderr.lower()
    # A consumer that ends at the partition's end: it never gets there, nothing is read.
    with contextlib.suppress(subprocess.TimeoutExpired):
        consumed = kcat_run(
            settings, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-e", "-q", timeout=8
        )
        assert consumed.returncode != 0
        assert consumed.stdout == ""
    time.sleep(0.5)
    failed = [line for line in broker.log_after(mark).splitlines() if "failed" in line]
    assert any("SASL SCRAM-SHA-256 failed" in line for line in failed), failed
    assert all("wrong user name or password" in line for line in failed), failed


# ------------------------------------------------------------------ raw sockets


class KafkaSocket:
    """A raw socket speaking Kafka frames and, after a v0 handshake, raw SASL tokens."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def send_request(self, body: Message, api_key: ApiKey, version: int) -> int:
        self.correlation_id += 1
        frame = encode_request(KAFKA_APIS[api_key], version, self.correlation_id, "raw", body)
        self.sock.sendall(frame)
        return self.correlation_id

    def request(self, body: Message, api_key: ApiKey, version: int) -> Message:
        correlation_id = self.send_request(body, api_key, version)
        got, answer = decode_response(KAFKA_APIS[api_key], version, self.read_frame())
        assert got == correlation_id
        return answer

    def send_token(self, token: bytes) -> None:
        self.sock.sendall(_LENGTH.pack(len(token)) + token)

    def token(self, token: bytes) -> bytes:
        self.send_token(token)
        return self.read_frame()

    def read_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed by the broker after {len(out)} of {n} bytes")
            out += chunk
        return out

    def read_frame(self) -> bytes:
        (length,) = _LENGTH.unpack(self.read_exact(4))
        return self.read_exact(length)

    def closed_without_answer(self, wait_s: float = 10.0) -> bool:
        """True when the broker closes the connection having sent nothing more."""
        self.sock.settimeout(wait_s)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def handshake_v0(self, mechanism: str = "SCRAM-SHA-256") -> None:
        answer = self.request(SaslHandshakeRequest(mechanism=mechanism), ApiKey.SASL_HANDSHAKE, 0)
        assert isinstance(answer, SaslHandshakeResponse)
        assert answer.error_code == 0
        assert mechanism in answer.mechanisms


def raw(address: str) -> contextlib.closing[KafkaSocket]:
    return contextlib.closing(KafkaSocket(address))


def wait_for_log(broker: Broker, mark: int, text: str) -> str:
    """The log since `mark`, once `text` is in it."""
    broker.c.brokers[1].wait_for(re.escape(text), timeout=10)
    return broker.log_after(mark)


def test_api_versions_offers_sasl_handshake_v0_and_v1(broker: Broker) -> None:
    with raw(broker.plaintext) as conn:
        answer = conn.request(ApiVersionsRequest(), ApiKey.API_VERSIONS, 0)
        assert isinstance(answer, ApiVersionsResponse)
        versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
        assert versions[ApiKey.SASL_HANDSHAKE] == (0, 1)
        assert versions[ApiKey.SASL_AUTHENTICATE] == (0, 2)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_v0_handshake_then_raw_scram_tokens_authenticates(broker: Broker, mechanism: str) -> None:
    """The invariant: after SaslHandshake v0 the tokens travel as raw frames both ways
    and, once the exchange ends, the same connection serves requests as the user."""
    mark = broker.mark()
    with raw(broker.plaintext) as conn:
        conn.handshake_v0(mechanism)
        scram = ScramClient(mechanism, "alice", PASSWORD)
        server_first = conn.token(scram.first())
        server_final = conn.token(scram.final(server_first))
        scram.verify(server_final)  # the broker proved it holds the credential
        answer = conn.request(MetadataRequest(topics=None), ApiKey.METADATA, 1)
        assert isinstance(answer, MetadataResponse)
        assert TOPIC in {t.name for t in answer.topics}
    wait_for_log(broker, mark, f"authenticated as alice ({mechanism})")


def test_a_wrong_password_and_an_unknown_user_end_alike_on_raw_tokens(broker: Broker) -> None:
    """No answer to the final token, the connection closed, the same log line for both:
    the raw exchange does not tell whether a user exists."""
    mark = broker.mark()
    firsts: dict[str, dict[str, str]] = {}
    for user, password in (("alice", "not-it"), ("nobody", "not-it")):
        with raw(broker.plaintext) as conn:
            conn.handshake_v0()
            scram = ScramClient("SCRAM-SHA-256", user, password)
            server_first = conn.token(scram.first())
            firsts[user] = dict(p.split("=", 1) for p in server_first.decode().split(","))
            conn.send_token(scram.final(server_first))
            assert conn.closed_without_answer()
    # The unknown user gets a salt and an iteration count shaped like a real user's.
    assert firsts["nobody"]["i"] == firsts["alice"]["i"]
    assert len(firsts["nobody"]["s"]) == len(firsts["alice"]["s"])
    log = wait_for_log(broker, mark, "SASL SCRAM-SHA-256 failed")
    time.sleep(0.3)
    # One line (the second closure within 10 s is counted for a later line), and what
    # is logged says the same for both.
    failed = [line for line in broker.log_after(mark).splitlines() if "failed" in line]
    assert failed and all("wrong user name or password" in line for line in failed), failed
    assert "nobody" not in log
    assert "authenticated as" not in broker.log_after(mark)


def test_a_raw_frame_whose_length_lies_is_bounded(broker: Broker) -> None:
    mark = broker.mark()
    # More announced than sent: the frame timeout closes it, not a wait forever.
    with raw(broker.plaintext) as conn:
        conn.handshake_v0()
        conn.sock.sendall(_LENGTH.pack(1000) + b"n,,n=alice")
        started = time.monotonic()
        assert conn.closed_without_answer(wait_s=FRAME_TIMEOUT_MS / 1000 * 10)
        assert time.monotonic() - started >= FRAME_TIMEOUT_MS / 1000 * 0.8
    wait_for_log(broker, mark, "a request frame is still incomplete")
    # A length beyond the frame bound (or negative): closed at once, nothing read.
    for length in (2**31 - 1, -5):
        with raw(broker.plaintext) as conn:
            conn.handshake_v0()
            conn.sock.sendall(_LENGTH.pack(length) + b"n,,n=alice")
            assert conn.closed_without_answer()
    wait_for_log(broker, mark, "a bad frame (frame of")
    assert "authenticated as" not in broker.log_after(mark)


def test_an_oversized_raw_token_is_refused(broker: Broker) -> None:
    mark = broker.mark()
    with raw(broker.plaintext) as conn:
        conn.handshake_v0()
        conn.send_token(b"n,,n=alice,r=" + b"x" * MAX_TOKEN_BYTES)
        assert conn.closed_without_answer()
    log = wait_for_log(broker, mark, "SASL SCRAM-SHA-256 failed")
    assert f"bytes (at most {MAX_TOKEN_BYTES})" in log
    assert "after SaslHandshake v0" in log


def test_a_request_in_the_middle_of_the_raw_exchange_is_refused(broker: Broker) -> None:
    """A Metadata request after the first token is not served: it is read as the
    client's final token, fails the exchange, and the connection closes, unanswered."""
    mark = broker.mark()
    with raw(broker.plaintext) as conn:
        conn.handshake_v0()
        scram = ScramClient("SCRAM-SHA-256", "alice", PASSWORD)
        conn.token(scram.first())
        conn.send_request(MetadataRequest(topics=None), ApiKey.METADATA, 1)
        assert conn.closed_without_answer()
    log = wait_for_log(broker, mark, "SASL SCRAM-SHA-256 failed")
    assert "(a raw SASL token, after SaslHandshake v0)" in log
    assert "authenticated as" not in log


def test_a_sasl_authenticate_after_a_v0_handshake_closes_the_connection(broker: Broker) -> None:
    """Kafka closes here too: after v0 the tokens travel raw, never in SaslAuthenticate."""
    mark = broker.mark()
    with raw(broker.plaintext) as conn:
        conn.handshake_v0()
        scram = ScramClient("SCRAM-SHA-256", "alice", PASSWORD)
        conn.send_request(
            SaslAuthenticateRequest(auth_bytes=scram.first()), ApiKey.SASL_AUTHENTICATE, 1
        )
        assert conn.closed_without_answer()
    log = wait_for_log(broker, mark, "SASL SCRAM-SHA-256 failed")
    assert "(a raw SASL token, after SaslHandshake v0)" in log
    assert "authenticated as" not in log
