"""The Kafka APIs a Kafka listener serves: per API its versions, the first flexible
version, and its request and response declared once (protocol/kafka/schema.py) onto
the native messages (protocol/messages), so the broker's handlers serve both listeners.

The versions served are the smallest set the real clients need
(../shared/kafka-clients.md, issue 15). Declarations: cluster_apis.py, data_apis.py,
group_apis.py (offsets), membership_apis.py (group membership), security_apis.py (SASL,
users), quota_apis.py (client quotas), acl_apis.py (ACLs).
"""

from __future__ import annotations

from protocol.kafka.acl_apis import CREATE_ACLS
from protocol.kafka.acl_apis import DELETE_ACLS
from protocol.kafka.acl_apis import DESCRIBE_ACLS
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.cluster_apis import API_VERSIONS
from protocol.kafka.cluster_apis import CREATE_TOPICS
from protocol.kafka.cluster_apis import DELETE_TOPICS
from protocol.kafka.cluster_apis import METADATA
from protocol.kafka.data_apis import FETCH
from protocol.kafka.data_apis import INIT_PRODUCER_ID
from protocol.kafka.data_apis import LIST_OFFSETS
from protocol.kafka.data_apis import OFFSET_FOR_LEADER_EPOCH
from protocol.kafka.data_apis import PRODUCE
from protocol.kafka.group_apis import FIND_COORDINATOR
from protocol.kafka.group_apis import OFFSET_COMMIT
from protocol.kafka.group_apis import OFFSET_FETCH
from protocol.kafka.membership_apis import DELETE_GROUPS
from protocol.kafka.membership_apis import DESCRIBE_GROUPS
from protocol.kafka.membership_apis import HEARTBEAT
from protocol.kafka.membership_apis import JOIN_GROUP
from protocol.kafka.membership_apis import LEAVE_GROUP
from protocol.kafka.membership_apis import LIST_GROUPS
from protocol.kafka.membership_apis import SYNC_GROUP
from protocol.kafka.quota_apis import ALTER_CLIENT_QUOTAS
from protocol.kafka.quota_apis import DESCRIBE_CLIENT_QUOTAS
from protocol.kafka.security_apis import ALTER_USER_SCRAM_CREDENTIALS
from protocol.kafka.security_apis import DESCRIBE_USER_SCRAM_CREDENTIALS
from protocol.kafka.security_apis import SASL_AUTHENTICATE
from protocol.kafka.security_apis import SASL_HANDSHAKE

__all__ = [
    "ALTER_CLIENT_QUOTAS",
    "ALTER_USER_SCRAM_CREDENTIALS",
    "API_VERSIONS",
    "CREATE_ACLS",
    "CREATE_TOPICS",
    "DELETE_ACLS",
    "DELETE_GROUPS",
    "DELETE_TOPICS",
    "DESCRIBE_ACLS",
    "DESCRIBE_CLIENT_QUOTAS",
    "DESCRIBE_GROUPS",
    "DESCRIBE_USER_SCRAM_CREDENTIALS",
    "FETCH",
    "FIND_COORDINATOR",
    "HEARTBEAT",
    "INIT_PRODUCER_ID",
    "JOIN_GROUP",
    "KAFKA_APIS",
    "LEAVE_GROUP",
    "LIST_GROUPS",
    "LIST_OFFSETS",
    "METADATA",
    "OFFSET_COMMIT",
    "OFFSET_FETCH",
    "OFFSET_FOR_LEADER_EPOCH",
    "PRODUCE",
    "SASL_AUTHENTICATE",
    "SASL_HANDSHAKE",
    "SYNC_GROUP",
    "KafkaApi",
]

KAFKA_APIS: dict[int, KafkaApi] = {
    int(api.key): api
    for api in (
        API_VERSIONS,
        METADATA,
        PRODUCE,
        FETCH,
        LIST_OFFSETS,
        OFFSET_FOR_LEADER_EPOCH,
        INIT_PRODUCER_ID,
        CREATE_TOPICS,
        DELETE_TOPICS,
        FIND_COORDINATOR,
        OFFSET_COMMIT,
        OFFSET_FETCH,
        JOIN_GROUP,
        SYNC_GROUP,
        HEARTBEAT,
        LEAVE_GROUP,
        DESCRIBE_GROUPS,
        LIST_GROUPS,
        DELETE_GROUPS,
        SASL_HANDSHAKE,
        SASL_AUTHENTICATE,
        DESCRIBE_CLIENT_QUOTAS,
        ALTER_CLIENT_QUOTAS,
        DESCRIBE_USER_SCRAM_CREDENTIALS,
        ALTER_USER_SCRAM_CREDENTIALS,
        DESCRIBE_ACLS,
        CREATE_ACLS,
        DELETE_ACLS,
    )
}
