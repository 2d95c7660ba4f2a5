"""SASL between the servers on real processes (issue 18): a controller whose listener is
SASL_SSL, three brokers whose inter-broker listener (the first) is SASL_SSL, every
server connection authenticating with SCRAM as the server user the controller wrote
itself at first start (--sasl-bootstrap-username, KIP-900's bootstrap):

- the cluster registers, replicates and fails over with acks=all and keeps every
  acknowledged write; every broker's followers, and the controller, log the server
  user's authentications (the traffic really is SASL);
- a broker whose inter-broker credential is gone cannot fetch, says why in its log
  and retries on its own: once the credential is back it catches up, no restart;
- a broker with a wrong server password cannot register, says why, and gives up after
  its bounded --controller-connect-timeout-ms with a clear error;
- the bootstrap user is written once: a controller restart writes nothing and leaves a
  password changed since as it was;
- confluent-kafka's AdminClient creates and describes a user with Kafka's
  AlterUserScramCredentials / DescribeUserScramCredentials on a Kafka listener,
  unmodified, and the new user then authenticates with librdkafka;
- a quorum of three SASL_SSL controllers: the voters talk by certificate (a connection
  without one gets no quorum API before SASL), the bootstrap user is written by one of
  them once, and a broker follows the quorum across the active controller's SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ScramCredentialInfo
from confluent_kafka.admin import ScramMechanism
from confluent_kafka.admin import UserScramCredentialUpsertion

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from client import create_ssl_context
from client.connection import BrokerConnection
from client.errors import ConnectionFailedError
from client.throwaway_ca import ThrowawayCA
from controller.metadata_log import MetadataLog
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.metadata_records import ScramCredentialRecord
from tests.integration.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SERVER_USER = "minibroker-server"
SERVER_PASSWORD = "server-secret-1"
TOPIC = "replicated"


@dataclass
class SecureCluster:
    c: Cluster
    ca: ThrowawayCA
    password_file: Path
    broker_flags: dict[int, list[str]]

    def client(self, password: str = SERVER_PASSWORD, **extra: Any) -> dict[str, Any]:
        """minibroker client settings: SASL_SSL as the server user, SCRAM-SHA-512."""
        return {
            "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=self.ca.cafile),
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": SERVER_USER,
            "sasl_plain_password": password,
            **extra,
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b.host}:{b.port}" for b in self.c.brokers.values() if b.alive)

    def start_broker(self, n: int, *extra: str, wait: bool = True) -> None:
        self.c.start_broker(n, *self.broker_flags[n], *extra, wait=wait, kafka=True)

    def start_controller(self) -> None:
        self.c.start_controller(*controller_flags(self))


def tls_flags(ca: ThrowawayCA, name: str) -> list[str]:
    cert = ca.issue(name, hosts=["127.0.0.1", "localhost"])
    return [
        *("--ssl-certfile", str(cert.certfile)),
        *("--ssl-keyfile", str(cert.keyfile)),
        *("--ssl-cafile", str(ca.cafile)),
    ]


def broker_flags(ca: ThrowawayCA, n: int, password_file: Path) -> list[str]:
    return [
        # The first listener (PLAINTEXT by name) is the inter-broker one: SASL_SSL.
        *("--listener-security-protocol-map", "PLAINTEXT:SASL_SSL,KAFKA:SASL_SSL"),
        *("--controller-security-protocol", "SASL_SSL"),
        *("--sasl-server-username", SERVER_USER),
        *("--sasl-server-password-file", str(password_file)),
        # Two mechanisms, so one can be taken away from the brokers' fetches alone.
        *("--sasl-mechanism-inter-broker-protocol", "SCRAM-SHA-256"),
        *("--sasl-mechanism-controller-protocol", "SCRAM-SHA-512"),
        *tls_flags(ca, f"broker-{n}"),
    ]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("server-sasl")
    ca = ThrowawayCA.create(root / "ca")
    password_file = root / "server-password"
    password_file.write_text(SERVER_PASSWORD + "\n")
    password_file.chmod(0o600)
    c = Cluster(root / "cluster")
    c.root.mkdir()
    flags = {n: broker_flags(ca, n, password_file) for n in (1, 2, 3)}
    s = SecureCluster(c, ca, password_file, flags)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        s.start_controller()
        c.start_brokers((1, 2, 3), kafka=True, flags_of=flags)
        yield s
    finally:
        c.stop_all()


def controller_flags(s: SecureCluster) -> list[str]:
    return [
        *("--security-protocol", "SASL_SSL"),
        *tls_flags(s.ca, "controller"),
        *("--sasl-bootstrap-username", SERVER_USER),
        *("--sasl-bootstrap-password-file", str(s.password_file)),
    ]


async def wait_for_isr(admin: AsyncAdmin, isr: set[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        (described,) = await admin.describe_topics([TOPIC])
        if set(described.partitions[0].isr) == isr:
            return
        assert time.monotonic() < deadline, f"ISR {described.partitions[0].isr}, wanted {isr}"
        await asyncio.sleep(0.2)


async def read_all(s: SecureCluster, count: int) -> list[bytes]:
    async with AsyncConsumer(s.bootstrap, auto_offset_reset="earliest", **s.client()) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        got: list[bytes] = []
        while len(got) < count:
            batch = await consumer.poll(timeout_ms=10_000)
            assert batch, f"read {len(got)} of {count}"
            got += [r.value for records in batch.values() for r in records]
        return got


async def test_a_sasl_cluster_replicates_fails_over_and_keeps_acknowledged_writes(
    secure: SecureCluster,
) -> None:
    s = secure
    c = s.c
    assert f"bootstrap user '{SERVER_USER}' created" in c.controller.log_text()  # type: ignore[union-attr]
    acknowledged: list[bytes] = []
    async with AsyncAdmin(s.bootstrap, **s.client()) as admin:
        await admin.create_topic(TOPIC, 1, 3, configs={"min.insync.replicas": "2"})
        await wait_for_isr(admin, {1, 2, 3})  # both followers fetch over SASL_SSL
        async with AsyncProducer(s.bootstrap, acks="all", linger_ms=0, **s.client()) as producer:
            for i in range(100):
                await producer.send_and_wait(TOPIC, b"before-%d" % i, partition=0)
                acknowledged.append(b"before-%d" % i)
        (described,) = await admin.describe_topics([TOPIC])
    leader = described.partitions[0].leader
    c.brokers[leader].kill()
    async with AsyncProducer(
        s.bootstrap, acks="all", linger_ms=0, **s.client(request_timeout_ms=5_000)
    ) as producer:
        for i in range(100):
            await producer.send_and_wait(TOPIC, b"after-%d" % i, partition=0)
            acknowledged.append(b"after-%d" % i)
    assert await read_all(s, len(acknowledged)) == acknowledged
    s.start_broker(leader)  # it registers and catches up over SASL again
    async with AsyncAdmin(s.bootstrap, **s.client()) as admin:
        await wait_for_isr(admin, {1, 2, 3})
    # The traffic really was SASL: followers authenticated at the leaders with the
    # inter-broker mechanism, and the brokers at the controller with theirs.
    followers = "".join(b.log_text(since_start=False) for b in c.brokers.values())
    assert f"authenticated as {SERVER_USER} (SCRAM-SHA-256)" in followers
    assert f"authenticated as {SERVER_USER} (SCRAM-SHA-512)" in c.controller.log_text()  # type: ignore[union-attr]


async def test_a_broker_refused_by_its_leader_cannot_fetch_says_why_and_recovers(
    secure: SecureCluster,
) -> None:
    """The server user loses its SCRAM-SHA-256 credential (the inter-broker mechanism
    here): a restarted broker still registers (SCRAM-SHA-512 toward the controller) but
    its fetches are refused; it logs why and retries, bounded, on its own, and catches
    up once the credential is back."""
    s = secure
    c = s.c
    async with AsyncAdmin(s.bootstrap, **s.client()) as admin:
        if TOPIC not in await admin.list_topics():
            await admin.create_topic(TOPIC, 1, 3, configs={"min.insync.replicas": "2"})
        await wait_for_isr(admin, {1, 2, 3})
        (described,) = await admin.describe_topics([TOPIC])
        follower = next(n for n in (1, 2, 3) if n != described.partitions[0].leader)
        c.brokers[follower].terminate()
        await admin.delete_user(SERVER_USER, mechanism="SCRAM-SHA-256")
        async with AsyncProducer(s.bootstrap, acks="all", linger_ms=0, **s.client()) as producer:
            for i in range(20):
                await producer.send_and_wait(TOPIC, b"while-out-%d" % i, partition=0)
        s.start_broker(follower)
        broker = c.brokers[follower]
        line = broker.wait_for(r"SASL authentication to broker \d+ at \S+ failed: .*", 30)
        assert SERVER_USER in line[0] and "--sasl-server-username" in line[0], line[0]
        assert SERVER_PASSWORD not in broker.log_text()
        await asyncio.sleep(3)
        (described,) = await admin.describe_topics([TOPIC])
        assert follower not in described.partitions[0].isr  # it could not fetch
        assert broker.alive
        await admin.create_user(SERVER_USER, SERVER_PASSWORD, mechanism="SCRAM-SHA-256")
        await wait_for_isr(admin, {1, 2, 3}, timeout_s=30)  # back within its retry, no restart
    assert broker.alive and broker.log_text().count("Traceback") == 0


async def test_a_broker_with_a_wrong_server_password_cannot_register_and_says_why(
    secure: SecureCluster, tmp_path: Path
) -> None:
    s = secure
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    s.broker_flags[4] = broker_flags(s.ca, 4, wrong)
    started = time.monotonic()
    s.start_broker(4, "--controller-connect-timeout-ms", "8000", wait=False)
    broker = s.c.brokers[4]
    assert broker.wait_exit(60) == 1
    took = time.monotonic() - started
    text = broker.log_text()
    assert "SASL authentication to controller at" in text, text
    assert f"refused this broker's SASL authentication as '{SERVER_USER}'" in text, text
    assert "not-the-password" not in text
    assert text.count("SASL authentication to controller at") <= 2, text  # one line per 30 s
    assert 8 <= took < 40, took  # retried for its bounded window, then gave up
    del s.c.brokers[4]
    async with AsyncAdmin(s.bootstrap, **s.client()) as admin:
        assert sorted(b.node_id for b in (await admin.describe_cluster()).brokers) == [1, 2, 3]


async def test_kafka_admin_clients_create_and_describe_users(secure: SecureCluster) -> None:
    """confluent-kafka's AdminClient, unmodified, on a SASL_SSL Kafka listener; the
    user it creates then produces with librdkafka."""
    s = secure
    kafka = ",".join(b.kafka_address for b in s.c.brokers.values() if b.alive)
    security = {
        "bootstrap.servers": kafka,
        "security.protocol": "sasl_ssl",
        "ssl.ca.location": str(s.ca.cafile),
        "sasl.mechanisms": "SCRAM-SHA-512",
    }
    admin = AdminClient(
        {**security, "sasl.username": SERVER_USER, "sasl.password": SERVER_PASSWORD}
    )
    futures = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 10_000), b"carol-pw"
            )
        ]
    )
    futures["carol"].result(timeout=30)
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(timeout=30)
    infos = [(i.mechanism, i.iterations) for i in described.scram_credential_infos]
    assert infos == [(ScramMechanism.SCRAM_SHA_512, 10_000)]
    everyone = admin.describe_user_scram_credentials().result(timeout=30)
    assert {"carol", SERVER_USER} <= set(everyone)
    async with AsyncAdmin(s.bootstrap, **s.client()) as minibroker_admin:
        await minibroker_admin.create_topic("carol-topic", 1, 1)
    delivered: list[Any] = []
    producer = ConfluentProducer(
        {**security, "sasl.username": "carol", "sasl.password": "carol-pw", "acks": "all"}
    )
    producer.produce("carol-topic", b"from carol", on_delivery=lambda e, m: delivered.append(e))
    producer.flush(30)
    assert [str(e) if e else None for e in delivered] == [None]  # delivered, as carol


async def test_the_bootstrap_user_is_written_once(secure: SecureCluster) -> None:
    """Restarting the controller writes nothing: the server user's records stay as they
    were, one per mechanism, and a credential changed since the first start (here its
    iteration count, the password kept so the brokers still get in) stays changed."""
    s = secure
    c = s.c
    assert c.controller is not None
    async with AsyncAdmin(s.bootstrap, **s.client()) as admin:
        await admin.create_user(
            SERVER_USER, SERVER_PASSWORD, mechanism="SCRAM-SHA-512", iterations=10_000
        )
    c.controller.terminate()
    before = server_user_records(c.root / "controller")
    assert sorted((r.mechanism, r.iterations) for r in before[:2]) == [(1, 8192), (2, 8192)]
    s.start_controller()
    c.controller.wait_for(r"is the active controller")
    async with AsyncAdmin(s.bootstrap, **s.client()) as admin:
        deadline = time.monotonic() + 30  # the brokers register with the new controller
        while len((await admin.describe_cluster()).brokers) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        await asyncio.sleep(1)  # time for a bootstrap write, were there one
        users = await admin.describe_users([SERVER_USER])
    assert sorted((u.mechanism, u.iterations) for u in users[SERVER_USER]) == [
        ("SCRAM-SHA-256", 8192),
        ("SCRAM-SHA-512", 10_000),
    ]
    assert "bootstrap user" not in c.controller.log_text()
    c.controller.terminate()
    assert server_user_records(c.root / "controller") == before
    s.start_controller()


def server_user_records(data_dir: Path) -> list[ScramCredentialRecord]:
    """The server user's credential records in the controller's metadata log, in order."""
    _, recovered = MetadataLog.open(data_dir)
    records = [*recovered.snapshot_records, *(e.record for e in recovered.entries)]
    return [r for r in records if isinstance(r, ScramCredentialRecord) and r.name == SERVER_USER]


def test_a_sasl_controller_quorum_talks_by_certificate_and_brokers_by_sasl(
    tmp_path: Path,
) -> None:
    """Three controllers on SASL_SSL with --ssl-client-auth requested: the voters elect
    and replicate with their certificates (no user exists when they first vote), the
    bootstrap user is written once by the active one, a broker registers with SCRAM,
    and after the active controller's SIGKILL the next one serves it. A connection
    without a certificate gets no quorum API before SASL."""
    ca = ThrowawayCA.create(tmp_path / "ca")
    password_file = tmp_path / "server-password"
    password_file.write_text(SERVER_PASSWORD + "\n")
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    s = SecureCluster(c, ca, password_file, {1: broker_flags(ca, 1, password_file)})
    try:
        c.start_quorum(3, *controller_flags(s), "--ssl-client-auth", "requested")
        s.start_broker(1)
        asyncio.run(_quorum_apis_need_a_certificate(s, c.quorum[0].host, c.quorum[0].port))
        asyncio.run(_quorum_round(s))
        writers = [p for p in c.quorum.values() if "bootstrap user" in p.log_text()]
        assert len(writers) == 1, [p.name for p in writers]
        active = next(p for p in c.quorum.values() if "is the active controller" in p.log_text())
        active.kill()
        asyncio.run(_quorum_round(s, topic="after-failover"))
        assert sum("bootstrap user" in p.log_text() for p in c.quorum.values()) == 1
    finally:
        c.stop_all()


async def _quorum_round(s: SecureCluster, topic: str = TOPIC) -> None:
    async with AsyncAdmin(s.bootstrap, **s.client(request_timeout_ms=20_000)) as admin:
        await admin.create_topic(topic, 1, 1)  # through the active controller
        async with AsyncProducer(s.bootstrap, acks="all", **s.client()) as producer:
            await producer.send_and_wait(topic, b"v", partition=0)


async def _quorum_apis_need_a_certificate(s: SecureCluster, host: str, port: int) -> None:
    """DescribeQuorum before SASL: closed without a client certificate, answered with
    one the CA signed (as a voter's own connections are)."""
    bare = BrokerConnection(host, port, tls=create_ssl_context(cafile=s.ca.cafile))
    await bare.connect()
    with pytest.raises(ConnectionFailedError):
        await bare.send(DescribeQuorumRequest())
    await bare.close()
    cert = s.ca.issue("a-peer", hosts=["127.0.0.1"])
    peer_tls = create_ssl_context(cafile=s.ca.cafile, certfile=cert.certfile, keyfile=cert.keyfile)
    peer = BrokerConnection(host, port, tls=peer_tls)
    await peer.connect()
    try:
        assert isinstance(await peer.send(DescribeQuorumRequest()), DescribeQuorumResponse)
    finally:
        await peer.close()
