"""SCRAM credentials (RFC 5802, RFC 7677; Kafka's KIP-84 and KIP-554), the one place
their rules live: the mechanisms and their Kafka numbers, the iteration bounds, and
what is derived from a password. A server keeps only the salt, the iteration count,
StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey =
HMAC(SaltedPassword, "Server Key"): enough to check a client's proof, never enough to
log in as it, and never the password.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

# Kafka's ScramMechanism numbers (AlterUserScramCredentials) -> (name, hash).
MECHANISMS: dict[int, tuple[str, str]] = {
    1: ("SCRAM-SHA-256", "sha256"),
    2: ("SCRAM-SHA-512", "sha512"),
}
BY_NAME = {name: number for number, (name, _) in MECHANISMS.items()}
# Kafka's bounds (the lower one is RFC 7677's minimum for SHA-256).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192
SALT_BYTES = 32


def mechanism_number(name: str) -> int:
    """SCRAM-SHA-256 -> 1; raises ValueError naming the ones there are."""
    number = BY_NAME.get(name.upper())
    if number is None:
        raise ValueError(f"SASL mechanism {name!r}: choose from {', '.join(BY_NAME)}")
    return number


def _hash(mechanism: int) -> str:
    return MECHANISMS[mechanism][1]


def salted_password(password: str, salt: bytes, iterations: int, mechanism: int) -> bytes:
    """Hi(Normalize(password), salt, i) of RFC 5802 (PBKDF2 with HMAC; passwords are
    taken as UTF-8 without SASLprep, as Kafka's clients send them)."""
    return hashlib.pbkdf2_hmac(_hash(mechanism), password.encode(), salt, iterations)


@dataclass(frozen=True)
class ScramCredential:
    """What a server stores for one user and mechanism."""

    mechanism: int
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_salted_password(
        cls, mechanism: int, iterations: int, salt: bytes, salted: bytes
    ) -> ScramCredential:
        name = _hash(mechanism)
        client_key = hmac.digest(salted, b"Client Key", name)
        return cls(
            mechanism=mechanism,
            iterations=iterations,
            salt=salt,
            stored_key=hashlib.new(name, client_key).digest(),
            server_key=hmac.digest(salted, b"Server Key", name),
        )

    def matches(self, password: str) -> bool:
        """Whether `password` is this credential's (SASL/PLAIN checks it so)."""
        salted = salted_password(password, self.salt, self.iterations, self.mechanism)
        other = ScramCredential.from_salted_password(
            self.mechanism, self.iterations, self.salt, salted
        )
        return hmac.compare_digest(other.stored_key, self.stored_key)


def new_upsertion(
    password: str, mechanism: int, iterations: int = DEFAULT_ITERATIONS
) -> tuple[bytes, bytes]:
    """(salt, salted password) for an AlterUserScramCredentials upsertion: what a
    client sends instead of the password, as Kafka's admin client does."""
    salt = os.urandom(SALT_BYTES)
    return salt, salted_password(password, salt, iterations, mechanism)


def credential_problem(
    name: str, mechanism: int, iterations: int, salt: bytes, salted: bytes
) -> str | None:
    """Why an upsertion cannot be stored (None: it can)."""
    if not name:
        return "the user name is empty"
    if mechanism not in MECHANISMS:
        known = ", ".join(f"{n} ({k})" for k, (n, _) in MECHANISMS.items())
        return f"mechanism {mechanism} is not one of {known}"
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        return f"iterations {iterations} are outside {MIN_ITERATIONS}..{MAX_ITERATIONS}"
    if not salt:
        return "the salt is empty"
    if len(salted) != hashlib.new(_hash(mechanism)).digest_size:
        return (
            f"the salted password is {len(salted)} bytes, not a {MECHANISMS[mechanism][0]} digest"
        )
    return None
