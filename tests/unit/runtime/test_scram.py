"""SCRAM credentials (runtime/scram.py) against RFC 7677's SCRAM-SHA-256 example:
the stored and server keys derived from "pencil" check the RFC's client proof and
give the RFC's server signature, so a credential stored this way authenticates
exactly the clients that know the password."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from runtime.scram import MAX_ITERATIONS
from runtime.scram import ScramCredential
from runtime.scram import credential_problem
from runtime.scram import mechanism_number
from runtime.scram import new_upsertion
from runtime.scram import salted_password

SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
NONCE = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
AUTH_MESSAGE = (
    f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r={NONCE}"
).encode()
CLIENT_PROOF = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_SIGNATURE = base64.b64decode("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def rfc_credential() -> ScramCredential:
    salted = salted_password("pencil", SALT, 4096, mechanism_number("SCRAM-SHA-256"))
    return ScramCredential.from_salted_password(1, 4096, SALT, salted)


def test_the_rfc_7677_exchange_checks_out_against_the_stored_keys() -> None:
    cred = rfc_credential()
    signature = hmac.digest(cred.stored_key, AUTH_MESSAGE, "sha256")
    client_key = bytes(a ^ b for a, b in zip(CLIENT_PROOF, signature, strict=True))
    assert hashlib.sha256(client_key).digest() == cred.stored_key
    assert hmac.digest(cred.server_key, AUTH_MESSAGE, "sha256") == SERVER_SIGNATURE


def test_a_credential_matches_its_password_only() -> None:
    cred = rfc_credential()
    assert cred.matches("pencil")
    assert not cred.matches("pencil ")
    assert not cred.matches("")


def test_an_upsertion_carries_a_fresh_salt_and_no_password() -> None:
    salt_a, salted_a = new_upsertion("secret", 2, 4096)
    salt_b, salted_b = new_upsertion("secret", 2, 4096)
    assert salt_a != salt_b and salted_a != salted_b  # salted per credential
    assert b"secret" not in salted_a and len(salted_a) == 64  # a SHA-512 digest
    assert credential_problem("bob", 2, 4096, salt_a, salted_a) is None


@pytest.mark.parametrize(
    ("name", "mechanism", "iterations", "salted", "why"),
    [
        ("", 1, 4096, b"x" * 32, "name is empty"),
        ("bob", 3, 4096, b"x" * 32, "mechanism 3"),
        ("bob", 1, 1000, b"x" * 32, "outside 4096"),
        ("bob", 1, MAX_ITERATIONS + 1, b"x" * 32, "outside 4096"),
        ("bob", 1, 4096, b"x" * 31, "not a SCRAM-SHA-256 digest"),
    ],
)
def test_unusable_upsertions_say_why(
    name: str, mechanism: int, iterations: int, salted: bytes, why: str
) -> None:
    problem = credential_problem(name, mechanism, iterations, b"salt", salted)
    assert problem is not None and why in problem


def test_mechanism_names() -> None:
    assert mechanism_number("scram-sha-512") == 2
    with pytest.raises(ValueError, match="SCRAM-SHA-256, SCRAM-SHA-512"):
        mechanism_number("PLAIN")
