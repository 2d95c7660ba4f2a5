"""The server side of SASL (runtime/sasl.py) against a SCRAM client: both SCRAM
mechanisms and PLAIN authenticate the right password only, the server proves itself,
out-of-turn and malformed messages fail, and an unknown user fails exactly like a
wrong password."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from protocol.errors import ErrorCode
from runtime.sasl import FAILED
from runtime.sasl import SASL_MECHANISMS
from runtime.sasl import SaslSession
from runtime.sasl import ScramClient
from runtime.scram import DEFAULT_ITERATIONS
from runtime.scram import ScramCredential
from runtime.scram import mechanism_number
from runtime.scram import new_upsertion


def store(password: str = "s3cret") -> dict[tuple[str, int], ScramCredential]:
    out = {}
    for m in (1, 2):
        salt, salted = new_upsertion(password, m, 4096)
        out[("alice", m)] = ScramCredential.from_salted_password(m, 4096, salt, salted)
    return out


def session(creds: dict[tuple[str, int], ScramCredential]) -> SaslSession:
    return SaslSession(SASL_MECHANISMS, lambda user, m: creds.get((user, m)))


def scram(mechanism: str, user: str, password: str) -> tuple[SaslSession, int, str | None]:
    s = session(store())
    assert s.handshake(mechanism).error_code == 0
    client = ScramClient(mechanism, user, password)
    first = s.authenticate(client.first())
    if first.error_code:
        return s, first.error_code, first.error_message
    last = s.authenticate(client.final(first.auth_bytes))
    if last.error_code == 0:
        client.verify(last.auth_bytes)
    return s, last.error_code, last.error_message


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_authenticates_the_right_password_only(mechanism: str) -> None:
    s, code, _ = scram(mechanism, "alice", "s3cret")
    assert code == 0 and s.authenticated == "alice"
    s, code, message = scram(mechanism, "alice", "wrong")
    assert code == ErrorCode.SASL_AUTHENTICATION_FAILED and s.failed and s.authenticated is None
    assert message is not None and FAILED in message
    # An unknown user fails the same way, at the same step.
    s, code2, message2 = scram(mechanism, "mallory", "s3cret")
    assert (code2, message2) == (code, message)


def test_plain_checks_the_password_against_the_scram_credential() -> None:
    s = session(store())
    assert s.handshake("PLAIN").error_code == 0
    assert s.authenticate(b"\0alice\0s3cret").error_code == 0 and s.authenticated == "alice"
    s = session(store())
    s.handshake("PLAIN")
    assert s.authenticate(b"\0alice\0nope").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    s = session(store())
    s.handshake("PLAIN")
    assert s.authenticate(b"bob\0alice\0s3cret").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_out_of_turn_and_malformed_messages_fail() -> None:
    s = session(store())
    assert s.authenticate(b"x").error_code == ErrorCode.ILLEGAL_SASL_STATE  # no handshake
    s = session(store())
    assert s.handshake("GSSAPI").error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    s = session(store())
    s.handshake("SCRAM-SHA-256")
    assert s.handshake("SCRAM-SHA-256").error_code == ErrorCode.ILLEGAL_SASL_STATE
    for token in (b"garbage", b"n,,r=only-a-nonce", b"\xff\xfe", b"n,,n=a,r=" + b"x" * 5000):
        s = session(store())
        s.handshake("SCRAM-SHA-256")
        assert s.authenticate(token).error_code == ErrorCode.SASL_AUTHENTICATION_FAILED, token
    # A replayed client-final with another nonce fails.
    s = session(store())
    s.handshake("SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "alice", "s3cret")
    s.authenticate(client.first())
    forged = b"c=biws,r=other-nonce,p=AAAA"
    assert s.authenticate(forged).error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_a_client_detects_a_server_that_does_not_know_the_keys() -> None:
    s = session(store())
    s.handshake("SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "alice", "s3cret")
    client.final(s.authenticate(client.first()).auth_bytes)
    with pytest.raises(ValueError, match="not the real server"):
        client.verify(b"v=AAAA")
    assert mechanism_number("SCRAM-SHA-512") == 2


def test_an_unknown_user_looks_like_a_real_one_in_scram_s_first_answer() -> None:
    """Whether a user exists is not told: its salt is stable across attempts and its
    iteration count the default, as for a user created with the defaults."""

    def first_answer(user: str) -> dict[str, str]:
        s = session({})
        s.handshake("SCRAM-SHA-256")
        answer = s.authenticate(ScramClient("SCRAM-SHA-256", user, "x").first()).auth_bytes
        return dict(part.split("=", 1) for part in bytes(answer).decode().split(","))

    a, b = first_answer("mallory"), first_answer("mallory")
    assert a["s"] == b["s"] and a["i"] == b["i"] == str(DEFAULT_ITERATIONS)
    assert len(base64.b64decode(a["s"])) == 32  # as long as a real salt
    assert first_answer("trudy")["s"] != a["s"]


def test_a_final_nonce_that_ends_with_the_servers_is_accepted_as_kafka_does() -> None:
    """librdkafka 2.0 (Debian's kcat) writes r=<its nonce><the server's whole nonce> in
    its client-final message; Kafka checks that the nonce ends with the server's, so
    that client authenticates there. The proof over the message as sent still decides:
    the right password passes, a wrong one and a nonce not ending with ours fail."""

    def librdkafka_2_0(password: str, tamper: bool = False) -> SaslSession:
        s = session(store())
        s.handshake("SCRAM-SHA-256")
        cnonce = "32nc?aM2K^Ve7KNxCB_J_ZfiR=`lHs3L"  # one librdkafka 2.0.2 sent
        first_bare = f"n=alice,r={cnonce}"
        server_first = bytes(s.authenticate(f"n,,{first_bare}".encode()).auth_bytes).decode()
        attrs = dict(part.split("=", 1) for part in server_first.split(","))
        snonce = attrs["r"] + ("x" if tamper else "")
        salted = hashlib.pbkdf2_hmac(
            "sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        without_proof = f"c=biws,r={cnonce}{snonce}"
        auth_message = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        s.authenticate(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
        return s

    assert librdkafka_2_0("s3cret").authenticated == "alice"
    assert librdkafka_2_0("wrong").failed
    assert librdkafka_2_0("s3cret", tamper=True).failed
