"""TLS for every connection, in and out (issue 18, Kafka's SSL security protocol), with
the standard library's `ssl`: the one place where contexts are made, so the rules hold
everywhere (TLS 1.2 or later only; peers' certificates checked against the CA file;
host names checked by clients).

- A listener whose security protocol is SSL wraps each accepted connection in TLS
  before it reads a request (runtime/server.py). `client_auth` is Kafka's
  ssl.client.auth: "none" (no client certificate asked), "requested" (checked when
  sent) or "required" (mutual TLS: a client without a certificate the CA signed is
  refused in the handshake). The principal of a connection with a client certificate
  is `User:` and the certificate's subject as a distinguished name (Kafka's default
  principal builder), else User:ANONYMOUS.
- Clients (the client library, brokers to brokers and to the controllers, controllers
  to each other) verify the server's certificate against `cafile` (the system's CAs
  without one) and its host name, and present `certfile`/`keyfile` when given.

The server side is sans-I/O (`ServerTls`, over ssl.MemoryBIO): the listener feeds it
the bytes it reads and sends what it gives back, so every byte a client sends goes
through TLS from the first one (uvloop starts reading a new connection whatever its
protocol asked in connection_made, which loop.start_tls cannot follow), and a
handshake that fails (a plaintext client on a TLS port, an unknown CA, an expired or
wrong-host certificate) closes that connection with one log line saying why
(`handshake_failure`).
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
# What a listener may be, a broker's or a controller's (Kafka's security protocols).
LISTENER_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)


def uses_tls(protocol: str) -> bool:
    return protocol in (SSL, SASL_SSL)


def uses_sasl(protocol: str) -> bool:
    return protocol in (SASL_PLAINTEXT, SASL_SSL)


CLIENT_AUTH = ("NONE", "REQUESTED", "REQUIRED")  # ssl.client.auth, any case
ANONYMOUS = "User:ANONYMOUS"
HANDSHAKE_TIMEOUT_S = 10.0
_SHORT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
}
# OpenSSL's reasons for a peer that does not speak TLS at all.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNEXPECTED_MESSAGE", "RECORD_LAYER_FAILURE")


class TlsConfigError(ValueError):
    """A TLS file or setting cannot be used; the message says which and what to do."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: this process's certificate chain and key, and the CAs it trusts."""

    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None


def _new_context(purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _load_chain(context: ssl.SSLContext, files: TlsFiles, what: str) -> None:
    if files.certfile is None:
        return
    try:
        context.load_cert_chain(files.certfile, files.keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot load {what} certificate {files.certfile} with key "
            f"{files.keyfile or files.certfile}: {exc}; give a PEM certificate chain and its "
            "unencrypted private key"
        ) from None


def _load_cas(context: ssl.SSLContext, cafile: Path) -> None:
    try:
        context.load_verify_locations(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot load the CA file {cafile}: {exc}; give the PEM certificates of the CAs "
            "to trust"
        ) from None


def server_context(files: TlsFiles, client_auth: str = "NONE") -> ssl.SSLContext:
    """The context of a TLS listener. Raises TlsConfigError."""
    client_auth = client_auth.upper()
    if client_auth not in CLIENT_AUTH:
        raise TlsConfigError(f"client auth {client_auth!r}: choose from {', '.join(CLIENT_AUTH)}")
    if files.certfile is None:
        raise TlsConfigError(
            "an SSL listener needs --ssl-certfile (and --ssl-keyfile unless the key is in it)"
        )
    context = _new_context(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(context, files, "the server")
    if client_auth != "NONE":
        if files.cafile is None:
            raise TlsConfigError(
                f"--ssl-client-auth {client_auth.lower()} needs --ssl-cafile: the CAs whose client "
                "certificates are accepted"
            )
        _load_cas(context, files.cafile)
        context.verify_mode = ssl.CERT_REQUIRED if client_auth == "REQUIRED" else ssl.CERT_OPTIONAL
    return context


def client_context(files: TlsFiles, *, check_hostname: bool = True) -> ssl.SSLContext:
    """The context of a TLS client connection. Raises TlsConfigError."""
    context = _new_context(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = check_hostname
    if files.cafile is not None:
        _load_cas(context, files.cafile)
    else:
        context.load_default_certs()
    _load_chain(context, files, "the client")
    return context


def principal_of(certificate: dict[str, Any] | None) -> str:
    """`User:<subject DN>` of the peer's certificate, else User:ANONYMOUS."""
    if not certificate:
        return ANONYMOUS
    # Kafka's default principal: the RFC 2253 form, most specific part first.
    names = [
        f"{_SHORT_NAMES.get(key, key)}={value}"
        for rdn in reversed(certificate.get("subject", ()))
        for key, value in rdn
    ]
    return "User:" + ",".join(names) if names else ANONYMOUS


def handshake_failure(exc: BaseException) -> str:
    """Why a server-side handshake failed, for its one log line."""
    reason = getattr(exc, "reason", None) or type(exc).__name__
    text = str(exc) or reason
    if reason in _NOT_TLS:
        return f"{text}: a plaintext client on this TLS listener? it must use SSL"
    if reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED"):
        return f"{text}: the client's certificate is missing or not signed by --ssl-cafile"
    if isinstance(exc, TimeoutError):
        return str(exc) or "no TLS handshake in time"
    return text


class ServerTls:
    """One server-side TLS session, bytes in and bytes out (no socket). `receive`
    takes what the peer sent and returns the plaintext it carried, as the chunks TLS
    decrypted (none until the handshake is done, or when a record is incomplete): not
    joined, so a large request frame is copied once, by the frame decoder, not twice;
    `send` takes plaintext to encrypt; after either, `outgoing()` is what must go to
    the peer. Raises ssl.SSLError when the peer does not speak TLS or fails the
    handshake."""

    # At most a TLS record's plaintext comes out of one read (16 KiB); a larger
    # chunk costs nothing (measured: bench/README.md, "Issue 18").
    READ_CHUNK = 256 * 1024

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._session = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False
        self.closed_by_peer = False  # the peer sent close_notify

    def receive(self, data: bytes) -> list[bytes]:
        self._incoming.write(data)
        if not self.established:
            try:
                self._session.do_handshake()
            except ssl.SSLWantReadError:
                return []
            self.established = True
        chunks: list[bytes] = []
        while True:
            try:
                chunk = self._session.read(self.READ_CHUNK)
            except ssl.SSLWantReadError:
                break  # a record not yet complete
            except ssl.SSLZeroReturnError:
                chunk = b""
            if not chunk:
                # The peer's close_notify (a memory-BIO read gives b"" for it): answer
                # with ours, which clients wait for before they close.
                self.closed_by_peer = True
                with contextlib.suppress(ssl.SSLError):
                    self._session.unwrap()
                break
            chunks.append(chunk)
        return chunks

    def send(self, data: Any) -> None:
        assert self.established, "TLS: nothing is sent before the handshake is done"
        self._session.write(data)

    def outgoing(self) -> bytes:
        return self._outgoing.read()

    def peer_certificate(self) -> dict[str, Any] | None:
        return self._session.getpeercert() or None
