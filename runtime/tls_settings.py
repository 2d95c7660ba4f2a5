"""The TLS settings both servers have, declared once (Kafka's names, ssl.* and
security.protocol), and what turns them into contexts (runtime/tls.py)."""

from __future__ import annotations

import ssl
from functools import lru_cache
from pathlib import Path
from typing import Any
from typing import Protocol

from runtime.settings import setting
from runtime.tls import CLIENT_AUTH
from runtime.tls import LISTENER_PROTOCOLS
from runtime.tls import TlsFiles
from runtime.tls import client_context
from runtime.tls import server_context
from runtime.tls import uses_tls


def ssl_certfile_setting() -> Any:
    return setting(
        None,
        kind="file",
        shown_default="none",
        doc="This server's certificate chain, PEM: served on SSL listeners, and shown to "
        "the servers it connects to over SSL when they ask for a client certificate "
        "(ssl.keystore.location).",
    )


def ssl_keyfile_setting() -> Any:
    return setting(
        None,
        kind="file",
        shown_default="the key in --ssl-certfile",
        doc="The private key of --ssl-certfile, PEM, unencrypted (ssl.key.password).",
    )


def ssl_cafile_setting() -> Any:
    return setting(
        None,
        kind="file",
        shown_default="the system's CAs",
        doc="The CAs this server trusts, PEM: for client certificates, and for the "
        "certificates of the servers it connects to over SSL (ssl.truststore.location).",
    )


def ssl_client_auth_setting() -> Any:
    return setting(
        "NONE",
        choices=CLIENT_AUTH,
        doc="Client certificates on SSL listeners: none, requested (checked when sent) or "
        "required (mutual TLS; the certificate's subject is the principal) "
        "(ssl.client.auth).",
    )


def security_protocol_setting(doc: str) -> Any:
    return setting("PLAINTEXT", choices=LISTENER_PROTOCOLS, doc=doc)


class TlsSettings(Protocol):
    @property
    def ssl_certfile(self) -> Path | None: ...
    @property
    def ssl_keyfile(self) -> Path | None: ...
    @property
    def ssl_cafile(self) -> Path | None: ...
    @property
    def ssl_client_auth(self) -> str: ...


def tls_files(config: TlsSettings) -> TlsFiles:
    return TlsFiles(config.ssl_certfile, config.ssl_keyfile, config.ssl_cafile)


def ssl_problems(config: TlsSettings, *, uses_ssl: bool) -> list[str]:
    """What keeps the TLS settings from working, found at start-up (empty: fine)."""
    out = []
    if uses_ssl and config.ssl_certfile is None:
        out.append(
            "an SSL listener needs --ssl-certfile (its certificate chain, PEM) and "
            "--ssl-keyfile (its key, unless in the same file)"
        )
    if config.ssl_client_auth.upper() != "NONE" and config.ssl_cafile is None:
        out.append(
            f"--ssl-client-auth {config.ssl_client_auth.lower()} needs --ssl-cafile: the CAs whose "
            "client certificates are accepted"
        )
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_cafile"):
        path = getattr(config, name)
        if path is not None and not Path(path).is_file():
            out.append(f"--{name.replace('_', '-')} {path}: no such file")
    return out


# One context per set of files and purpose, made once per process (each connection
# would otherwise read the files again).
@lru_cache(maxsize=8)
def _client_context(files: TlsFiles) -> ssl.SSLContext:
    return client_context(files)


@lru_cache(maxsize=8)
def _server_context(files: TlsFiles, client_auth: str) -> ssl.SSLContext:
    return server_context(files, client_auth)


def outgoing_tls(config: TlsSettings, protocol: str) -> ssl.SSLContext | None:
    """The context for connections to servers that listen with `protocol` (None:
    plaintext). Raises TlsConfigError when a file cannot be used."""
    return _client_context(tls_files(config)) if uses_tls(protocol) else None


def listener_tls(config: TlsSettings, protocol: str) -> ssl.SSLContext | None:
    """The context of a listener with `protocol` (None: plaintext). Raises
    TlsConfigError when a file cannot be used."""
    if not uses_tls(protocol):
        return None
    return _server_context(tls_files(config), config.ssl_client_auth.upper())
