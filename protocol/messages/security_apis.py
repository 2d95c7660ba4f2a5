"""Security APIs (issue 18): SCRAM credentials (Kafka's DescribeUserScramCredentials
and AlterUserScramCredentials, KIP-554). As in Kafka, a client never sends a password:
an upsertion carries the salt, the iteration count and the salted password (PBKDF2),
from which the controller derives what it stores (runtime/scram.py); an answer never
carries more than a user's mechanisms and iteration counts."""

from __future__ import annotations

from protocol.messages.client_apis import Message

__all__ = [
    "AlterUserScramCredentialsRequest",
    "AlterUserScramCredentialsResponse",
    "AlterUserScramCredentialsResult",
    "CredentialInfo",
    "DescribeUserScramCredentialsRequest",
    "DescribeUserScramCredentialsResponse",
    "DescribeUserScramCredentialsResult",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "ScramCredentialDeletion",
    "ScramCredentialUpsertion",
]


class SaslHandshakeRequest(Message, kw_only=True):
    """The mechanism the client wants (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)."""

    mechanism: str


class SaslHandshakeResponse(Message, kw_only=True):
    error_code: int = 0
    mechanisms: list[str] = []  # what this listener offers


class SaslAuthenticateRequest(Message, kw_only=True):
    """One SASL token of the exchange (Kafka's SaslAuthenticate, KIP-152)."""

    auth_bytes: bytes


class SaslAuthenticateResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0  # 0: no re-authentication (KIP-368 not used)


class ScramCredentialDeletion(Message, kw_only=True):
    name: str
    mechanism: int  # 1: SCRAM-SHA-256, 2: SCRAM-SHA-512 (Kafka's ScramMechanism)


class ScramCredentialUpsertion(Message, kw_only=True):
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


class AlterUserScramCredentialsRequest(Message, kw_only=True):
    deletions: list[ScramCredentialDeletion] = []
    upsertions: list[ScramCredentialUpsertion] = []


class AlterUserScramCredentialsResult(Message, kw_only=True):
    user: str
    error_code: int = 0
    error_message: str | None = None


class AlterUserScramCredentialsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    results: list[AlterUserScramCredentialsResult] = []


class DescribeUserScramCredentialsRequest(Message, kw_only=True):
    users: list[str] | None = None  # None: every user


class CredentialInfo(Message, kw_only=True):
    mechanism: int
    iterations: int


class DescribeUserScramCredentialsResult(Message, kw_only=True):
    user: str
    error_code: int = 0
    error_message: str | None = None
    credential_infos: list[CredentialInfo] = []


class DescribeUserScramCredentialsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    results: list[DescribeUserScramCredentialsResult] = []
