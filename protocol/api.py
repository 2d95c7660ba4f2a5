"""API keys (Kafka's numbers where Kafka has the API) and the version ranges served."""

from __future__ import annotations

from enum import IntEnum


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DELETE_GROUPS = 42
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    ELECT_LEADERS = 43
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    ALLOCATE_PRODUCER_IDS = 67
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    # Kafka's brokers read the metadata log with Fetch against the KRaft quorum; we
    # have one controller and a dedicated long-poll API instead.
    FETCH_METADATA = 1000
    # Served only when the process runs with MINIBROKER_ENABLE_TEST_FAULTS=1.
    FAULT_CONTROL = 1001
    # Read-only view of one replica's log: batches and epoch cache (tests, chaos checker).
    DESCRIBE_REPLICA_LOG = 1002
    # A controller quorum voter reads the metadata log from the leader (KRaft uses
    # Fetch on its __cluster_metadata topic; ours has its own body).
    QUORUM_FETCH = 1003


def api_name(api_key: int) -> str:
    """The name of an API key for logs and errors ("FETCH"), also for an unknown one."""
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


# ElectLeaders election types (Kafka's numbers).
ELECTION_PREFERRED = 0
ELECTION_UNCLEAN = 1

# Sentinel accepted by every epoch field: skip that check (KIP-320 compatibility rule).
NO_EPOCH = -1
# ListOffsets special timestamps.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
# replica_id of a consumer in Fetch / ListOffsets / OffsetsForLeaderEpoch.
CONSUMER_REPLICA_ID = -1
# replica_id of a debugging tool that may read past the high watermark.
DEBUGGING_REPLICA_ID = -2
