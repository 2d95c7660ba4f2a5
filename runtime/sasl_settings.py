"""The SASL settings both servers have, declared once (Kafka's names where Kafka has
the setting), and the one place a server's own password is read.

A password never comes from the command line (argv is visible to every user of the
machine, and lands in shell histories): it is read from a file named by a setting, or
from an environment variable, and it is never logged (SaslCredentials hides it from
its repr). Brokers authenticate as `--sasl-server-username` to the other brokers'
inter-broker listener and to the controllers; the controller writes the bootstrap
user (`--sasl-bootstrap-username`) of a new cluster from its own password file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runtime.sasl import SASL_MECHANISMS
from runtime.sasl import SaslCredentials
from runtime.settings import ConfigError
from runtime.settings import setting

# The environment variables a password may come from instead of its file.
SERVER_PASSWORD_ENV = "MINIBROKER_SASL_SERVER_PASSWORD"
BOOTSTRAP_PASSWORD_ENV = "MINIBROKER_SASL_BOOTSTRAP_PASSWORD"
MAX_PASSWORD_BYTES = 1024  # a password file larger than this is not a password file


def parse_sasl_mechanisms(
    value: str, *, option: str = "--sasl-enabled-mechanisms"
) -> tuple[str, ...]:
    """`SCRAM-SHA-256,PLAIN` (any case), each one of SASL_MECHANISMS."""
    names = tuple(dict.fromkeys(m.strip().upper() for m in value.split(",") if m.strip()))
    if not names:
        raise ConfigError(f"{option}: name at least one of {', '.join(SASL_MECHANISMS)}")
    unknown = [n for n in names if n not in SASL_MECHANISMS]
    if unknown:
        raise ConfigError(f"{option}: {', '.join(unknown)} not among {', '.join(SASL_MECHANISMS)}")
    return names


def sasl_enabled_mechanisms_setting(listeners: str) -> Any:
    """`listeners`: which of the server's listeners offer them, in its words."""
    return setting(
        "SCRAM-SHA-256,SCRAM-SHA-512",
        parse=parse_sasl_mechanisms,
        doc=f"What {listeners} offer: SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN (the password "
        "travels: only with SASL_SSL), checked against the users' SCRAM credentials "
        "(sasl.enabled.mechanisms).",
    )


def sasl_mechanism_setting(toward: str, kafka_name: str) -> Any:
    """The mechanism a broker authenticates with toward `toward`."""
    return setting(
        "SCRAM-SHA-512",
        choices=SASL_MECHANISMS,
        doc=f"The SASL mechanism this broker authenticates with to {toward}, when they "
        f"listen with SASL_PLAINTEXT or SASL_SSL ({kafka_name}).",
    )


def username_setting(doc: str) -> Any:
    return setting(None, kind="text", shown_default="none", doc=doc)


def password_file_setting(whose: str, env: str) -> Any:
    return setting(
        None,
        kind="file",
        shown_default=f"${env}",
        doc=f"A file holding the password of {whose} (its first line; keep it readable by "
        f"this server's user only), else the environment variable {env}. Never on the "
        "command line.",
    )


def read_password(path: Path | None, env: str, *, option: str) -> str:
    """The password in `path` (its first line), else in $`env`. Raises ConfigError
    saying where to put it; the message never holds the password."""
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_PASSWORD_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{option} {path}: cannot read it: {exc.strerror or exc}") from None
        if len(data) > MAX_PASSWORD_BYTES:
            raise ConfigError(f"{option} {path}: over {MAX_PASSWORD_BYTES} bytes, not a password")
        try:
            lines = data.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise ConfigError(f"{option} {path}: not UTF-8 text") from None
        password = lines[0] if lines else ""
        if not password:
            raise ConfigError(f"{option} {path}: the first line is empty; write the password there")
        return password
    password = os.environ.get(env, "")
    if not password:
        raise ConfigError(f"no password: give {option} FILE, or set the environment variable {env}")
    return password


def server_credentials(
    username: str | None, password_file: Path | None, mechanism: str
) -> SaslCredentials:
    """This server's own user, for its outgoing SASL connections. Raises ConfigError."""
    if not username:
        raise ConfigError(
            "a SASL connection to another server needs --sasl-server-username (the user this "
            "server authenticates as; create it with `minibroker user create` or with the "
            "controller's --sasl-bootstrap-username)"
        )
    password = read_password(
        password_file, SERVER_PASSWORD_ENV, option="--sasl-server-password-file"
    )
    return SaslCredentials(mechanism, username, password)
