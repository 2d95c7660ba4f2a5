"""The files and the admin user of a secure cluster (issue 18): SASL_SSL with SCRAM on
every listener and between the servers, the authorizer on. `minibroker dev --secure`
uses it on one machine; docker-compose.secure.yml runs it as a one-shot service
(`python -m client.secure_setup files|admin ...`).

Layout of the directory::

    ca.pem, ca-key.pem          a throwaway CA (client/throwaway_ca.py); clients trust ca.pem
    <server>.pem, -key.pem      each server's certificate (CN=<server>) for its host names
    server.password             the servers' own SCRAM user's password (SERVER_USER)
    admin.password             the admin user's (ADMIN_USER), for the operator's clients

Keys and passwords are files of mode 0600. Everything is reused when present and still
good (a certificate signed by this CA, valid for at least another day, naming the hosts
asked for); what is missing or stale is made anew, and each change is said. Not a way to
run a CA: anyone who can read the directory can mint certificates the servers trust.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import secrets
import shlex
import stat
import sys
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from client.admin import AsyncAdmin
from client.errors import MinibrokerError
from client.errors import ResourceNotFoundError
from client.security import create_ssl_context
from client.throwaway_ca import ThrowawayCA
from runtime.sasl import SASL_MECHANISMS

# The user every server authenticates as toward the other servers (the controllers'
# bootstrap user), and the operator's.
SERVER_USER = "minibroker-server"
ADMIN_USER = "admin"
# What the printed client settings use: every client's default. The admin has
# credentials for both SCRAM mechanisms, so SCRAM-SHA-512 works too.
CLIENT_MECHANISM = "SCRAM-SHA-256"
SCRAM_MECHANISMS = tuple(m for m in SASL_MECHANISMS if m.startswith("SCRAM-"))
# A certificate that expires sooner than this is made anew at start.
RENEW_BEFORE = datetime.timedelta(days=1)
PASSWORD_BYTES = 24  # of randomness: 32 URL-safe characters


class SecureSetupError(Exception):
    """A file of the directory cannot be used; the message says which and what to do."""


@dataclass(frozen=True)
class SecureFiles:
    directory: Path

    @property
    def cafile(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_password_file(self) -> Path:
        return self.directory / "server.password"

    @property
    def admin_password_file(self) -> Path:
        return self.directory / "admin.password"

    def certfile(self, server: str) -> Path:
        return self.directory / f"{server}.pem"

    def keyfile(self, server: str) -> Path:
        return self.directory / f"{server}-key.pem"

    def tls_flags(self, server: str) -> list[str]:
        """A server's --ssl-* flags."""
        return [
            *("--ssl-certfile", str(self.certfile(server))),
            *("--ssl-keyfile", str(self.keyfile(server))),
            *("--ssl-cafile", str(self.cafile)),
        ]

    def client_settings(self, user: str = ADMIN_USER) -> dict[str, Any]:
        """minibroker's client library settings (AsyncProducer, AsyncAdmin, ...) as `user`."""
        password_file = (
            self.server_password_file if user == SERVER_USER else (self.admin_password_file)
        )
        return {
            "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=self.cafile),
            "sasl_mechanism": CLIENT_MECHANISM,
            "sasl_plain_username": user,
            "sasl_plain_password": read_password(password_file),
        }


def super_users(controllers: Sequence[str]) -> str:
    """--super-users of every server: the servers' user, the admin, and the controllers'
    certificates (the quorum's voters know each other by certificate, not SASL)."""
    principals = [f"User:{SERVER_USER}", f"User:{ADMIN_USER}"]
    principals += [f"User:CN={name}" for name in controllers]
    return ";".join(principals)


# ------------------------------------------------------------------ the files


def read_password(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecureSetupError(f"cannot read the password in {path}: {exc}") from None
    if not lines or not lines[0]:
        raise SecureSetupError(
            f"{path}: the first line is empty; delete the file to make a new one"
        )
    return lines[0]


def _keep_private(path: Path, say: Callable[[str], None]) -> None:
    """Keys and passwords are the owner's alone: tighten a file others may read."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(0o600)
        say(f"{path} was readable by others (mode {mode:o}): now 0600")


def _password_file(path: Path, say: Callable[[str], None]) -> bool:
    """Make `path` with a new random password unless it exists. True when made."""
    if path.exists():
        _keep_private(path, say)
        read_password(path)  # a clear error now, not a server's at start
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(PASSWORD_BYTES) + "\n")
    return True


def _san_names(hosts: Sequence[str]) -> set[str]:
    out = set()
    for host in hosts:
        try:
            out.add(str(ipaddress.ip_address(host)))
        except ValueError:
            out.add(host.lower())
    return out


def _stale(files: SecureFiles, ca: ThrowawayCA, server: str, hosts: Sequence[str]) -> str | None:
    """Why the server's certificate must be made anew (None: it is good)."""
    try:
        cert = x509.load_pem_x509_certificate(files.certfile(server).read_bytes())
        key = serialization.load_pem_private_key(files.keyfile(server).read_bytes(), None)
    except FileNotFoundError:
        return "missing"
    except ValueError:
        return "not a PEM certificate and key"
    if key.public_key() != cert.public_key():
        return "its key does not match"
    try:
        cert.verify_directly_issued_by(ca.certificate)
    except (ValueError, TypeError, InvalidSignature):
        return "not signed by this CA"
    if cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) < RENEW_BEFORE:
        return "expires within a day"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "names no host"
    named = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    named |= {name.lower() for name in san.get_values_for_type(x509.DNSName)}
    if not _san_names(hosts) <= named:
        return f"does not name {', '.join(sorted(_san_names(hosts) - named))}"
    return None


def _the_ca(files: SecureFiles, say: Callable[[str], None]) -> ThrowawayCA:
    try:
        ca = ThrowawayCA.load(files.directory)
    except ValueError as exc:
        raise SecureSetupError(
            f"{files.directory}: the CA's files are damaged ({exc}); delete ca.pem and "
            "ca-key.pem to make a new CA"
        ) from None
    if ca is not None:
        left = ca.certificate.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
        if left >= RENEW_BEFORE:
            return ca
        say(
            f"the CA in {files.directory} expires within a day: made a new one (clients "
            f"need the new {files.cafile})"
        )
    return ThrowawayCA.create(files.directory)


def prepare(
    directory: Path, servers: Mapping[str, Sequence[str]], say: Callable[[str], None]
) -> tuple[SecureFiles, bool]:
    """The CA, a certificate per server (name -> the host names it is reached by), the
    servers' and the admin's passwords, in `directory`: made, or reused when good.
    Returns the files and whether the admin's password was made now (the admin user
    must then be given it). Raises SecureSetupError."""
    files = SecureFiles(directory.absolute())
    existed = files.cafile.exists()
    if existed and not files.server_password_file.exists():
        # The controllers wrote the servers' user with the lost password and keep it:
        # a new one would lock every broker out.
        raise SecureSetupError(
            f"{files.server_password_file} is missing, but {files.directory} was set up "
            "before: the cluster's servers' user has the lost password. Restore the file, "
            "or start a new cluster in another data directory"
        )
    files.directory.mkdir(parents=True, exist_ok=True)
    files.directory.chmod(0o700)
    ca = _the_ca(files, say)
    _keep_private(files.directory / "ca-key.pem", say)
    for server, hosts in servers.items():
        why = _stale(files, ca, server, hosts)
        if why is not None:
            if why != "missing":
                say(f"certificate {files.certfile(server)} {why}: made a new one")
            ca.issue(server, hosts=list(hosts))
        _keep_private(files.keyfile(server), say)
    _password_file(files.server_password_file, say)
    admin_is_new = _password_file(files.admin_password_file, say)
    return files, admin_is_new


# ------------------------------------------------------------------ the admin user


async def ensure_admin(
    bootstrap: str, files: SecureFiles, *, new_password: bool, timeout_s: float = 60.0
) -> str:
    """Give the admin user the password of its file (both SCRAM mechanisms), asking as
    the servers' user (a super user): when the file is new or the user does not exist.
    A user that exists keeps its credentials (an operator may have changed them).
    Retries until `timeout_s` (the brokers may still be starting). Returns what it did."""
    deadline = time.monotonic() + timeout_s
    password = read_password(files.admin_password_file)
    while True:
        try:
            async with AsyncAdmin(
                bootstrap, request_timeout_ms=10_000, **files.client_settings(SERVER_USER)
            ) as admin:
                if not new_password:
                    try:
                        await admin.describe_users([ADMIN_USER])
                        return f"user {ADMIN_USER} exists"
                    except ResourceNotFoundError:
                        pass
                for mechanism in SCRAM_MECHANISMS:
                    await admin.create_user(ADMIN_USER, password, mechanism=mechanism)
                return f"user {ADMIN_USER} created"
        except (MinibrokerError, OSError) as exc:
            if time.monotonic() > deadline:
                raise SecureSetupError(
                    f"could not create user {ADMIN_USER} through {bootstrap} within "
                    f"{timeout_s:.0f} s: {exc}"
                ) from None
            await asyncio.sleep(1.0)


# ------------------------------------------------------------------ what clients need


def client_settings_lines(files: SecureFiles, bootstrap: str, kafka_bootstrap: str) -> list[str]:
    """What `minibroker dev --secure` prints: the settings, then ready-to-paste lines for
    minibroker's CLI, kafka-python, confluent-kafka and kcat. The password is read from
    its file by each line, never printed."""
    ca, pw = str(files.cafile), str(files.admin_password_file)
    read_pw = f"open({pw!r}).read().strip()"
    cli_env = {
        "MINIBROKER_BOOTSTRAP_SERVERS": bootstrap,
        "MINIBROKER_CLIENT_SECURITY_PROTOCOL": "SASL_SSL",
        "MINIBROKER_CLIENT_SASL_MECHANISM": CLIENT_MECHANISM,
        "MINIBROKER_CLIENT_SASL_USERNAME": ADMIN_USER,
        "MINIBROKER_CLIENT_SSL_CAFILE": ca,
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in cli_env.items())
    confluent = {
        "bootstrap.servers": kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": CLIENT_MECHANISM,
        "sasl.username": ADMIN_USER,
    }
    confluent_text = ", ".join(f"{k!r}: {v!r}" for k, v in confluent.items())
    return [
        "security protocol: SASL_SSL (every listener; TLS and SCRAM between the servers too)",
        f"sasl mechanism: {CLIENT_MECHANISM} (or {SCRAM_MECHANISMS[-1]})",
        f"user: {ADMIN_USER} (a super user; ACLs are on for every other user)",
        f"password file: {pw}",
        f"ca file: {ca}",
        "minibroker CLI (bash):",
        f'  export {exports} MINIBROKER_CLIENT_SASL_PASSWORD="$(cat {shlex.quote(pw)})"',
        "kafka-python:",
        f"  KafkaProducer(bootstrap_servers={kafka_bootstrap!r}, security_protocol='SASL_SSL', "
        f"sasl_mechanism={CLIENT_MECHANISM!r}, sasl_plain_username={ADMIN_USER!r}, "
        f"sasl_plain_password={read_pw}, ssl_cafile={ca!r})",
        "confluent-kafka:",
        f"  Producer({{{confluent_text}, 'sasl.password': {read_pw}, 'ssl.ca.location': {ca!r}}})",
        "kcat:",
        f"  kcat -b {shlex.quote(kafka_bootstrap)} -X security.protocol=SASL_SSL "
        f"-X sasl.mechanisms={CLIENT_MECHANISM} -X sasl.username={ADMIN_USER} "
        f'-X sasl.password="$(cat {shlex.quote(pw)})" -X ssl.ca.location={shlex.quote(ca)} -L',
    ]


# ------------------------------------------------------------------ the compose service


def _parse_server(value: str) -> tuple[str, list[str]]:
    name, sep, hosts = value.partition("=")
    if not sep or not name or not hosts:
        raise click.BadParameter(
            f"{value!r}: give NAME=HOST[,HOST...], e.g. broker-1=broker-1,localhost"
        )
    return name, [h for h in hosts.split(",") if h]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A secure cluster's certificates, passwords and admin user (the secure compose
    file's one-shot services run these)."""


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--server",
    "servers",
    multiple=True,
    required=True,
    help="NAME=HOST[,HOST...]: a certificate CN=NAME for those host names (repeat).",
)
def files(directory: Path, servers: tuple[str, ...]) -> None:
    """Make (or reuse) the CA, the servers' certificates and the passwords in DIRECTORY."""
    try:
        made, _ = prepare(directory, dict(_parse_server(s) for s in servers), say=click.echo)
    except SecureSetupError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"secure files ready in {made.directory}")


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--bootstrap", required=True, help="Brokers HOST:PORT[,...] (a SASL_SSL listener).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to retry.")
def admin(directory: Path, bootstrap: str, timeout: float) -> None:
    """Create the admin user with the password in DIRECTORY/admin.password, unless it exists."""
    try:
        did = asyncio.run(
            ensure_admin(
                bootstrap, SecureFiles(directory.absolute()), new_password=False, timeout_s=timeout
            )
        )
    except SecureSetupError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(did)


if __name__ == "__main__":
    main(prog_name=f"{Path(sys.executable).name} -m client.secure_setup")
