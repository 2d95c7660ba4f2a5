"""The server side of SASL (issue 18; Kafka's SaslHandshake + SaslAuthenticate,
KIP-43/KIP-152), sans-I/O: one `SaslSession` per connection of a SASL listener is fed
the two requests and answers them; the connection reads nothing else until
`authenticated` names the user. After a SaslHandshake v0 (Kafka listener) the tokens
come as raw frames instead of SaslAuthenticate requests: `authenticate` takes them alike
and the server sends `auth_bytes` back raw (runtime/server.py).

Mechanisms: SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802 / RFC 7677: the server checks
the client's proof against the StoredKey it keeps and proves itself with the
ServerKey; the password never travels), and PLAIN (RFC 4616: the password travels, so
only on SASL_SSL in earnest; checked against the user's SCRAM credential, as Redpanda
does). Credentials come from `lookup(user, mechanism number)`: the metadata image's.

A failure answers SASL_AUTHENTICATION_FAILED with the same message whether the user is
unknown or the password wrong, and `failed` is set: the connection then closes (Kafka
closes it too). An unknown user still gets a SCRAM first answer (a made-up salt), so
the exchange does not tell which users exist: its salt is the same at every attempt
and its iteration count the default, as a real user's are. PLAIN hashes the password
of an unknown user as of a real one, so the time of its answer does not tell either.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field

from protocol.errors import ErrorCode
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeResponse
from protocol.metadata_records import ScramCredentialRecord
from runtime.scram import BY_NAME
from runtime.scram import DEFAULT_ITERATIONS
from runtime.scram import MAX_ITERATIONS
from runtime.scram import MECHANISMS
from runtime.scram import MIN_ITERATIONS
from runtime.scram import SALT_BYTES
from runtime.scram import ScramCredential
from runtime.scram import salted_password

PLAIN = "PLAIN"
SASL_MECHANISMS = (*BY_NAME, PLAIN)
MAX_TOKEN_BYTES = 4096  # a SASL token is a few hundred bytes; anything more is refused
# The longest frame a SASL listener reads from a connection that has not authenticated
# (Kafka's sasl.server.max.receive.size): what comes before is ApiVersions and the
# exchange, a few hundred bytes each, so a stranger cannot make the server buffer a
# 100 MiB request per connection.
MAX_UNAUTHENTICATED_FRAME_BYTES = 512 * 1024
FAILED = "authentication failed: wrong user name or password"
_FAKE_SALT_KEY = os.urandom(32)  # per process: made-up salts for users that do not exist

Lookup = Callable[[str, int], "ScramCredential | None"]


def image_lookup(
    credentials: Callable[[], Mapping[tuple[str, int], ScramCredentialRecord]],
) -> Lookup:
    """A Lookup into a metadata image's credentials (`credentials()`: the image's
    current table, a broker's or a controller's), read at each authentication."""

    def lookup(user: str, mechanism: int) -> ScramCredential | None:
        record = credentials().get((user, mechanism))
        if record is None:
            return None
        return ScramCredential(
            record.mechanism, record.iterations, record.salt, record.stored_key, record.server_key
        )

    return lookup


@dataclass(frozen=True)
class SaslCredentials:
    """The user an outgoing connection authenticates as (the client library's, and a
    server's own toward the other servers)."""

    mechanism: str  # SCRAM-SHA-256 | SCRAM-SHA-512 | PLAIN
    username: str
    password: str = field(repr=False)  # never in a repr, so never in a log line


class _Refused(Exception):
    pass


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise _Refused(f"malformed SCRAM message part {part!r}")
        out.setdefault(key, value)
    return out


def _sasl_name(value: str) -> str:
    # RFC 5802: "," and "=" in a user name travel as =2C and =3D.
    return value.replace("=2C", ",").replace("=3D", "=")


class SaslSession:
    def __init__(self, mechanisms: tuple[str, ...], lookup: Lookup) -> None:
        self.mechanisms = mechanisms
        self._lookup = lookup
        self.mechanism: str | None = None
        self.authenticated: str | None = None  # the user, once proven
        self.failed = False
        self._scram_step = 0
        self._user = ""
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2_header = ""

    # ------------------------------------------------------------------ requests

    def handshake(self, mechanism: str) -> SaslHandshakeResponse:
        offered = list(self.mechanisms)
        if self.mechanism is not None or self.authenticated is not None:
            self.failed = True
            return SaslHandshakeResponse(
                error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=offered
            )
        if mechanism.upper() not in self.mechanisms:
            self.failed = True
            return SaslHandshakeResponse(
                error_code=int(ErrorCode.UNSUPPORTED_SASL_MECHANISM), mechanisms=offered
            )
        self.mechanism = mechanism.upper()
        return SaslHandshakeResponse(mechanisms=offered)

    def authenticate(self, token: bytes) -> SaslAuthenticateResponse:
        if self.mechanism is None or self.authenticated is not None or self.failed:
            self.failed = True
            return SaslAuthenticateResponse(
                error_code=int(ErrorCode.ILLEGAL_SASL_STATE),
                error_message="SaslAuthenticate before a SaslHandshake, or after the end",
            )
        try:
            if len(token) > MAX_TOKEN_BYTES:
                raise _Refused(f"a SASL token of {len(token)} bytes (at most {MAX_TOKEN_BYTES})")
            if self.mechanism == PLAIN:
                return self._plain(bytes(token))
            return self._scram(bytes(token).decode("utf-8"))
        except (_Refused, UnicodeDecodeError, ValueError) as exc:
            self.failed = True
            message = FAILED if isinstance(exc, _Refused) and str(exc) == FAILED else str(exc)
            return SaslAuthenticateResponse(
                error_code=int(ErrorCode.SASL_AUTHENTICATION_FAILED),
                error_message=f"SASL {self.mechanism}: {message}",
            )

    # ------------------------------------------------------------------ PLAIN

    def _plain(self, token: bytes) -> SaslAuthenticateResponse:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise _Refused("a PLAIN token is authzid NUL user NUL password")
        authzid, user, password = (p.decode("utf-8") for p in parts)
        if authzid and authzid != user:
            raise _Refused("PLAIN: authorizing as another user is not supported")
        credentials = [self._lookup(user, m) for m in sorted(MECHANISMS)]
        credential = next((c for c in credentials if c is not None), None)
        if credential is None:
            # The check a real user's password gets (PBKDF2 at the default count), so
            # the time of the answer does not tell which users exist.
            salted_password(password, _fake_salt(user), DEFAULT_ITERATIONS, min(MECHANISMS))
            raise _Refused(FAILED)
        if not credential.matches(password):
            raise _Refused(FAILED)
        self.authenticated = user
        return SaslAuthenticateResponse()

    # ------------------------------------------------------------------ SCRAM

    def _scram(self, message: str) -> SaslAuthenticateResponse:
        mechanism = BY_NAME[self.mechanism or ""]
        digest = MECHANISMS[mechanism][1]
        if self._scram_step == 0:
            self._scram_step = 1
            gs2, sep, bare = _split_gs2(message)
            if not sep:
                raise _Refused("the SCRAM client-first message has no GS2 header")
            self._gs2_header = gs2
            attrs = _attributes(bare)
            if "n" not in attrs or "r" not in attrs or not attrs["r"]:
                raise _Refused("the SCRAM client-first message needs n= and r=")
            self._user = _sasl_name(attrs["n"])
            self._client_first_bare = bare
            self._credential = self._lookup(self._user, mechanism)
            if self._credential is not None:
                salt, iterations = self._credential.salt, self._credential.iterations
            else:
                # An unknown user looks like one with the default iterations and a salt
                # that stays the same from one attempt to the next, as a real one does.
                salt, iterations = _fake_salt(self._user), DEFAULT_ITERATIONS
            self._nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
            self._server_first = (
                f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
            )
            return SaslAuthenticateResponse(auth_bytes=self._server_first.encode())
        if self._scram_step == 1:
            self._scram_step = 2
            without_proof, sep, proof_part = message.rpartition(",p=")
            if not sep:
                raise _Refused("the SCRAM client-final message has no proof")
            attrs = _attributes(without_proof)
            expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
            # The nonce must end with ours, as Kafka's ScramSaslServer checks (not equal
            # it): librdkafka 2.0 (Debian's kcat) sends its own nonce before the whole
            # of ours. The proof covers the message as sent, so nothing is loosened.
            if attrs.get("c") != expected_binding or not attrs.get("r", "").endswith(self._nonce):
                raise _Refused(FAILED)
            credential = self._credential
            if credential is None:
                raise _Refused(FAILED)
            auth_message = ",".join(
                (self._client_first_bare, self._server_first, without_proof)
            ).encode()
            proof = base64.b64decode(proof_part, validate=True)
            signature = hmac.digest(credential.stored_key, auth_message, digest)
            if len(proof) != len(signature):
                raise _Refused(FAILED)
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if not hmac.compare_digest(
                hashlib.new(digest, client_key).digest(), credential.stored_key
            ):
                raise _Refused(FAILED)
            self.authenticated = self._user
            server_signature = hmac.digest(credential.server_key, auth_message, digest)
            final = "v=" + base64.b64encode(server_signature).decode()
            return SaslAuthenticateResponse(auth_bytes=final.encode())
        raise _Refused("SCRAM has two client messages")


def _fake_salt(user: str) -> bytes:
    """The salt a user that does not exist appears to have: the same at every attempt."""
    return hmac.digest(_FAKE_SALT_KEY, user.encode(), "sha256")[:SALT_BYTES]


def _split_gs2(message: str) -> tuple[str, str, str]:
    """("n,,", sep, bare) of a client-first message ("n,,n=user,r=nonce")."""
    first = message.find(",")
    second = message.find(",", first + 1) if first >= 0 else -1
    if first < 0 or second < 0 or message[0] not in "nyp":
        return "", "", message
    if message[0] == "p":
        raise _Refused("SCRAM channel binding (-PLUS) is not supported")
    return message[: second + 1], ",", message[second + 1 :]


class ScramClient:
    """The client side of a SCRAM exchange (runtime/rpc.py's connections, the tests):
    `first()`, then `final(server_first)`, then `verify(server_final)`."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.mechanism = BY_NAME[mechanism.upper()]
        self._digest = MECHANISMS[self.mechanism][1]
        self._user = user.replace("=", "=3D").replace(",", "=2C")
        self._password = password
        self._nonce = base64.b64encode(os.urandom(18)).decode()
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        return f"n,,n={self._user},r={self._nonce}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = bytes(server_first).decode()
        attrs = _attributes(text)
        if not attrs.get("r", "").startswith(self._nonce):
            raise ValueError("the server's SCRAM nonce does not extend ours")
        salt = base64.b64decode(attrs["s"])
        iterations = int(attrs["i"])
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            # Fewer make the proof we would send cheap to crack for whoever answered
            # (Kafka's client refuses them too); more would stall this event loop.
            raise ValueError(
                f"the server asks for {iterations} SCRAM iterations, outside "
                f"{MIN_ITERATIONS}..{MAX_ITERATIONS}: not a server of this cluster"
            )
        salted = hashlib.pbkdf2_hmac(self._digest, self._password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self._digest)
        stored_key = hashlib.new(self._digest, client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        self._auth_message = f"n={self._user},r={self._nonce},{text},{without_proof}".encode()
        signature = hmac.digest(stored_key, self._auth_message, self._digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = hmac.digest(salted, b"Server Key", self._digest)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Raises ValueError unless the server proved it knows the ServerKey."""
        expected = hmac.digest(self._server_key, self._auth_message, self._digest)
        if bytes(server_final).decode() != "v=" + base64.b64encode(expected).decode():
            raise ValueError("the server's SCRAM signature is wrong: not the real server")
