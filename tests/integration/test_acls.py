"""ACLs on real processes (issue 18): a controller and a broker run with
--authorizer-enabled. The servers know each other by their TLS client certificates
(the broker's inter-broker listener and the controller's listener require one), and
are super users with the operator's certificate (CN=admin); clients are SCRAM users on
SASL_PLAINTEXT listeners, native (CLIENT) and Kafka (KAFKA).

Invariants:
- a user without an ACL sees nothing and changes nothing: its Produce, Fetch,
  ListOffsets, group and admin requests are refused with Kafka's error for each
  (TOPIC_, GROUP_, CLUSTER_AUTHORIZATION_FAILED) and Metadata hides the topic; with
  the ACLs `minibroker acl add` grants, it can produce, consume in a group and commit;
- DENY wins over ALLOW; a PREFIXED ACL covers every topic with the prefix;
- a client principal cannot call a server's API (the controller's registration and
  heartbeats, a replica's Fetch), and one server cannot pose as another broker;
- nor keep a broker's connection slot on the controller by trying: refused, it is
  closed, so refused heartbeats cannot fill --max-connections;
- Kafka's own clients get the same refusals (kafka-python).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka import KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import TopicAuthorizationFailedError as KafkaTopicAuthorizationFailed

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from client import create_ssl_context
from client.errors import ClusterAuthorizationFailedError
from client.errors import GroupAuthorizationFailedError
from client.errors import TopicAuthorizationFailedError
from client.throwaway_ca import ThrowawayCA
from protocol.api import DEBUGGING_REPLICA_ID
from protocol.errors import ErrorCode
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchTopic
from protocol.messages import Listener
from protocol.messages import QuorumFetchRequest
from protocol.messages import VoteRequest
from runtime.acl import CLUSTER_NAME
from runtime.acl import AclBinding
from runtime.acl import AclFilter
from runtime.acl import AclOperation
from runtime.acl import AclPermission
from runtime.acl import PatternType
from runtime.acl import ResourceType
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcErrorResponse
from runtime.sasl import SaslCredentials
from tests.integration.cluster import CLI
from tests.integration.cluster import CLI_ENV
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient
from tests.integration.cluster import run_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PASSWORD = "alice-secret"
_CLIENT = re.compile(r"CLIENT://([\w.-]+):(\d+)")
ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY


@dataclass
class Secured:
    cluster: Cluster
    ca: ThrowawayCA
    admin_tls: ssl.SSLContext  # the operator's certificate: a super user
    client: str  # the native SASL_PLAINTEXT listener
    kafka: str  # the Kafka SASL_PLAINTEXT listener

    @property
    def internal(self) -> str:
        host, port = self.cluster.brokers[1].address
        return f"{host}:{port}"

    def admin(self) -> AsyncAdmin:
        return AsyncAdmin(self.internal, security_protocol="SSL", ssl_context=self.admin_tls)

    def as_user(self, user: str = "alice", password: str = PASSWORD) -> dict[str, object]:
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": user,
            "sasl_plain_password": password,
        }


def tls_flags(ca: ThrowawayCA, name: str) -> list[str]:
    cert = ca.issue(name, hosts=["127.0.0.1", "localhost"])
    return [
        *("--ssl-certfile", str(cert.certfile)),
        *("--ssl-keyfile", str(cert.keyfile)),
        *("--ssl-cafile", str(ca.cafile)),
        *("--ssl-client-auth", "required"),
    ]


SUPER_USERS = "User:CN=admin;User:CN=broker-1;User:CN=controller;User:admin"


@contextlib.contextmanager
def secured_cluster(tmp_path: Path, *controller_flags: str) -> Iterator[Secured]:
    ca = ThrowawayCA.create(tmp_path / "ca")
    admin_cert = ca.issue("admin")
    admin_tls = create_ssl_context(
        cafile=ca.cafile, certfile=admin_cert.certfile, keyfile=admin_cert.keyfile
    )
    authorizer = ("--authorizer-enabled", "true", "--super-users", SUPER_USERS)
    c = Cluster(tmp_path / "cluster")
    c.root.mkdir()
    try:
        c.start_controller(
            *("--security-protocol", "SSL"),
            *tls_flags(ca, "controller"),
            *authorizer,
            *controller_flags,
        )
        c.start_broker(
            1,
            *("--listeners", "PLAINTEXT://127.0.0.1:0,CLIENT://127.0.0.1:0,KAFKA://127.0.0.1:0"),
            *("--kafka-listeners", "KAFKA"),
            *(
                "--listener-security-protocol-map",
                "PLAINTEXT:SSL,CLIENT:SASL_PLAINTEXT,KAFKA:SASL_PLAINTEXT",
            ),
            *("--sasl-enabled-mechanisms", "SCRAM-SHA-256"),
            *("--controller-security-protocol", "SSL"),
            *tls_flags(ca, "broker-1"),
            *authorizer,
        )
        broker = c.brokers[1]
        client = _CLIENT.search(broker.log_text())
        assert client is not None, broker.log_text()
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        yield Secured(c, ca, admin_tls, f"{client[1]}:{client[2]}", broker.kafka_address)
    finally:
        c.stop_all()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    with secured_cluster(tmp_path) as s:
        yield s


async def setup_topics_and_alice(s: Secured, *topics: str) -> None:
    async with s.admin() as admin:
        for topic in topics:
            await admin.create_topic(topic, 1, 1)
        await admin.create_user("alice", PASSWORD)
        await admin.create_user("mallory", "mallory-secret")


def acl(
    kind: ResourceType,
    name: str,
    op: AclOperation,
    *,
    principal: str = "User:alice",
    permission: AclPermission = ALLOW,
    pattern: PatternType = PatternType.LITERAL,
) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, "*", op, permission)


async def test_a_user_without_acls_sees_nothing_and_an_acl_opens_exactly_its_part(
    secured: Secured,
) -> None:
    s = secured
    await setup_topics_and_alice(s, "orders", "orders-eu", "payroll")
    alice = s.as_user()

    # No ACL: every data request refused with its Kafka error, the topic hidden.
    async with AsyncAdmin(s.client, **alice) as admin:  # type: ignore[arg-type]
        assert await admin.list_topics() == []
        with pytest.raises(ClusterAuthorizationFailedError):
            await admin.describe_users()
        with pytest.raises(ClusterAuthorizationFailedError):
            await admin.create_acls([acl(ResourceType.TOPIC, "payroll", AclOperation.READ)])
    # Idempotent (the default with acks=all): no producer id without Write anywhere.
    with pytest.raises(ClusterAuthorizationFailedError, match="producer id"):
        async with AsyncProducer(s.client, acks="all", **alice):  # type: ignore[arg-type]
            pass
    async with AsyncProducer(
        s.client,
        acks="all",
        linger_ms=0,
        enable_idempotence=False,
        **alice,  # type: ignore[arg-type]
    ) as producer:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait("orders", b"x", partition=0)

    # The operator grants alice Write and Read on every orders* topic, and her group.
    async with s.admin() as admin:
        await admin.create_acls(
            [
                acl(ResourceType.TOPIC, "orders", op, pattern=PatternType.PREFIXED)
                for op in (AclOperation.WRITE, AclOperation.READ)
            ]
            + [acl(ResourceType.GROUP, "alice-app", AclOperation.READ)]
            # DENY wins: nothing of orders-eu is readable, though the prefix allows it.
            + [acl(ResourceType.TOPIC, "orders-eu", AclOperation.READ, permission=DENY)]
        )
        assert len(await admin.describe_acls()) == 4

    async with AsyncProducer(s.client, acks="all", linger_ms=0, **alice) as producer:  # type: ignore[arg-type]
        for i in range(5):
            await producer.send_and_wait("orders", b"o%d" % i, partition=0)
        await producer.send_and_wait("orders-eu", b"eu", partition=0)  # Write is not denied
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait("payroll", b"x", partition=0)
    async with AsyncAdmin(s.client, **alice) as admin:  # type: ignore[arg-type]
        assert sorted(await admin.list_topics()) == ["orders", "orders-eu"]  # Write => Describe

    async with AsyncConsumer(
        s.client,
        group_id="alice-app",
        auto_offset_reset="earliest",
        **alice,  # type: ignore[arg-type]
    ) as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        got: list[bytes] = []
        while len(got) < 5:
            batch = await consumer.poll(timeout_ms=5_000)
            assert batch, f"read {len(got)} of 5"
            got += [r.value for records in batch.values() for r in records]
        assert got == [b"o%d" % i for i in range(5)]
        await consumer.commit()
    # Read on a topic is a consumer's view: the debugging replica's (past the high
    # watermark, uncommitted records) needs ClusterAction.
    host, port = s.client.rsplit(":", 1)
    raw = RpcClient(
        host,
        int(port),
        name="broker",
        client_id="acl-test",
        sasl=SaslCredentials("SCRAM-SHA-256", "alice", PASSWORD),
    )
    try:
        fetch = FetchRequest(
            replica_id=DEBUGGING_REPLICA_ID,
            max_wait_ms=0,
            topics=[
                FetchTopic(topic="orders", partitions=[FetchPartition(partition=0, fetch_offset=0)])
            ],
        )
        with pytest.raises(RpcErrorResponse, match="past the high watermark") as refused:
            await raw.request(fetch)
        assert refused.value.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    finally:
        await raw.close()
    for topic in ("orders-eu", "payroll"):
        async with AsyncConsumer(s.client, auto_offset_reset="earliest", **alice) as consumer:  # type: ignore[arg-type]
            consumer.assign([TopicPartition(topic, 0)])
            with pytest.raises(TopicAuthorizationFailedError):
                for _ in range(5):
                    await consumer.poll(timeout_ms=1_000)
    async with AsyncConsumer(
        s.client,
        group_id="someone-elses",
        auto_offset_reset="earliest",
        **alice,  # type: ignore[arg-type]
    ) as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        with pytest.raises(GroupAuthorizationFailedError):  # its committed offsets
            await consumer.poll(timeout_ms=1_000)

    # Removing the ACLs closes it again.
    async with s.admin() as admin:
        removed = await admin.delete_acls([AclFilter(principal="User:alice")])
        assert len(removed) == 4
        assert await admin.describe_acls() == []
    async with AsyncProducer(
        s.client,
        acks="all",
        enable_idempotence=False,
        **alice,  # type: ignore[arg-type]
    ) as producer:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait("orders", b"late", partition=0)


async def test_kafka_python_gets_kafkas_refusals_and_then_its_records(secured: Secured) -> None:
    s = secured
    await setup_topics_and_alice(s, "k-orders")
    security = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }
    producer = KafkaProducer(bootstrap_servers=s.kafka, **security)
    try:
        with pytest.raises(KafkaTopicAuthorizationFailed):
            producer.send("k-orders", b"x", partition=0).get(timeout=30)
    finally:
        producer.close()
    async with s.admin() as admin:
        await admin.create_acls(
            [
                acl(ResourceType.TOPIC, "k-orders", op)
                for op in (AclOperation.WRITE, AclOperation.READ)
            ]
        )
    producer = KafkaProducer(bootstrap_servers=s.kafka, **security)
    producer.send("k-orders", b"granted", partition=0).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=s.kafka,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
        **security,
    )
    consumer.assign([KTopicPartition("k-orders", 0)])
    assert [m.value for m in itertools.islice(consumer, 1)] == [b"granted"]
    consumer.close()


async def test_a_client_cannot_call_server_apis_nor_a_server_pose_as_another(
    secured: Secured, tmp_path: Path
) -> None:
    s = secured
    await setup_topics_and_alice(s, "replicated")
    c = s.cluster
    assert c.controller is not None
    # A certificate of the cluster's own CA, but not a server's: a client principal.
    mallory = s.ca.issue("mallory")
    mallory_tls = create_ssl_context(
        cafile=s.ca.cafile, certfile=mallory.certfile, keyfile=mallory.keyfile
    )
    async with AsyncAdmin(s.internal, security_protocol="SSL", ssl_context=mallory_tls) as admin:
        assert await admin.list_topics() == []
        with pytest.raises(TopicAuthorizationFailedError):
            await admin.create_topic("mallorys", 1, 1)

    async def heartbeat(tls: ssl.SSLContext) -> ErrorCode:
        assert c.controller is not None
        async with TestClient(c.controller.host, c.controller.port, ssl=tls) as raw:
            answer = await raw.request(
                BrokerHeartbeatRequest(broker_id=1, broker_epoch=-1, want_shut_down=True)
            )
        return answer.error_code

    async def replica_fetch(tls: ssl.SSLContext) -> ErrorCode:
        host, port = c.brokers[1].address
        fetch = FetchRequest(
            replica_id=1,
            max_wait_ms=0,
            topics=[
                FetchTopic(
                    topic="replicated", partitions=[FetchPartition(partition=0, fetch_offset=0)]
                )
            ],
        )
        async with TestClient(host, port, ssl=tls) as raw:
            answer = await raw.request(fetch)
        return answer.error_code

    # The issue's spoofed heartbeat and follower Fetch: refused from a client principal.
    assert await heartbeat(mallory_tls) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert await replica_fetch(mallory_tls) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # Nor can it vote in the controller quorum, or read the metadata log as a voter.
    async with TestClient(c.controller.host, c.controller.port, ssl=mallory_tls) as raw:
        for quorum_rpc in (
            VoteRequest(
                candidate_id=7, candidate_epoch=99, last_offset_epoch=99, last_offset=10**9
            ),
            QuorumFetchRequest(replica_id=7, current_leader_epoch=1, fetch_offset=0),
        ):
            answer = await raw.request(quorum_rpc)
            assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, quorum_rpc
    # A server (ClusterAction granted) that is not broker 1 cannot speak for it either.
    impostor = s.ca.issue("broker-9")
    impostor_tls = create_ssl_context(
        cafile=s.ca.cafile, certfile=impostor.certfile, keyfile=impostor.keyfile
    )
    async with s.admin() as admin:
        await admin.create_acls(
            [
                acl(
                    ResourceType.CLUSTER,
                    CLUSTER_NAME,
                    AclOperation.CLUSTER_ACTION,
                    principal="User:CN=broker-9",
                )
            ]
        )
    assert await heartbeat(impostor_tls) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    async with TestClient(c.controller.host, c.controller.port, ssl=impostor_tls) as raw:
        takeover = await raw.request(
            BrokerRegistrationRequest(
                broker_id=1,
                incarnation_id="impostor",
                listeners=[Listener(name="PLAINTEXT", host="127.0.0.1", port=1)],
            )
        )
    assert takeover.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert await replica_fetch(impostor_tls) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # Broker 1 itself is untouched: still registered, unfenced, serving.
    async with s.admin() as admin:
        (broker,) = (await admin.describe_cluster()).brokers
        assert broker.node_id == 1 and not broker.is_fenced
    assert "refused: User:CN=mallory" in c.controller.log_text()


async def test_a_client_refused_a_broker_api_does_not_keep_a_brokers_slot(
    tmp_path: Path,
) -> None:
    """The controller keeps slots for brokers (a connection whose first request is a
    broker API), which neither the per-address nor the clients' bound counts and
    idleness never closes. A client principal refused its broker API is closed after
    the answer: it held the slot, and a user of the cluster filled --max-connections
    with refused heartbeats so that no one else, a broker or the operator, got in."""
    most = 8
    limits = ("--max-connections", str(most), "--reserved-broker-connections", "4")
    with secured_cluster(tmp_path, *limits, "--max-connections-per-ip", "2") as s:
        c = s.cluster
        assert c.controller is not None
        mallory = s.ca.issue("mallory")
        mallory_tls = create_ssl_context(
            cafile=s.ca.cafile, certfile=mallory.certfile, keyfile=mallory.keyfile
        )
        heartbeat = BrokerHeartbeatRequest(broker_id=1, broker_epoch=-1, want_shut_down=True)
        async with contextlib.AsyncExitStack() as held:  # mallory closes none of them
            for _ in range(most * 2):
                mallorys = await held.enter_async_context(
                    TestClient(c.controller.host, c.controller.port, ssl=mallory_tls)
                )
                answer = await mallorys.request(heartbeat)
                assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            # The operator's tool still gets in, and the broker stays registered.
            async with TestClient(c.controller.host, c.controller.port, ssl=s.admin_tls) as raw:
                described = await raw.call(DescribeClusterRequest())
                assert isinstance(described, DescribeClusterResponse)
            with pytest.raises(ConnectionError):  # closed by the controller
                await mallorys.receive(mallorys.send(heartbeat), timeout=5)
        async with s.admin() as admin:
            (broker,) = (await admin.describe_cluster()).brokers
            assert broker.node_id == 1 and not broker.is_fenced
        assert "and its BROKER_HEARTBEAT was refused" in c.controller.log_text()


async def test_acl_cli_adds_lists_and_removes(secured: Secured) -> None:
    """`minibroker acl` as the operator: a SASL user named in --super-users."""
    s = secured
    await setup_topics_and_alice(s, "cli-topic")
    async with s.admin() as admin:
        await admin.create_user("admin", "admin-secret")
    cli = [
        *("-b", s.client, "--security-protocol", "SASL_PLAINTEXT"),
        *("--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "admin"),
    ]
    env = {**CLI_ENV, "MINIBROKER_CLIENT_SASL_PASSWORD": "admin-secret"}

    def mb_admin(*args: str) -> tuple[int, str, str]:
        done = run_command([*CLI, *cli, *args], timeout=60, env=env)
        return done.returncode, done.stdout, done.stderr

    code, out, err = mb_admin(
        "acl",
        "add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "read",
        "--operation",
        "Write",
        "--topic",
        "cli-",
        "--resource-pattern-type",
        "prefixed",
    )
    assert code == 0, err
    assert "2 ACL(s) in place" in err
    code, out, err = mb_admin(
        "acl", "list", "--topic", "cli-topic", "--resource-pattern-type", "match"
    )
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()[1:]]
    assert sorted(r[5] for r in rows) == ["Read", "Write"]
    assert {(r[0], r[1], r[2], r[3]) for r in rows} == {("Topic", "cli-", "Prefixed", "User:alice")}
    # Bad input: one clear line naming what is accepted, nothing sent.
    code, out, err = mb_admin(
        "acl", "add", "--allow-principal", "User:alice", "--operation", "Fly", "--topic", "t"
    )
    assert code == 2 and "'Fly' is not an ACL operation" in err
    code, out, err = mb_admin(
        "acl", "add", "--allow-principal", "alice", "--operation", "Read", "--topic", "t"
    )
    assert code != 0 and "User:<name>" in err
    code, out, err = mb_admin("acl", "remove")
    assert code == 2 and "--all" in err
    code, out, err = mb_admin("acl", "remove", "--principal", "User:alice")
    assert code == 0 and "2 ACL(s) removed" in err, err
    code, out, err = mb_admin("acl", "list")
    assert code == 0 and "no ACLs" in err
    # A user who is not a super user may not manage ACLs.
    env["MINIBROKER_CLIENT_SASL_PASSWORD"] = PASSWORD
    cli[cli.index("admin")] = "alice"
    code, out, err = mb_admin("acl", "list")
    assert code == 1 and "Describe on the cluster" in err, err
