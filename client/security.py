"""How the client library secures its connections (issue 18): Kafka's
`security_protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL) and, as aiokafka takes
them, an `ssl_context` (`create_ssl_context` makes one from PEM files, with the rules
every minibroker connection has: TLS 1.2 or later, the server's certificate checked
against the CA file and its host name) and `sasl_mechanism` / `sasl_plain_username` /
`sasl_plain_password` (SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN: each connection
authenticates before its first request, client/connection.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

from runtime.sasl import SASL_MECHANISMS
from runtime.sasl import SaslCredentials
from runtime.tls import LISTENER_PROTOCOLS
from runtime.tls import TlsFiles
from runtime.tls import client_context
from runtime.tls import uses_sasl
from runtime.tls import uses_tls


def create_ssl_context(
    *,
    cafile: str | Path | None = None,
    certfile: str | Path | None = None,
    keyfile: str | Path | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context: trust `cafile` (the system's CAs without it), present
    `certfile`/`keyfile` to a server that asks (mutual TLS). Raises TlsConfigError."""

    def path(p: str | Path | None) -> Path | None:
        return None if p is None else Path(p)

    return client_context(
        TlsFiles(path(certfile), path(keyfile), path(cafile)), check_hostname=check_hostname
    )


def connection_tls(
    security_protocol: str, ssl_context: ssl.SSLContext | None
) -> ssl.SSLContext | None:
    """The context connections use (None: plaintext); checks the pair makes sense."""
    protocol = security_protocol.upper()
    if protocol not in LISTENER_PROTOCOLS:
        raise ValueError(
            f"security_protocol {security_protocol!r}: choose from {', '.join(LISTENER_PROTOCOLS)}"
        )
    if not uses_tls(protocol):
        if ssl_context is not None:
            raise ValueError(f"ssl_context given with security_protocol {protocol}: use *SSL")
        return None
    return ssl_context if ssl_context is not None else create_ssl_context()


def connection_sasl(
    security_protocol: str,
    mechanism: str | None,
    username: str | None,
    password: str | None,
) -> SaslCredentials | None:
    """The user connections authenticate as (None: no SASL); checks the settings agree."""
    if not uses_sasl(security_protocol.upper()):
        if mechanism or username or password:
            raise ValueError(
                f"SASL settings given with security_protocol {security_protocol}: use "
                "SASL_PLAINTEXT or SASL_SSL"
            )
        return None
    chosen = (mechanism or "").upper()
    if chosen not in SASL_MECHANISMS:
        raise ValueError(f"sasl_mechanism {mechanism!r}: choose from {', '.join(SASL_MECHANISMS)}")
    if not username or not password:
        raise ValueError(f"{security_protocol} needs sasl_plain_username and sasl_plain_password")
    return SaslCredentials(chosen, username, password)
