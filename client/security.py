"""How the client library secures its connections (issue 18): Kafka's
`security_protocol` (PLAINTEXT or SSL) and, as aiokafka takes it, an `ssl_context`
(`create_ssl_context` makes one from PEM files, with the rules every minibroker
connection has: TLS 1.2 or later, the server's certificate checked against the CA
file and its host name)."""

from __future__ import annotations

import ssl
from pathlib import Path

from runtime.tls import PLAINTEXT
from runtime.tls import SECURITY_PROTOCOLS
from runtime.tls import SSL
from runtime.tls import TlsFiles
from runtime.tls import client_context


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
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(
            f"security_protocol {security_protocol!r}: choose from {', '.join(SECURITY_PROTOCOLS)}"
        )
    if protocol == PLAINTEXT:
        if ssl_context is not None:
            raise ValueError("ssl_context given with security_protocol PLAINTEXT: use 'SSL'")
        return None
    assert protocol == SSL
    return ssl_context if ssl_context is not None else create_ssl_context()
