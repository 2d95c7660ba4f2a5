"""client/secure_setup.py's files (issue 18: `minibroker dev --secure`, the secure
compose file's `secure-setup` service), on real files with real certificates:

- a second run reuses every file byte for byte; keys and passwords are 0600, the
  directory 0700;
- a certificate that no longer fits (a host it does not name, expired, signed by
  another CA) is made anew, and said;
- a password file others may read is tightened, and said;
- a lost servers' password is refused (the cluster's servers' user keeps the old one);
- the printed CLI line sets the environment minibroker's CLI reads, paths with spaces
  and quotes included; the Python lines are valid expressions;
- `python -m client.secure_setup files` makes what a TLS server context loads.
"""

from __future__ import annotations

import ast
import datetime
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from client.secure_setup import ADMIN_USER
from client.secure_setup import SecureFiles
from client.secure_setup import SecureSetupError
from client.secure_setup import client_settings_lines
from client.secure_setup import prepare
from client.secure_setup import super_users
from client.throwaway_ca import ThrowawayCA

REPO = Path(__file__).resolve().parents[3]
SERVERS = {"controller-0": ["127.0.0.1", "localhost"], "broker-1": ["127.0.0.1", "localhost"]}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_second_run_reuses_every_file_and_secrets_stay_private(tmp_path: Path) -> None:
    said: list[str] = []
    files, admin_new = prepare(tmp_path / "secure", SERVERS, said.append)
    assert admin_new and said == []
    first = snapshot(files.directory)
    assert set(first) == {
        "ca.pem",
        "ca-key.pem",
        "controller-0.pem",
        "controller-0-key.pem",
        "broker-1.pem",
        "broker-1-key.pem",
        "server.password",
        "admin.password",
    }
    assert mode(files.directory) == 0o700
    for name in ("ca-key.pem", "controller-0-key.pem", "broker-1-key.pem"):
        assert mode(files.directory / name) == 0o600, name
    for path in (files.server_password_file, files.admin_password_file):
        assert mode(path) == 0o600
        assert len(path.read_text().strip()) >= 32  # 24 random bytes, URL-safe base64
    assert files.server_password_file.read_text() != files.admin_password_file.read_text()

    again, admin_new = prepare(tmp_path / "secure", SERVERS, said.append)
    assert not admin_new and said == []
    assert snapshot(again.directory) == first


def test_a_certificate_that_no_longer_fits_is_made_anew(tmp_path: Path) -> None:
    files, _ = prepare(tmp_path, SERVERS, lambda _: None)
    said: list[str] = []
    # Another host name asked for: broker-1's certificate does not name it.
    prepare(tmp_path, {**SERVERS, "broker-1": ["127.0.0.1", "localhost", "broker-1"]}, said.append)
    assert said == [
        f"certificate {files.certfile('broker-1')} does not name broker-1: made a new one"
    ]
    # Expired (issued for 0 days, from an hour ago).
    ca = ThrowawayCA.load(tmp_path)
    assert ca is not None
    ca.issue(
        "controller-0",
        hosts=SERVERS["controller-0"],
        days=0,
        not_before=datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1),
    )
    said.clear()
    prepare(tmp_path, SERVERS, said.append)
    assert said == [
        f"certificate {files.certfile('controller-0')} expires within a day: made a new one"
    ]
    # Signed by another CA.
    other = ThrowawayCA.create(tmp_path / "other")
    issued = other.issue("broker-1", hosts=SERVERS["broker-1"])
    os.replace(issued.certfile, files.certfile("broker-1"))
    os.replace(issued.keyfile, files.keyfile("broker-1"))
    said.clear()
    prepare(tmp_path, SERVERS, said.append)
    assert said == [
        f"certificate {files.certfile('broker-1')} not signed by this CA: made a new one"
    ]
    # What is left verifies against the CA a client trusts.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.certfile("broker-1"), files.keyfile("broker-1"))


def test_a_password_file_others_can_read_is_tightened(tmp_path: Path) -> None:
    files, _ = prepare(tmp_path, SERVERS, lambda _: None)
    files.admin_password_file.chmod(0o644)
    said: list[str] = []
    prepare(tmp_path, SERVERS, said.append)
    assert said == [f"{files.admin_password_file} was readable by others (mode 644): now 0600"]
    assert mode(files.admin_password_file) == 0o600


def test_a_lost_servers_password_is_refused_not_replaced(tmp_path: Path) -> None:
    files, _ = prepare(tmp_path, SERVERS, lambda _: None)
    files.server_password_file.unlink()
    with pytest.raises(SecureSetupError, match=r"server\.password is missing.*Restore the file"):
        prepare(tmp_path, SERVERS, lambda _: None)
    assert not files.server_password_file.exists()


def test_an_empty_password_file_is_a_clear_error(tmp_path: Path) -> None:
    files, _ = prepare(tmp_path, SERVERS, lambda _: None)
    files.admin_password_file.write_text("\n")
    with pytest.raises(SecureSetupError, match="the first line is empty; delete the file"):
        prepare(tmp_path, SERVERS, lambda _: None)


def test_the_printed_cli_line_sets_what_the_cli_reads(tmp_path: Path) -> None:
    """Paths with a space and a quote survive the shell; the password is read from its
    file by the line, not printed."""
    files, _ = prepare(tmp_path / "it's here", SERVERS, lambda _: None)
    lines = client_settings_lines(files, "127.0.0.1:9092", "127.0.0.1:19092")
    password = files.admin_password_file.read_text().strip()
    assert not any(password in line for line in lines)
    (export,) = [line for line in lines if line.startswith("  export ")]
    shown = subprocess.run(
        ["bash", "-c", export + "\nenv"], capture_output=True, text=True, check=True, env={}
    ).stdout.splitlines()
    env = dict(line.split("=", 1) for line in shown if line.startswith("MINIBROKER_"))
    assert env == {
        "MINIBROKER_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "MINIBROKER_CLIENT_SECURITY_PROTOCOL": "SASL_SSL",
        "MINIBROKER_CLIENT_SASL_MECHANISM": "SCRAM-SHA-256",
        "MINIBROKER_CLIENT_SASL_USERNAME": ADMIN_USER,
        "MINIBROKER_CLIENT_SSL_CAFILE": str(files.cafile),
        "MINIBROKER_CLIENT_SASL_PASSWORD": password,
    }
    for client in ("kafka-python:", "confluent-kafka:"):
        ast.parse(lines[lines.index(client) + 1].strip(), mode="eval")


def test_super_users_are_the_servers_the_admin_and_the_controllers_certificates() -> None:
    assert super_users(["controller-0", "controller-1"]) == (
        "User:minibroker-server;User:admin;User:CN=controller-0;User:CN=controller-1"
    )


def test_the_compose_service_command_makes_files_a_server_loads(tmp_path: Path) -> None:
    """What docker-compose.secure.yml's `secure-setup` runs, as it runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [
            *(sys.executable, "-m", "client.secure_setup", "files", str(tmp_path / "s")),
            *("--server=controller-0=controller-0", "--server=broker-1=broker-1,localhost"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    files = SecureFiles(tmp_path / "s")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.certfile("broker-1"), files.keyfile("broker-1"))
    bad = subprocess.run(
        [sys.executable, "-m", "client.secure_setup", "files", str(tmp_path / "t"), "--server=b"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2 and "give NAME=HOST[,HOST...]" in bad.stderr
