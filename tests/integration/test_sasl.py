"""SASL on real processes (issue 18): a broker whose Kafka listeners are
SASL_PLAINTEXT (KAFKA) and SASL_SSL (SECURE), users created with `AsyncAdmin.create_user`
(SCRAM credentials in the metadata log), and Kafka's own clients, unmodified:

- kafka-python with PLAIN on SASL_PLAINTEXT and SCRAM-SHA-512 on SASL_SSL,
  confluent-kafka (librdkafka) with SCRAM-SHA-256, aiokafka with SCRAM-SHA-256 on
  SASL_SSL: each produces and reads back;
- a wrong password, an unknown user and a client that skips SASL deliver nothing; the
  broker logs the failed SCRAM exchange the same way for both users (never naming the
  unknown one) and the request sent before SASL; the right password then delivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as ATopicPartition
from aiokafka.helpers import create_ssl_context as aiokafka_ssl_context
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer
from kafka import KafkaProducer
from kafka import TopicPartition as KTopicPartition

from client import AsyncAdmin
from client import AsyncProducer
from client import create_ssl_context
from client.errors import MinibrokerError
from client.errors import SaslAuthenticationFailedError
from client.throwaway_ca import ThrowawayCA
from tests.integration.cluster import CLI
from tests.integration.cluster import CLI_ENV
from tests.integration.cluster import REPO
from tests.integration.cluster import Cluster
from tests.integration.cluster import run_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "sasl"
PASSWORD = "alice-secret"
_SECURE = re.compile(r"SECURE://([\w.-]+):(\d+)")


@contextlib.contextmanager
def sasl_broker(tmp_path: Path, *flags: str) -> Iterator[tuple[Cluster, ThrowawayCA]]:
    """A controller and broker 1 started with `flags` and a certificate of a throwaway
    CA (for its SSL and SASL_SSL listeners); stopped on the way out."""
    ca = ThrowawayCA.create(tmp_path / "ca")
    cert = ca.issue("broker-1", hosts=["127.0.0.1", "localhost"])
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        c.start_controller()
        c.start_broker(
            1,
            *flags,
            *("--ssl-certfile", str(cert.certfile), "--ssl-keyfile", str(cert.keyfile)),
        )
        yield c, ca
    finally:
        c.stop_all()


@pytest.fixture
def sasl_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, ThrowawayCA, str, str]]:
    """(cluster, CA, SASL_PLAINTEXT bootstrap, SASL_SSL bootstrap)."""
    with sasl_broker(
        tmp_path,
        *("--listeners", "PLAINTEXT://127.0.0.1:0,KAFKA://127.0.0.1:0,SECURE://127.0.0.1:0"),
        *("--kafka-listeners", "KAFKA,SECURE"),
        *("--listener-security-protocol-map", "KAFKA:SASL_PLAINTEXT,SECURE:SASL_SSL"),
        *("--sasl-enabled-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"),
    ) as (c, ca):
        broker = c.brokers[1]
        secure = _SECURE.search(broker.log_text())
        assert secure is not None, broker.log_text()
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        yield c, ca, broker.kafka_address, f"{secure[1]}:{secure[2]}"


async def make_users(c: Cluster) -> None:
    async with AsyncAdmin("{}:{}".format(*c.brokers[1].address)) as admin:
        await admin.create_topic(TOPIC, 1, 1)
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            await admin.create_user("alice", PASSWORD, mechanism=mechanism)


def kafka_python_round_trip(bootstrap: str, value: bytes, **security: object) -> list[bytes]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **security)
    producer.send(TOPIC, value, partition=0).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
        **security,
    )
    consumer.assign([KTopicPartition(TOPIC, 0)])
    values = [m.value for m in consumer]
    consumer.close()
    return values


async def test_kafka_clients_authenticate_with_plain_and_scram(
    sasl_cluster: tuple[Cluster, ThrowawayCA, str, str],
) -> None:
    c, ca, plaintext, tls = sasl_cluster
    await make_users(c)
    plain = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }
    got = await asyncio.to_thread(kafka_python_round_trip, plaintext, b"plain", **plain)
    assert got == [b"plain"]
    scram512 = {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(ca.cafile),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }
    got = await asyncio.to_thread(kafka_python_round_trip, tls, b"scram-512", **scram512)
    assert got == [b"plain", b"scram-512"]

    def librdkafka() -> list[bytes]:
        settings = {
            "bootstrap.servers": plaintext,
            "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": PASSWORD,
        }
        producer = ConfluentProducer(settings)
        producer.produce(TOPIC, b"librdkafka", partition=0)
        assert producer.flush(30) == 0
        consumer = ConfluentConsumer({**settings, "group.id": "sasl-test"})
        consumer.assign([ConfluentTopicPartition(TOPIC, 0, 0)])
        values: list[bytes] = []
        for _ in range(30):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == 3:
                break
        consumer.close()
        return values

    assert await asyncio.to_thread(librdkafka) == [b"plain", b"scram-512", b"librdkafka"]

    aiokafka = {
        "security_protocol": "SASL_SSL",
        "ssl_context": aiokafka_ssl_context(cafile=str(ca.cafile)),
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }
    producer = AIOKafkaProducer(bootstrap_servers=tls, **aiokafka)
    await producer.start()
    try:
        await producer.send_and_wait(TOPIC, b"aiokafka", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=tls, auto_offset_reset="earliest", **aiokafka)
    await consumer.start()
    try:
        consumer.assign([ATopicPartition(TOPIC, 0)])
        batch = await consumer.getmany(timeout_ms=10_000)
        assert [m.value for ms in batch.values() for m in ms] == [
            b"plain",
            b"scram-512",
            b"librdkafka",
            b"aiokafka",
        ]
    finally:
        await consumer.stop()
    assert "authenticated as alice (SCRAM-SHA-256)" in c.brokers[1].log_text()


async def test_a_wrong_password_or_no_sasl_is_refused_and_logged(
    sasl_cluster: tuple[Cluster, ThrowawayCA, str, str],
) -> None:
    c, _, plaintext, _ = sasl_cluster
    await make_users(c)

    def deliveries(**settings: object) -> list[object]:
        """librdkafka's delivery reports of one record (None: delivered)."""
        reports: list[object] = []
        producer = ConfluentProducer(
            {"bootstrap.servers": plaintext, "message.timeout.ms": 3000, **settings}
        )
        producer.produce(TOPIC, b"x", partition=0, on_delivery=lambda e, m: reports.append(e))
        producer.flush(15)
        return reports

    sasl = {"security.protocol": "sasl_plaintext", "sasl.mechanisms": "SCRAM-SHA-256"}
    (wrong,) = await asyncio.to_thread(
        deliveries, **sasl, **{"sasl.username": "alice", "sasl.password": "not-it"}
    )
    (nobody,) = await asyncio.to_thread(
        deliveries, **sasl, **{"sasl.username": "nobody", "sasl.password": "not-it"}
    )
    (plain,) = await asyncio.to_thread(deliveries)  # no SASL at all
    assert wrong is not None and nobody is not None and plain is not None
    (right,) = await asyncio.to_thread(
        deliveries, **sasl, **{"sasl.username": "alice", "sasl.password": PASSWORD}
    )
    assert right is None  # the same settings with the password: delivered
    await asyncio.sleep(0.5)
    log = c.brokers[1].log_text()
    failed = [line for line in log.splitlines() if "SASL SCRAM-SHA-256 failed" in line]
    assert failed and all("wrong user name or password" in line for line in failed), failed
    assert "before SASL authentication" in log
    assert "nobody" not in log  # whether a user exists is neither told nor logged


def test_the_container_healthcheck_reaches_sasl_listeners(
    sasl_cluster: tuple[Cluster, ThrowawayCA, str, str],
) -> None:
    """ApiVersions is answered before SASL: the image's probe sees the SASL_PLAINTEXT
    listener as it is and the SASL_SSL one over TLS."""
    c, _, _, _ = sasl_cluster
    sys.path.insert(0, str(REPO / "docker"))
    try:
        import healthcheck
    finally:
        sys.path.pop(0)
    broker = c.brokers[1]
    args = broker.args[broker.args.index("broker") + 1 :]
    server = healthcheck.Server(broker.pid, "broker", args, {}, REPO)
    secure = healthcheck.ssl_listener_names(server)
    assert secure == {"SECURE"}
    log = broker.log_text()
    ports = {
        name: int(port)
        for name, port in re.findall(r"(PLAINTEXT|KAFKA|SECURE)://127\.0\.0\.1:(\d+)", log)
    }
    setting = ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items())
    targets = healthcheck.probe_addresses(
        "broker", setting, {"KAFKA", "SECURE"}, (secure, healthcheck.probe_tls(server))
    )
    deadline = time.monotonic() + 20
    assert all(healthcheck.probe(t, deadline) > 0 for t in targets)


async def test_minibroker_client_and_cli_authenticate_on_a_native_sasl_listener(
    tmp_path: Path,
) -> None:
    """The native protocol's SASL (issue 18): a broker whose client listener (native,
    the second) is SASL_SSL; minibroker's client and CLI log in with SCRAM-SHA-512 and
    PLAIN, a wrong password is refused at once (not retried) and a client without SASL
    gets nothing."""
    with sasl_broker(
        tmp_path,
        *("--listeners", "PLAINTEXT://127.0.0.1:0,CLIENTS://127.0.0.1:0"),
        *("--listener-security-protocol-map", "CLIENTS:SASL_SSL"),
        *("--sasl-enabled-mechanisms", "SCRAM-SHA-512,PLAIN"),
    ) as (c, ca):
        broker = c.brokers[1]
        found = re.search(r"CLIENTS://([\w.-]+):(\d+)", broker.log_text())
        assert found is not None
        clients = f"{found[1]}:{found[2]}"
        async with AsyncAdmin("{}:{}".format(*broker.address)) as admin:
            await admin.create_user("alice", PASSWORD, mechanism="SCRAM-SHA-512")
        tls = create_ssl_context(cafile=ca.cafile)

        def login(mechanism: str, password: str) -> dict[str, object]:
            return {
                "security_protocol": "SASL_SSL",
                "ssl_context": tls,
                "sasl_mechanism": mechanism,
                "sasl_plain_username": "alice",
                "sasl_plain_password": password,
            }

        async with AsyncAdmin(clients, **login("SCRAM-SHA-512", PASSWORD)) as admin:  # type: ignore[arg-type]
            await admin.create_topic("native-sasl", 1, 1)
        async with AsyncProducer(clients, **login("PLAIN", PASSWORD)) as producer:  # type: ignore[arg-type]
            await producer.send_and_wait("native-sasl", b"hello", partition=0)
        started = time.monotonic()
        with pytest.raises(SaslAuthenticationFailedError, match="wrong user name or password"):
            async with AsyncAdmin(clients, **login("SCRAM-SHA-512", "wrong")) as admin:  # type: ignore[arg-type]
                await admin.describe_cluster()
        assert time.monotonic() - started < 5, "a refused password is not retried"
        with pytest.raises(MinibrokerError):
            async with AsyncAdmin(
                clients, security_protocol="SSL", ssl_context=tls, bootstrap_retries=1
            ) as admin:
                await admin.describe_cluster()

        cli = [
            *("--security-protocol", "SASL_SSL", "--ssl-cafile", str(ca.cafile)),
            *("--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "alice", "-b", clients),
        ]
        env = {**CLI_ENV, "MINIBROKER_CLIENT_SASL_PASSWORD": PASSWORD}
        consumed = run_command(
            [*CLI, *cli, "consume", "native-sasl", "--from-beginning", "-n", "1"],
            timeout=60,
            env=env,
        )
        assert consumed.returncode == 0, consumed.stderr
        assert consumed.stdout.split() == ["hello"]
        refused = run_command(
            [*CLI, *cli, "topic", "list"],
            timeout=60,
            env={**env, "MINIBROKER_CLIENT_SASL_PASSWORD": "wrong"},
        )
        assert refused.returncode == 1 and "wrong user name or password" in refused.stderr
