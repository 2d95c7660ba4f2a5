"""Kafka's ACL APIs (DescribeAcls, CreateAcls, DeleteAcls) on the Kafka listener, from
Kafka's own admin clients, unmodified, on real processes: the secured cluster of
test_acls.py (mTLS between the servers, SCRAM users on a SASL_PLAINTEXT Kafka listener,
"User:admin" a super user), and a cluster without the authorizer.

Invariants:
- a super user's kafka-python KafkaAdminClient (create_acls / describe_acls /
  delete_acls with ACL, ResourcePattern, ACLFilter, ResourcePatternFilter) and
  confluent-kafka's AdminClient (AclBinding, AclBindingFilter) create, list and delete
  ACLs, the same ACLs `minibroker acl` sees;
- what they create takes effect: a SASL user who cannot read a topic reads it once
  granted (kafka-python and aiokafka consumers), and no more once the ACL is deleted;
- a user who is not a super user (no Alter / Describe on the cluster) is refused with
  Kafka's ClusterAuthorizationFailed by each API and changes nothing;
- without an authorizer each API answers Kafka's SecurityDisabled, which both clients
  raise as their own class / code.

librdkafka (confluent-kafka) drops the error code of a DescribeAcls answer whatever the
broker, Kafka's included: its describe_acls reads a refusal, and SecurityDisabled, as
an empty list. Its create_acls and delete_acls raise them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as ATopicPartition
from confluent_kafka import KafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AclBinding
from confluent_kafka.admin import AclBindingFilter
from confluent_kafka.admin import AclOperation as CAclOperation
from confluent_kafka.admin import AclPermissionType
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ResourcePatternType
from confluent_kafka.admin import ResourceType as CResourceType
from kafka import KafkaAdminClient
from kafka import KafkaConsumer
from kafka import KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.admin import ACL
from kafka.admin import ACLFilter
from kafka.admin import ACLOperation
from kafka.admin import ACLPermissionType
from kafka.admin import ACLResourcePatternType
from kafka.admin import ResourcePattern
from kafka.admin import ResourcePatternFilter
from kafka.admin import ResourceType
from kafka.errors import ClusterAuthorizationFailedError
from kafka.errors import NoError
from kafka.errors import SecurityDisabledError

from runtime.acl import AclFilter
from tests.integration.cluster import Cluster
from tests.integration.test_acls import PASSWORD
from tests.integration.test_acls import Secured
from tests.integration.test_acls import secured_cluster
from tests.integration.test_acls import setup_topics_and_alice

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ADMIN_PASSWORD = "admin-secret"  # "User:admin" is among test_acls.py's super users
RECORDS = [b"r%d" % i for i in range(3)]


def sasl(user: str, password: str) -> dict[str, str]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


# The same settings under librdkafka's names.
LIBRDKAFKA_NAMES = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
}


def librdkafka_sasl(user: str, password: str) -> dict[str, str]:
    return {LIBRDKAFKA_NAMES[k]: v for k, v in sasl(user, password).items()}


async def prepare(s: Secured, *topics: str) -> None:
    """The topics with RECORDS in each (written by the super user), alice, mallory and
    the admin user."""
    await setup_topics_and_alice(s, *topics)
    async with s.admin() as admin:
        await admin.create_user("admin", ADMIN_PASSWORD)
    producer = KafkaProducer(bootstrap_servers=s.kafka, **sasl("admin", ADMIN_PASSWORD))
    try:
        for topic in topics:
            for value in RECORDS:
                producer.send(topic, value, partition=0).get(timeout=30)
    finally:
        producer.close()


async def acls_minibroker_sees(s: Secured, principal: str) -> set[str]:
    async with s.admin() as admin:
        return {b.describe() for b in await admin.describe_acls(AclFilter(principal=principal))}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    with secured_cluster(tmp_path) as s:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a line per refusal
        yield s


# ------------------------------------------------------------------ kafka-python


def kafka_python_admin(s: Secured, user: str, password: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=s.kafka, **sasl(user, password))


def alice_reads(s: Secured, topic: str, want: int = len(RECORDS)) -> list[bytes]:
    """What alice's kafka-python consumer reads of `topic` in 5 s. A topic she may not
    describe is hidden from her Metadata (as Kafka hides it): her consumer waits for it
    and reads nothing."""
    consumer = KafkaConsumer(
        bootstrap_servers=s.kafka,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
        **sasl("alice", PASSWORD),
    )
    try:
        consumer.assign([KTopicPartition(topic, 0)])
        # Up to `want` records: a consumer that gets them stops at once, one that gets
        # nothing waits the 5 s out.
        return [m.value for m in itertools.islice(consumer, want)]
    finally:
        consumer.close()


ALICE_READS_KP = ACL(
    principal="User:alice",
    host="*",
    operation=ACLOperation.READ,
    permission_type=ACLPermissionType.ALLOW,
    resource_pattern=ResourcePattern(ResourceType.TOPIC, "kp-", ACLResourcePatternType.PREFIXED),
)
ALICE_DESCRIBES_GROUP = ACL(
    principal="User:alice",
    host="*",
    operation=ACLOperation.DESCRIBE,
    permission_type=ACLPermissionType.ALLOW,
    resource_pattern=ResourcePattern(ResourceType.GROUP, "kp-app"),  # LITERAL by default
)


def every_acl_of(principal: str | None) -> ACLFilter:
    return ACLFilter(
        principal=principal,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
    )


async def test_kafka_python_admin_creates_lists_and_deletes_acls_that_take_effect(
    secured: Secured,
) -> None:
    s = secured
    await prepare(s, "kp-orders")
    assert alice_reads(s, "kp-orders") == []

    admin = kafka_python_admin(s, "admin", ADMIN_PASSWORD)
    try:
        created = admin.create_acls([ALICE_READS_KP, ALICE_DESCRIBES_GROUP])
        assert created == {"succeeded": [ALICE_READS_KP, ALICE_DESCRIBES_GROUP], "failed": []}
        listed, error = admin.describe_acls(every_acl_of("User:alice"))
        assert error is NoError
        assert set(listed) == {ALICE_READS_KP, ALICE_DESCRIBES_GROUP}
        # A MATCH filter selects the PREFIXED ACL that applies to the topic's name.
        matching = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                ResourceType.TOPIC, "kp-orders", ACLResourcePatternType.MATCH
            ),
        )
        assert admin.describe_acls(matching)[0] == [ALICE_READS_KP]
        assert await acls_minibroker_sees(s, "User:alice") == {
            "Allow User:alice from * Read on Topic:kp-*",
            "Allow User:alice from * Describe on Group:kp-app",
        }

        # The granted ACL takes effect on the broker at once.
        assert alice_reads(s, "kp-orders") == RECORDS

        # Alice is no super user: each ACL API refused whole, nothing changed.
        alice_admin = kafka_python_admin(s, "alice", PASSWORD)
        try:
            with pytest.raises(ClusterAuthorizationFailedError):
                alice_admin.describe_acls(every_acl_of(None))
            mallory_reads = ACL(
                principal="User:mallory",
                host="*",
                operation=ACLOperation.READ,
                permission_type=ACLPermissionType.ALLOW,
                resource_pattern=ResourcePattern(ResourceType.TOPIC, "kp-orders"),
            )
            refused = alice_admin.create_acls([mallory_reads])
            assert refused == {"succeeded": [], "failed": [ClusterAuthorizationFailedError]}
            ((_, matched, error),) = alice_admin.delete_acls([every_acl_of("User:alice")])
            assert (matched, error) == ([], ClusterAuthorizationFailedError)
        finally:
            alice_admin.close()
        assert set(admin.describe_acls(every_acl_of(None))[0]) == {
            ALICE_READS_KP,
            ALICE_DESCRIBES_GROUP,
        }

        ((_, deleted, error),) = admin.delete_acls([every_acl_of("User:alice")])
        assert error is NoError
        assert set(deleted) == {ALICE_READS_KP, ALICE_DESCRIBES_GROUP}
        assert admin.describe_acls(every_acl_of(None)) == ([], NoError)
    finally:
        admin.close()
    assert await acls_minibroker_sees(s, "User:alice") == set()
    assert alice_reads(s, "kp-orders") == []


# ------------------------------------------------------------------ confluent-kafka


def confluent_admin(s: Secured, user: str, password: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": s.kafka, **librdkafka_sasl(user, password)})


async def mallory_reads(s: Secured, topic: str, within_s: float) -> list[bytes]:
    """What mallory's aiokafka consumer reads of `topic` within `within_s` (RECORDS at
    most). Refused the topic, aiokafka logs each refusal, keeps asking and reads
    nothing."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=s.kafka,
        auto_offset_reset="earliest",
        **sasl("mallory", "mallory-secret"),
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        consumer.assign([ATopicPartition(topic, 0)])
        deadline = asyncio.get_running_loop().time() + within_s
        while len(got) < len(RECORDS):
            left_ms = int((deadline - asyncio.get_running_loop().time()) * 1000)
            if left_ms <= 0:
                break
            batch = await consumer.getmany(timeout_ms=left_ms)
            got += [m.value for records in batch.values() for m in records]
        return got
    finally:
        await consumer.stop()


def error_code(future: Any) -> int:
    """The Kafka error code a confluent-kafka future failed with."""
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=30)
    code: int = raised.value.args[0].code()
    return code


MALLORY_READS = AclBinding(
    CResourceType.TOPIC,
    "cf-orders",
    ResourcePatternType.LITERAL,
    "User:mallory",
    "*",
    CAclOperation.READ,
    AclPermissionType.ALLOW,
)
EVERY_ACL = AclBindingFilter(
    CResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    CAclOperation.ANY,
    AclPermissionType.ANY,
)


async def test_confluent_admin_creates_lists_and_deletes_acls_that_take_effect(
    secured: Secured,
) -> None:
    s = secured
    await prepare(s, "cf-orders")
    assert await mallory_reads(s, "cf-orders", within_s=3) == []

    admin = confluent_admin(s, "admin", ADMIN_PASSWORD)
    futures = admin.create_acls([MALLORY_READS])
    assert futures[MALLORY_READS].result(timeout=30) is None
    assert admin.describe_acls(EVERY_ACL).result(timeout=30) == [MALLORY_READS]
    assert await acls_minibroker_sees(s, "User:mallory") == {
        "Allow User:mallory from * Read on Topic:cf-orders"
    }

    # The granted ACL takes effect on the broker at once.
    assert await mallory_reads(s, "cf-orders", within_s=30) == RECORDS

    # Alice is no super user: each ACL API refused whole, nothing changed.
    alice = confluent_admin(s, "alice", PASSWORD)
    denied = KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # librdkafka drops DescribeAcls' error code (rd_kafka_DescribeAclsResponse_parse
    # reads it into a local only), so its refusal reads as no ACL: mallory's ACL, which
    # the admin sees, is not shown to alice.
    assert alice.describe_acls(EVERY_ACL).result(timeout=30) == []
    alice_too = AclBinding(
        CResourceType.TOPIC,
        "cf-orders",
        ResourcePatternType.PREFIXED,
        "User:alice",
        "*",
        CAclOperation.ALL,
        AclPermissionType.ALLOW,
    )
    assert error_code(alice.create_acls([alice_too])[alice_too]) == denied
    assert error_code(alice.delete_acls([EVERY_ACL])[EVERY_ACL]) == denied
    assert admin.describe_acls(EVERY_ACL).result(timeout=30) == [MALLORY_READS]

    deleted = admin.delete_acls([EVERY_ACL])[EVERY_ACL].result(timeout=30)
    assert deleted == [MALLORY_READS]
    assert admin.describe_acls(EVERY_ACL).result(timeout=30) == []
    assert await acls_minibroker_sees(s, "User:mallory") == set()
    assert await mallory_reads(s, "cf-orders", within_s=3) == []


# ------------------------------------------------------------------ no authorizer


def test_without_an_authorizer_both_admin_clients_get_security_disabled(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)
    bootstrap = broker.kafka_address

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        with pytest.raises(SecurityDisabledError, match="--authorizer-enabled true"):
            admin.describe_acls(every_acl_of(None))
        assert admin.create_acls([ALICE_READS_KP]) == {
            "succeeded": [],
            "failed": [SecurityDisabledError],
        }
        ((_, matched, error),) = admin.delete_acls([every_acl_of(None)])
        assert (matched, error) == ([], SecurityDisabledError)
    finally:
        admin.close()

    confluent = AdminClient({"bootstrap.servers": bootstrap})
    disabled = KafkaError.SECURITY_DISABLED
    assert confluent.describe_acls(EVERY_ACL).result(timeout=30) == []  # librdkafka: see above
    assert error_code(confluent.create_acls([MALLORY_READS])[MALLORY_READS]) == disabled
    assert error_code(confluent.delete_acls([EVERY_ACL])[EVERY_ACL]) == disabled
