"""Every listener security protocol on both wire protocols, with every client (issue 18,
item 6): one broker with eight listeners, PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL
each native and Kafka, the authorizer on and the user allowed its topic by an ACL.

- minibroker's client produces and reads back through each native listener;
- kafka-python, confluent-kafka (librdkafka) and aiokafka do the same through each
  Kafka listener, unmodified, with the settings the README gives;
- the invariant: on every combination a record written is read back, and on a SASL
  listener only as the authenticated user (the same client without credentials gets
  nothing: refused, or closed before any data).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from client import create_ssl_context
from client.errors import MinibrokerError
from client.throwaway_ca import ThrowawayCA
from runtime.acl import AclBinding
from runtime.acl import AclOperation
from runtime.acl import AclPermission
from runtime.acl import PatternType
from runtime.acl import ResourceType
from tests.integration.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
PASSWORD = "matrix-secret"
TOPIC_PREFIX = "matrix"


@dataclass
class Matrix:
    cluster: Cluster
    ca: ThrowawayCA
    addresses: dict[str, str]  # listener name -> host:port

    def native(self, protocol: str) -> str:
        return self.addresses[f"N_{protocol}"]

    def kafka(self, protocol: str) -> str:
        return self.addresses[f"K_{protocol}"]

    def tls(self) -> ssl.SSLContext:
        return create_ssl_context(cafile=self.ca.cafile)


def listener_name(wire: str, protocol: str) -> str:
    return f"{wire}_{protocol}"


@contextlib.contextmanager
def matrix_broker(tmp_path: Path) -> Iterator[Matrix]:
    ca = ThrowawayCA.create(tmp_path / "ca")
    cert = ca.issue("broker-1", hosts=["127.0.0.1", "localhost"])
    names = [listener_name(w, p) for w in ("N", "K") for p in PROTOCOLS]
    # The first listener (PLAINTEXT, native) is the inter-broker one; its principal
    # (ANONYMOUS) is a super user here: one broker, nothing replicates.
    listeners = ",".join(f"{n}://127.0.0.1:0" for n in names)
    protocols = ",".join(f"{n}:{n.split('_', 1)[1]}" for n in names)
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        c.start_controller()
        c.start_broker(
            1,
            *("--listeners", listeners),
            *("--kafka-listeners", ",".join(n for n in names if n.startswith("K_"))),
            *("--listener-security-protocol-map", protocols),
            *("--sasl-enabled-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"),
            *("--ssl-certfile", str(cert.certfile), "--ssl-keyfile", str(cert.keyfile)),
            *("--authorizer-enabled", "true", "--super-users", "User:ANONYMOUS;User:admin"),
        )
        log = c.brokers[1].log_text()
        addresses = {
            n: f"{m[1]}:{m[2]}"
            for n in names
            if (m := re.search(rf"\b{n}://([\w.-]+):(\d+)", log)) is not None
        }
        assert set(addresses) == set(names), log
        for name in ("kafka", "aiokafka"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        yield Matrix(c, ca, addresses)
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    with matrix_broker(tmp_path_factory.mktemp("matrix")) as m:

        async def setup() -> None:
            # As the anonymous super user on the inter-broker listener.
            async with AsyncAdmin(m.native("PLAINTEXT")) as admin:
                await admin.create_user("alice", PASSWORD, mechanism="SCRAM-SHA-256")
                await admin.create_user("alice", PASSWORD, mechanism="SCRAM-SHA-512")
                await admin.create_acls(
                    [
                        AclBinding(
                            ResourceType.TOPIC,
                            TOPIC_PREFIX,
                            PatternType.PREFIXED,
                            principal,
                            "*",
                            AclOperation.ALL,
                            AclPermission.ALLOW,
                        )
                        for principal in ("User:alice", "User:ANONYMOUS")
                    ]
                    # librdkafka's consumer needs a group; without this ACL it closes
                    # only after retrying FindCoordinator for 45 s.
                    + [
                        AclBinding(
                            ResourceType.GROUP,
                            TOPIC_PREFIX,
                            PatternType.PREFIXED,
                            principal,
                            "*",
                            AclOperation.READ,
                            AclPermission.ALLOW,
                        )
                        for principal in ("User:alice", "User:ANONYMOUS")
                    ]
                )
                for protocol in PROTOCOLS:
                    for topic in [topic_of("N", protocol)] + [
                        topic_of("K", protocol, client) for client in ("", "kp", "rd", "aio")
                    ]:
                        await admin.create_topic(topic, 1, 1)

        asyncio.run(setup())
        yield m


def topic_of(wire: str, protocol: str, client: str = "") -> str:
    return f"{TOPIC_PREFIX}-{wire}-{protocol}{'-' + client if client else ''}".lower()


def minibroker_settings(m: Matrix, protocol: str) -> dict[str, Any]:
    out: dict[str, Any] = {"security_protocol": protocol}
    if "SSL" in protocol:
        out["ssl_context"] = m.tls()
    if protocol.startswith("SASL"):
        out.update(
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="alice",
            sasl_plain_password=PASSWORD,
        )
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_minibroker_client_on_each_native_listener(matrix: Matrix, protocol: str) -> None:
    topic = topic_of("N", protocol)
    settings = minibroker_settings(matrix, protocol)
    bootstrap = matrix.native(protocol)
    async with AsyncProducer(bootstrap, acks="all", linger_ms=0, **settings) as producer:
        await producer.send_and_wait(topic, protocol.encode(), partition=0)
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        batch = await consumer.poll(timeout_ms=10_000)
        assert [r.value for rs in batch.values() for r in rs] == [protocol.encode()]


def kafka_python_settings(m: Matrix, protocol: str) -> dict[str, Any]:
    out: dict[str, Any] = {"security_protocol": protocol}
    if "SSL" in protocol:
        out["ssl_cafile"] = str(m.ca.cafile)
    if protocol.startswith("SASL"):
        # PLAIN where the password is sent in the clear only under TLS, as advised.
        mechanism = "PLAIN" if protocol == "SASL_SSL" else "SCRAM-SHA-256"
        out.update(
            sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password=PASSWORD
        )
    return out


def kafka_python_round_trip(m: Matrix, protocol: str) -> list[bytes]:
    topic = topic_of("K", protocol, "kp")
    settings = kafka_python_settings(m, protocol)
    producer = KafkaProducer(bootstrap_servers=m.kafka(protocol), **settings)
    try:
        producer.send(topic, b"kafka-python", partition=0).get(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=m.kafka(protocol),
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
        **settings,
    )
    try:
        consumer.assign([KTopicPartition(topic, 0)])
        return [message.value for message in itertools.islice(consumer, 1)]  # no idle wait
    finally:
        consumer.close()


def librdkafka_settings(m: Matrix, protocol: str) -> dict[str, str]:
    out = {"bootstrap.servers": m.kafka(protocol), "security.protocol": protocol.lower()}
    if "SSL" in protocol:
        out["ssl.ca.location"] = str(m.ca.cafile)
    if protocol.startswith("SASL"):
        out.update(
            {
                "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": "alice",
                "sasl.password": PASSWORD,
            }
        )
    return out


def librdkafka_round_trip(m: Matrix, protocol: str) -> list[bytes]:
    topic = topic_of("K", protocol, "rd")
    settings = librdkafka_settings(m, protocol)
    producer = ConfluentProducer(settings)
    producer.produce(topic, b"librdkafka", partition=0)
    assert producer.flush(30) == 0, "not delivered"
    consumer = ConfluentConsumer({**settings, "group.id": f"matrix-{protocol}"})
    try:
        consumer.assign([ConfluentTopicPartition(topic, 0, 0)])
        for _ in range(30):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return [message.value()]
        return []
    finally:
        consumer.close()


async def aiokafka_round_trip(m: Matrix, protocol: str) -> list[bytes]:
    topic = topic_of("K", protocol, "aio")
    settings: dict[str, Any] = {"security_protocol": protocol}
    if "SSL" in protocol:
        settings["ssl_context"] = aiokafka_ssl_context(cafile=str(m.ca.cafile))
    if protocol.startswith("SASL"):
        settings.update(
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="alice",
            sasl_plain_password=PASSWORD,
        )
    producer = AIOKafkaProducer(bootstrap_servers=m.kafka(protocol), **settings)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"aiokafka", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=m.kafka(protocol), auto_offset_reset="earliest", **settings
    )
    await consumer.start()
    try:
        consumer.assign([ATopicPartition(topic, 0)])
        batch = await consumer.getmany(timeout_ms=10_000)
        return [message.value for messages in batch.values() for message in messages]
    finally:
        await consumer.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_kafka_clients_on_each_kafka_listener(matrix: Matrix, protocol: str) -> None:
    assert await asyncio.to_thread(kafka_python_round_trip, matrix, protocol) == [b"kafka-python"]
    assert await asyncio.to_thread(librdkafka_round_trip, matrix, protocol) == [b"librdkafka"]
    assert await aiokafka_round_trip(matrix, protocol) == [b"aiokafka"]


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
async def test_a_sasl_listener_gives_nothing_without_credentials(
    matrix: Matrix, protocol: str
) -> None:
    """The same client minus its user: no record, whatever the wire protocol."""
    settings = minibroker_settings(matrix, protocol.removeprefix("SASL_"))
    with pytest.raises(MinibrokerError) as refused:  # closed before any data
        async with AsyncConsumer(
            matrix.native(protocol),
            auto_offset_reset="earliest",
            request_timeout_ms=3_000,
            **settings,
        ) as consumer:
            consumer.assign([TopicPartition(topic_of("N", protocol), 0)])
            await consumer.poll(timeout_ms=2_000)
    print(f"{protocol} without a user: {type(refused.value).__name__}: {refused.value}")

    def librdkafka_without_user() -> list[str]:
        settings = librdkafka_settings(matrix, protocol)
        for key in ("sasl.mechanisms", "sasl.username", "sasl.password"):
            settings.pop(key)
        settings["security.protocol"] = "ssl" if protocol == "SASL_SSL" else "plaintext"
        producer = ConfluentProducer({**settings, "message.timeout.ms": "3000"})
        reports: list[str] = []
        producer.produce(
            topic_of("K", protocol),
            b"x",
            partition=0,
            on_delivery=lambda err, _msg: reports.append(str(err)),
        )
        producer.flush(10)
        return reports

    (report,) = await asyncio.to_thread(librdkafka_without_user)
    assert report != "None", "delivered without authenticating"
