"""docker-compose.secure.yml, the secure variant of the compose cluster (issue 18).

Without containers:
- `docker compose config` accepts the two files together, with the one-shot services;
- the controllers listen on a port the base file does not publish (an override cannot
  take a published port away), so they are reachable on the compose network only;
- what `secure-setup` runs, run here, makes every certificate and key the servers are
  given, and a client trusting ca.pem completes a TLS handshake with each server under
  every name it is reached by (its service name; the brokers' advertised localhost).

With Docker, opt-in with the long container campaigns (MINIBROKER_CHAOS_FULL=1; about
two minutes: docker/build-images.sh from this checkout, then the cluster; where Docker
or compose is missing it skips loudly, and fails with CI or
MINIBROKER_CHAOS_REQUIRE_DOCKER set, as the docker chaos test does): the real cluster
comes up healthy, the admin password and the CA come out as the README says,
minibroker's client and kafka-python produce and consume as admin over SASL_SSL, a
client without credentials is refused, the published controller port answers nothing,
and a restart reuses the secrets (`user admin exists`).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from client import create_ssl_context
from client.errors import MinibrokerError
from tests.chaos.backends import compose_command
from tests.chaos.backends import docker_unavailable
from tests.integration.cluster import free_port
from tests.integration.cluster import run_command

REPO = Path(__file__).resolve().parents[2]
OPT_IN = "MINIBROKER_CHAOS_FULL"  # the switch of the long container campaigns
BASE = REPO / "docker-compose.yml"
SECURE = REPO / "docker-compose.secure.yml"

pytestmark = pytest.mark.integration


def skip_loudly(message: str) -> None:
    for required_by in ("MINIBROKER_CHAOS_REQUIRE_DOCKER", "CI"):
        if os.environ.get(required_by, "") not in ("", "0"):
            pytest.fail(f"{message} (and {required_by} is set: Docker is required here)")
    warnings.warn(message, stacklevel=1)
    pytest.skip(message)


def compose_or_skip() -> list[str]:
    compose = compose_command()
    if compose is None:
        skip_loudly("SECURE COMPOSE NOT CHECKED: neither `docker compose` nor `docker-compose`")
    assert compose is not None
    return compose


def secure_setup_servers() -> dict[str, list[str]]:
    """secure-setup's --server NAME=HOST,... arguments, as the override file has them."""
    found = re.findall(r"--server=([\w-]+)=([\w.,-]+)", SECURE.read_text())
    return {name: hosts.split(",") for name, hosts in found}


def test_compose_accepts_the_secure_override() -> None:
    compose = compose_or_skip()
    run = run_command([*compose, "-f", str(BASE), "-f", str(SECURE), "config"], timeout=60)
    assert run.returncode == 0, run.stderr
    services = run_command(
        [*compose, "-f", str(BASE), "-f", str(SECURE), "config", "--services"], timeout=60
    )
    assert set(services.stdout.split()) == {
        "secure-setup",
        "secure-admin",
        *(f"controller-{i}" for i in range(3)),
        *(f"broker-{i}" for i in (1, 2, 3)),
    }
    # Every server is SASL_SSL: controllers by --security-protocol, brokers on all three
    # listeners, toward the controllers too.
    assert "MINIBROKER_SECURITY_PROTOCOL: SASL_SSL" in run.stdout
    assert run.stdout.count("INTERNAL:SASL_SSL,HOST:SASL_SSL,KAFKA:SASL_SSL") == 3
    assert run.stdout.count("MINIBROKER_CONTROLLER_SECURITY_PROTOCOL: SASL_SSL") == 3
    assert (
        run.stdout.count('MINIBROKER_AUTHORIZER_ENABLED: "true"')
        + run.stdout.count("MINIBROKER_AUTHORIZER_ENABLED: 'true'")
        == 6
    )


def test_the_controllers_listen_on_no_published_port() -> None:
    listen = re.findall(r"MINIBROKER_LISTEN: 0\.0\.0\.0:(\d+)", SECURE.read_text())
    voters = re.findall(r"controller-\d:(\d+)", SECURE.read_text())
    published_targets = re.findall(r"CONTROLLER_\d_PORT:-\d+}:(\d+)", BASE.read_text())
    assert listen and len(published_targets) == 3
    assert set(voters) == set(listen)  # voters and brokers name the port they listen on
    assert not set(listen) & set(published_targets)


def test_secure_setup_makes_what_every_server_is_given(tmp_path: Path) -> None:
    servers = secure_setup_servers()
    given = set(re.findall(r"/etc/minibroker/secure/([\w.-]+)", SECURE.read_text()))
    # What the servers' environment names, each made by secure-setup.
    run = run_command(
        [sys.executable, "-m", "client.secure_setup", "files", str(tmp_path)]
        + [f"--server={n}={','.join(h)}" for n, h in servers.items()],
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stderr
    made = {p.name for p in tmp_path.iterdir()}
    assert given <= made, given - made
    for i in range(3):
        assert servers[f"controller-{i}"] == [f"controller-{i}"]
    for i in (1, 2, 3):
        # The service name for the other containers; localhost as HOST and KAFKA are
        # advertised to clients on the host.
        assert {f"broker-{i}", "localhost"} <= set(servers[f"broker-{i}"])
    for name, hosts in servers.items():
        for host in hosts:
            handshake(tmp_path, name, host)


def handshake(directory: Path, server_name: str, host: str) -> None:
    """A TLS handshake over a socket pair: the server with its certificate, a client
    that trusts ca.pem and checks `host`."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(
        directory / f"{server_name}.pem", directory / f"{server_name}-key.pem"
    )
    client_ctx = create_ssl_context(cafile=directory / "ca.pem")
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (OSError, ssl.SSLError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=host) as c:
            c.sendall(b"x")
    finally:
        thread.join(10)
    assert not errors, errors


# ------------------------------------------------------------------ the real cluster


@pytest.fixture
def secure_compose() -> Iterator[tuple[list[str], dict[str, str]]]:
    if os.environ.get(OPT_IN, "") in ("", "0"):
        # Opt-in with the other long container runs (the image build and a six-container
        # cluster take two minutes of the default run's budget); the checks above run.
        pytest.skip(
            f"the real secure compose cluster is opt-in: {OPT_IN}=1 pytest "
            "tests/integration/test_compose_secure.py"
        )
    why = docker_unavailable(None)
    if why is not None:
        skip_loudly(f"SECURE COMPOSE CLUSTER NOT RUN: {why}")
    build = run_command(["bash", str(REPO / "docker" / "build-images.sh")], timeout=1200)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    compose = compose_or_skip()
    project = f"minibroker-secure-{os.getpid()}"
    ports = {
        f"{kind}_{n}_{suffix}PORT": str(free_port())
        for kind, numbers, suffix in (
            ("BROKER", (1, 2, 3), ""),
            ("BROKER", (1, 2, 3), "KAFKA_"),
            ("CONTROLLER", (0, 1, 2), ""),
        )
        for n in numbers
    }
    env = {**os.environ, **ports}
    command = [*compose, "-p", project, "-f", str(BASE), "-f", str(SECURE)]
    try:
        up = run_command([*command, "up", "-d"], timeout=300, env=env)
        assert up.returncode == 0, up.stderr
        yield command, env
    finally:
        run_command([*command, "down", "-v", "--timeout", "20"], timeout=180, env=env)


def _secret(command: list[str], env: dict[str, str], name: str, into: Path) -> Path:
    """As the README says: `exec -T broker-1 cat /etc/minibroker/secure/NAME > NAME`."""
    out = subprocess.run(
        [*command, "exec", "-T", "broker-1", "cat", f"/etc/minibroker/secure/{name}"],
        capture_output=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    path = into / name
    path.write_bytes(out)
    path.chmod(0o600)
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_secure_compose_cluster_serves_its_admin_only(
    secure_compose: tuple[list[str], dict[str, str]], tmp_path: Path
) -> None:
    command, env = secure_compose
    deadline = time.monotonic() + 180
    while True:
        logs = run_command([*command, "logs", "secure-admin"], timeout=60, env=env).stdout
        if "user admin created" in logs:
            break
        assert time.monotonic() < deadline, logs
        time.sleep(2)
    ca = _secret(command, env, "ca.pem", tmp_path)
    password = _secret(command, env, "admin.password", tmp_path).read_text().strip()
    bootstrap = f"127.0.0.1:{env['BROKER_1_PORT']}"
    admin = {
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=ca),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": password,
    }
    asyncio.run(_produce_and_consume(bootstrap, admin))
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{env['BROKER_1_KAFKA_PORT']}",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="admin",
        sasl_plain_password=password,
        ssl_cafile=str(ca),
        auto_offset_reset="earliest",
        consumer_timeout_ms=20_000,
    )
    try:
        consumer.assign([KTopicPartition("secured", p) for p in range(3)])
        got = sorted(m.value for m in consumer)
    finally:
        consumer.close()
    assert got == sorted(b"v%d" % i for i in range(30))
    # Without credentials: refused.
    with pytest.raises(MinibrokerError):
        asyncio.run(
            _list_topics(
                bootstrap, {"security_protocol": "SSL", "ssl_context": admin["ssl_context"]}
            )
        )
    # The base file's published controller port leads to no listener.
    with socket.create_connection(("127.0.0.1", int(env["CONTROLLER_0_PORT"])), timeout=5) as s:
        s.settimeout(5)
        try:
            s.sendall(b"\x00\x00\x00\x0a" + b"\x00" * 10)
            answered = s.recv(1)
        except ConnectionResetError:  # closed with a reset: also nothing answered
            answered = b""
        assert answered == b""  # closed, nothing answered
    # A restart reuses the secrets and the admin user.
    assert run_command([*command, "stop"], timeout=180, env=env).returncode == 0
    up = run_command([*command, "up", "-d"], timeout=300, env=env)
    assert up.returncode == 0, up.stderr
    while True:
        logs = run_command([*command, "logs", "secure-admin"], timeout=60, env=env).stdout
        if "user admin exists" in logs:
            break
        assert time.monotonic() < deadline + 180, logs
        time.sleep(2)
    assert _secret(command, env, "admin.password", tmp_path / "..").read_text().strip() == password
    asyncio.run(_list_topics(bootstrap, admin))


async def _produce_and_consume(bootstrap: str, settings: dict[str, object]) -> None:
    async with AsyncAdmin(bootstrap, **settings) as admin:  # type: ignore[arg-type]
        await admin.create_topic("secured", 3, 3)
    async with AsyncProducer(bootstrap, acks="all", **settings) as producer:  # type: ignore[arg-type]
        for i in range(30):
            await producer.send_and_wait("secured", b"v%d" % i, partition=i % 3)
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest", **settings) as consumer:  # type: ignore[arg-type]
        consumer.assign([TopicPartition("secured", p) for p in range(3)])
        got: list[bytes] = []
        while len(got) < 30:
            batch = await consumer.poll(timeout_ms=10_000)
            assert batch, f"read {len(got)} of 30"
            got += [r.value for records in batch.values() for r in records]
    assert sorted(got) == sorted(b"v%d" % i for i in range(30))


async def _list_topics(bootstrap: str, settings: dict[str, object]) -> list[str]:
    async with AsyncAdmin(bootstrap, bootstrap_retries=1, **settings) as admin:  # type: ignore[arg-type]
        return list(await admin.list_topics())
