"""TLS everywhere on real processes (issue 18, part 1: the SSL security protocol):

a controller listening with SSL, two brokers whose listeners (native, first, so brokers
replicate over TLS; and Kafka) are SSL with client certificates requested, brokers
reaching the controller over SSL; certificates from a throwaway CA. Then:

- minibroker's client produces acks=all to a topic on both brokers (the follower
  fetches over TLS, or the ISR would shrink) and reads everything back, over SSL;
- kafka-python, confluent-kafka (librdkafka) and aiokafka, unmodified, produce and
  consume through the Kafka listener with security_protocol SSL and the CA file;
- a plaintext client on a TLS port is refused, the broker logs one line saying so, and
  the TLS clients go on;
- a broker that is told the controller speaks PLAINTEXT when it speaks SSL does not
  get in, and says why;
- the CLI with --security-protocol SSL --ssl-cafile: topic create, produce, consume,
  cluster health.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import AIOKafkaProducer
from aiokafka.helpers import create_ssl_context as aiokafka_ssl_context
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer
from kafka import KafkaProducer

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from client import create_ssl_context
from client.errors import MinibrokerError
from client.throwaway_ca import ThrowawayCA
from tests.integration.cluster import REPO
from tests.integration.cluster import Cluster
from tests.integration.cluster import mb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "secret"


def tls_flags(ca: ThrowawayCA, name: str) -> list[str]:
    cert = ca.issue(name, hosts=["127.0.0.1", "localhost"])
    return [
        *("--ssl-certfile", str(cert.certfile)),
        *("--ssl-keyfile", str(cert.keyfile)),
        *("--ssl-cafile", str(ca.cafile)),
        *("--ssl-client-auth", "requested"),
    ]


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[Cluster, ThrowawayCA]]:
    ca = ThrowawayCA.create(tmp_path / "ca")
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        c.start_controller("--security-protocol", "SSL", *tls_flags(ca, "controller"))
        for n in (1, 2):
            c.start_broker(
                n,
                "--listener-security-protocol-map",
                "PLAINTEXT:SSL,KAFKA:SSL",
                "--controller-security-protocol",
                "SSL",
                *tls_flags(ca, f"broker-{n}"),
                kafka=True,
            )
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        yield c, ca
    finally:
        c.stop_all()


def native(c: Cluster) -> str:
    return ",".join(f"{b.host}:{b.port}" for b in c.brokers.values())


async def test_minibroker_client_and_replication_over_tls(
    secure: tuple[Cluster, ThrowawayCA],
) -> None:
    c, ca = secure
    tls = {"security_protocol": "SSL", "ssl_context": create_ssl_context(cafile=ca.cafile)}
    async with AsyncAdmin(native(c), **tls) as admin:  # type: ignore[arg-type]
        await admin.create_topic(TOPIC, 1, 2, configs={"min.insync.replicas": "2"})
        async with AsyncProducer(native(c), acks="all", linger_ms=0, **tls) as producer:  # type: ignore[arg-type]
            for i in range(50):
                await producer.send_and_wait(TOPIC, b"v%d" % i, partition=0)
        (described,) = await admin.describe_topics([TOPIC])
        assert sorted(described.partitions[0].isr) == [1, 2]  # the follower kept up over TLS
    async with AsyncConsumer(native(c), auto_offset_reset="earliest", **tls) as consumer:  # type: ignore[arg-type]
        consumer.assign([TopicPartition(TOPIC, 0)])
        got: list[bytes] = []
        while len(got) < 50:
            batch = await consumer.poll(timeout_ms=5_000)
            assert batch, f"read {len(got)} of 50"
            got += [r.value for records in batch.values() for r in records]
    assert got == [b"v%d" % i for i in range(50)]


async def test_a_plaintext_client_on_a_tls_port_is_refused_and_logged(
    secure: tuple[Cluster, ThrowawayCA],
) -> None:
    c, ca = secure
    with pytest.raises(MinibrokerError):
        async with AsyncAdmin(native(c), request_timeout_ms=3_000, bootstrap_retries=1) as admin:
            await admin.describe_cluster()
    await asyncio.sleep(0.3)
    lines = [
        line
        for b in c.brokers.values()
        for line in b.log_text().splitlines()
        if "TLS handshake failed" in line
    ]
    assert lines and all("plaintext client" in line for line in lines), lines
    tls = create_ssl_context(cafile=ca.cafile)
    async with AsyncAdmin(native(c), security_protocol="SSL", ssl_context=tls) as admin:
        assert len((await admin.describe_cluster()).brokers) == 2


async def test_a_client_without_a_good_certificate_is_told_why(tmp_path: Path) -> None:
    """With --ssl-client-auth required, a client without a certificate, or with one of
    another CA, is refused in the handshake, and the broker's TLS alert says why
    (certificate required, or a certificate it cannot verify). The broker closed the
    connection without it: the client saw only "connection lost", no reason."""
    ca = ThrowawayCA.create(tmp_path / "ca")
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        c.start_controller()
        flags = [flag if flag != "requested" else "required" for flag in tls_flags(ca, "b1")]
        c.start_broker(1, "--listener-security-protocol-map", "PLAINTEXT:SSL", *flags)
        stranger = ThrowawayCA.create(tmp_path / "stranger").issue("admin")
        refusals = {}
        for name, cert in (("none", None), ("stranger", stranger)):
            tls = create_ssl_context(
                cafile=ca.cafile,
                certfile=None if cert is None else cert.certfile,
                keyfile=None if cert is None else cert.keyfile,
            )
            with pytest.raises(MinibrokerError) as refused:
                async with AsyncAdmin(
                    native(c), security_protocol="SSL", ssl_context=tls, bootstrap_retries=1
                ) as admin:
                    await admin.describe_cluster()
            refusals[name] = str(refused.value)
        assert "CERTIFICATE_REQUIRED" in refusals["none"], refusals
        assert "ALERT" in refusals["stranger"], refusals
        log = c.brokers[1].log_text()
        assert "the client's certificate is missing or not signed by --ssl-cafile" in log
    finally:
        c.stop_all()


async def test_kafka_clients_over_ssl(secure: tuple[Cluster, ThrowawayCA]) -> None:
    c, ca = secure
    tls = create_ssl_context(cafile=ca.cafile)
    async with AsyncAdmin(native(c), security_protocol="SSL", ssl_context=tls) as admin:
        await admin.create_topic(TOPIC, 1, 2)
    bootstrap = c.kafka_bootstrap()

    def kafka_python() -> list[bytes]:
        producer = KafkaProducer(
            bootstrap_servers=bootstrap, security_protocol="SSL", ssl_cafile=str(ca.cafile)
        )
        for i in range(5):
            producer.send(TOPIC, b"kafka-python-%d" % i, partition=0).get(timeout=30)
        producer.close()
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            security_protocol="SSL",
            ssl_cafile=str(ca.cafile),
            auto_offset_reset="earliest",
            consumer_timeout_ms=10_000,
        )
        from kafka import TopicPartition as KTopicPartition

        consumer.assign([KTopicPartition(TOPIC, 0)])
        values = [m.value for _, m in zip(range(5), consumer, strict=False)]
        consumer.close()
        return values

    def librdkafka() -> list[bytes]:
        settings = {
            "bootstrap.servers": bootstrap,
            "security.protocol": "ssl",
            "ssl.ca.location": str(ca.cafile),
        }
        producer = ConfluentProducer(settings)
        for i in range(5):
            producer.produce(TOPIC, b"librdkafka-%d" % i, partition=0)
        assert producer.flush(30) == 0
        consumer = ConfluentConsumer({**settings, "group.id": "tls-test"})
        consumer.assign([ConfluentTopicPartition(TOPIC, 0, 0)])
        values = []
        deadline = 60
        while len(values) < 10 and deadline > 0:
            message = consumer.poll(1.0)
            deadline -= 1
            if message is not None and message.error() is None:
                values.append(message.value())
        consumer.close()
        return values

    first = await asyncio.to_thread(kafka_python)
    assert first == [b"kafka-python-%d" % i for i in range(5)]
    everything = await asyncio.to_thread(librdkafka)
    assert everything == first + [b"librdkafka-%d" % i for i in range(5)]

    context = aiokafka_ssl_context(cafile=str(ca.cafile))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, security_protocol="SSL", ssl_context=context
    )
    await producer.start()
    try:
        await producer.send_and_wait(TOPIC, b"aiokafka", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        security_protocol="SSL",
        ssl_context=context,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        from aiokafka import TopicPartition as ATopicPartition

        consumer.assign([ATopicPartition(TOPIC, 0)])
        batch = await consumer.getmany(timeout_ms=10_000, max_records=20)
        values = [m.value for records in batch.values() for m in records]
        assert values == [*everything, b"aiokafka"]
    finally:
        await consumer.stop()


def test_a_broker_that_speaks_plaintext_to_an_ssl_controller_says_why(
    tmp_path: Path,
) -> None:
    ca = ThrowawayCA.create(tmp_path / "ca")
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        c.start_controller("--security-protocol", "SSL", *tls_flags(ca, "controller"))
        broker = c.start_broker(1, "--controller-connect-timeout-ms", "3000", wait=False)
        assert broker.wait_exit(60) != 0
        assert "controller" in broker.log_text()
        assert "TLS handshake failed" in (c.root / "controller.log").read_text()
    finally:
        c.stop_all()


def test_the_cli_over_ssl(secure: tuple[Cluster, ThrowawayCA]) -> None:
    """`minibroker --security-protocol SSL --ssl-cafile ...` for every client command;
    without it the command fails and says it could not connect."""
    c, ca = secure
    tls = ["--security-protocol", "SSL", "--ssl-cafile", str(ca.cafile), "-b", native(c)]
    created = mb(*tls, "topic", "create", "cli-tls", "-p", "1", "-r", "2")
    assert created.returncode == 0, created.stderr
    produced = mb(*tls, "produce", "cli-tls", stdin="a\nb\nc\n")
    assert produced.returncode == 0, produced.stderr
    consumed = mb(*tls, "consume", "cli-tls", "--from-beginning", "-n", "3")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == ["a", "b", "c"]
    health = mb(*tls, "cluster", "health")
    assert health.returncode == 0, health.stdout + health.stderr
    plain = mb("-b", native(c), "topic", "list", timeout=90)
    assert plain.returncode == 1 and "error:" in plain.stderr, plain.stderr


def test_the_container_healthcheck_probes_ssl_listeners_over_tls(
    secure: tuple[Cluster, ThrowawayCA],
) -> None:
    """docker/healthcheck.py finds which listeners are SSL from the server's own
    arguments and asks them ApiVersions over TLS (the controller's too); before, an SSL
    broker was never healthy."""
    c, _ = secure
    sys.path.insert(0, str(REPO / "docker"))
    try:
        import healthcheck
    finally:
        sys.path.pop(0)
    deadline = time.monotonic() + 20
    for proc, role in [(c.brokers[1], "broker"), (c.controller, "controller")]:
        assert proc is not None
        args = proc.args[proc.args.index(role) + 1 :]
        if role == "broker":  # the listeners with the ports they were given
            args += [
                "--listeners",
                f"PLAINTEXT://{proc.host}:{proc.port},KAFKA://{proc.kafka_address}",
            ]
        else:
            args += ["--listen", proc.address]
        server = healthcheck.Server(proc.pid, role, args, {}, REPO)
        secure_names = healthcheck.ssl_listener_names(server)
        assert secure_names == ({"PLAINTEXT", "KAFKA"} if role == "broker" else {"CONTROLLER"})
        targets = healthcheck.probe_addresses(
            role,
            healthcheck.listen_setting(server),
            healthcheck.kafka_listener_names(server),
            (secure_names, healthcheck.probe_tls(server)),
        )
        assert all(t.tls is not None for t in targets)
        assert all(healthcheck.probe(t, deadline) > 0 for t in targets)
        plain = targets[0]._replace(tls=None)
        with pytest.raises(healthcheck.ProbeError):
            healthcheck.probe(plain, deadline)
