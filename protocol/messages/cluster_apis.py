"""What brokers and the controller say to each other, and the operator APIs:
AlterPartition (KIP-903), registration, heartbeats, FetchMetadata, DescribeCluster,
CreateTopics, DeleteTopics, ElectLeaders, the test-only fault controls, replica log
inspection and log directories; and the registry (API_SPECS) of every API's request and
response types."""

from __future__ import annotations

import msgspec

from protocol.api import ELECTION_UNCLEAN
from protocol.api import ApiKey
from protocol.messages import client_apis as c
from protocol.messages import group_apis as g
from protocol.messages import quorum_apis as q
from protocol.messages import quota_apis as qa
from protocol.messages import security_apis as sec
from protocol.messages.client_apis import Message
from protocol.messages.quorum_apis import MetadataEntry

__all__ = [
    "API_BY_REQUEST_TYPE",
    "API_SPECS",
    "AlterPartitionPartition",
    "AlterPartitionPartitionResult",
    "AlterPartitionRequest",
    "AlterPartitionResponse",
    "AlterPartitionTopic",
    "AlterPartitionTopicResult",
    "ApiSpec",
    "BrokerHeartbeatRequest",
    "BrokerHeartbeatResponse",
    "BrokerRegistrationRequest",
    "BrokerRegistrationResponse",
    "BrokerState",
    "CreatableReplicaAssignment",
    "CreatableTopic",
    "CreatableTopicResult",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeletableTopicResult",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribeClusterBroker",
    "DescribeClusterRequest",
    "DescribeClusterResponse",
    "DescribeLogDirsPartition",
    "DescribeLogDirsRequest",
    "DescribeLogDirsResponse",
    "DescribeLogDirsResult",
    "DescribeLogDirsTopic",
    "DescribeLogDirsTopicResult",
    "DescribeReplicaLogRequest",
    "DescribeReplicaLogResponse",
    "ElectLeadersPartition",
    "ElectLeadersRequest",
    "ElectLeadersResponse",
    "ElectLeadersResult",
    "EpochStartOffset",
    "FaultControlRequest",
    "FaultControlResponse",
    "FaultRule",
    "FetchMetadataRequest",
    "FetchMetadataResponse",
    "Listener",
    "ReplicaBatchInfo",
    "StrayReplica",
]


# ------------------------------------------------------------------ AlterPartition (KIP-903)


class BrokerState(Message, kw_only=True):
    broker_id: int
    broker_epoch: int = -1


class AlterPartitionPartition(Message, kw_only=True):
    partition_index: int
    leader_epoch: int
    new_isr_with_epochs: list[BrokerState]
    leader_recovery_state: int = 0
    partition_epoch: int


class AlterPartitionTopic(Message, kw_only=True):
    topic_name: str
    partitions: list[AlterPartitionPartition]


class AlterPartitionRequest(Message, kw_only=True):
    broker_id: int
    broker_epoch: int
    topics: list[AlterPartitionTopic]


class AlterPartitionPartitionResult(Message, kw_only=True):
    partition_index: int
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = -1
    isr: list[int] = []
    leader_recovery_state: int = 0
    partition_epoch: int = -1


class AlterPartitionTopicResult(Message, kw_only=True):
    topic_name: str
    partitions: list[AlterPartitionPartitionResult]


class AlterPartitionResponse(Message, kw_only=True):
    error_code: int = 0
    topics: list[AlterPartitionTopicResult] = []


# ------------------------------------------------------------------ broker lifecycle


class Listener(Message, kw_only=True):
    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


class BrokerRegistrationRequest(Message, kw_only=True):
    broker_id: int
    # The cluster id in the broker's meta.properties; None when it has none (a first
    # start, or a data directory lost or wiped): then the directory holds no replica,
    # and a controller that knew the broker takes it out of every ISR.
    cluster_id: str | None = None
    incarnation_id: str  # new for every process start
    listeners: list[Listener]
    rack: str | None = None
    clean_shutdown: bool = False
    previous_broker_epoch: int = -1


class BrokerRegistrationResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    broker_epoch: int = -1
    cluster_id: str = ""


class BrokerHeartbeatRequest(Message, kw_only=True):
    broker_id: int
    broker_epoch: int
    current_metadata_offset: int = -1
    want_fence: bool = False
    want_shut_down: bool = False
    # Log directories that failed (KIP-858's OfflineLogDirs, by path): the broker
    # then also asks to be fenced, and "<path>: <error>" says why in the controller's log.
    offline_log_dirs: list[str] = []


class BrokerHeartbeatResponse(Message, kw_only=True):
    error_code: int = 0
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False


class FetchMetadataRequest(Message, kw_only=True):
    broker_id: int
    broker_epoch: int = -1
    from_offset: int  # next offset the broker wants
    max_wait_ms: int = 500
    max_records: int = 10_000


class FetchMetadataResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    # The controller's cluster; a broker applies nothing of another cluster's.
    cluster_id: str = ""
    # When `is_snapshot`, the broker must discard its image and rebuild it from
    # `entries`, which describe the whole state as of `next_offset - 1`.
    is_snapshot: bool = False
    entries: list[MetadataEntry] = []
    next_offset: int = 0
    high_watermark: int = 0


class DescribeClusterRequest(Message, kw_only=True):
    include_fenced_brokers: bool = True


class DescribeClusterBroker(Message, kw_only=True):
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False
    broker_epoch: int = -1


class DescribeClusterResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    cluster_id: str = ""
    controller_id: int = -1
    brokers: list[DescribeClusterBroker] = []
    metadata_offset: int = -1


# ------------------------------------------------------------------ topics


class CreatableReplicaAssignment(Message, kw_only=True):
    partition_index: int
    broker_ids: list[int]


class CreatableTopic(Message, kw_only=True):
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: list[CreatableReplicaAssignment] = []
    configs: dict[str, str] = {}


class CreateTopicsRequest(Message, kw_only=True):
    topics: list[CreatableTopic]
    timeout_ms: int = 30_000
    validate_only: bool = False


class CreatableTopicResult(Message, kw_only=True):
    name: str
    topic_id: str = ""
    error_code: int = 0
    error_message: str | None = None
    num_partitions: int = -1
    replication_factor: int = -1


class CreateTopicsResponse(Message, kw_only=True):
    topics: list[CreatableTopicResult] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class DeleteTopicsRequest(Message, kw_only=True):
    topic_names: list[str]
    timeout_ms: int = 30_000


class DeletableTopicResult(Message, kw_only=True):
    name: str
    error_code: int = 0
    error_message: str | None = None


class DeleteTopicsResponse(Message, kw_only=True):
    responses: list[DeletableTopicResult] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class ElectLeadersPartition(Message, kw_only=True):
    topic: str
    partition: int
    # The replica to elect; -1: the controller picks a live one, replicas known to
    # have lost their data last.
    replica: int = -1


class ElectLeadersRequest(Message, kw_only=True):
    """Kafka's ElectLeaders (API 43). UNCLEAN, for leaderless partitions: the
    operator's way out when no in-sync replica can come back (e.g. the last one lost its
    disk). PREFERRED: back to each partition's preferred replica where it is in sync
    (no partitions named: every partition of the cluster)."""

    election_type: int = ELECTION_UNCLEAN
    partitions: list[ElectLeadersPartition] = []
    timeout_ms: int = 30_000


class ElectLeadersResult(Message, kw_only=True):
    topic: str
    partition: int
    error_code: int = 0
    error_message: str | None = None
    leader: int = -1
    leader_epoch: int = -1


class ElectLeadersResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    results: list[ElectLeadersResult] = []


# ------------------------------------------------------------------ test-only fault controls


class FaultRule(Message, kw_only=True):
    """One injected fault at a node. `direction` "in" acts on requests the node
    receives, "out" on requests it sends. Actions: "delay" (wait delay_ms, then go
    on), "drop" (lose the request: an incoming one is discarded and its connection
    closed, an outgoing one fails as a network error), "drop_response" (serve the
    request, then close the connection instead of answering), "hold" (park the
    request until a FaultControl with release_held)."""

    api_key: int
    action: str
    direction: str = "in"
    delay_ms: int = 0
    peer_id: int = -1  # only requests to/from this node (-1: any)
    remaining: int = -1  # applies this many more times (-1: until cleared)


class FaultControlRequest(Message, kw_only=True):
    clear: bool = False  # drop every rule first (held requests are released)
    add_rules: list[FaultRule] = []
    release_held: bool = False


class FaultControlResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    rules: list[FaultRule] = []
    held: int = 0  # requests parked right now
    protections_off: list[str] = []  # protections this process was started without


# ------------------------------------------------------------------ replica log inspection


class DescribeReplicaLogRequest(Message, kw_only=True):
    topic: str
    partition: int
    include_batches: bool = True
    max_batches: int = 100_000


class ReplicaBatchInfo(Message, kw_only=True):
    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    size: int


class EpochStartOffset(Message, kw_only=True):
    epoch: int
    start_offset: int


class DescribeReplicaLogResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    log_start_offset: int = -1
    log_end_offset: int = -1
    high_watermark: int = -1
    leader_id: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: list[int] = []
    epoch_entries: list[EpochStartOffset] = []
    batches: list[ReplicaBatchInfo] = []


# ------------------------------------------------------------------ log dirs


class DescribeLogDirsTopic(Message, kw_only=True):
    topic: str
    partitions: list[int]


class DescribeLogDirsRequest(Message, kw_only=True):
    """Kafka's DescribeLogDirs (api key 35): what a broker holds on disk."""

    topics: list[DescribeLogDirsTopic] | None = None  # None: every partition


class DescribeLogDirsPartition(Message, kw_only=True):
    partition_index: int
    partition_size: int = 0  # bytes of its segments
    offset_lag: int = 0  # Kafka's: max(0, high watermark - log end offset)
    is_future_key: bool = False  # no future replicas here (no intra-broker moves)
    topic_id: str | None = None  # from partition.metadata


class DescribeLogDirsTopicResult(Message, kw_only=True):
    name: str
    partitions: list[DescribeLogDirsPartition] = []


class StrayReplica(Message, kw_only=True):
    """A replica directory set aside as `<topic>-<partition>.<uuid>-stray`: not served,
    never deleted automatically (broker/storage/log_manager.py)."""

    dir_name: str
    topic: str
    partition: int
    topic_id: str | None = None
    size_bytes: int = 0


class DescribeLogDirsResult(Message, kw_only=True):
    # Per log dir, so that an offline dir can answer KAFKA_STORAGE_ERROR on its own.
    error_code: int = 0
    error_message: str | None = None
    log_dir: str
    topics: list[DescribeLogDirsTopicResult] = []
    total_bytes: int = -1
    usable_bytes: int = -1
    strays: list[StrayReplica] = []


class DescribeLogDirsResponse(Message, kw_only=True):
    error_code: int = 0
    results: list[DescribeLogDirsResult] = []


# ------------------------------------------------------------------ the registry


class ApiSpec(msgspec.Struct, frozen=True):
    key: ApiKey
    request: type[c.Message]
    response: type[c.Message]
    min_version: int = 0
    max_version: int = 0


API_SPECS: dict[int, ApiSpec] = {
    spec.key: spec
    for spec in (
        ApiSpec(ApiKey.PRODUCE, c.ProduceRequest, c.ProduceResponse),
        ApiSpec(ApiKey.FETCH, c.FetchRequest, c.FetchResponse),
        ApiSpec(ApiKey.LIST_OFFSETS, c.ListOffsetsRequest, c.ListOffsetsResponse),
        ApiSpec(ApiKey.METADATA, c.MetadataRequest, c.MetadataResponse),
        ApiSpec(ApiKey.OFFSET_COMMIT, c.OffsetCommitRequest, c.OffsetCommitResponse),
        ApiSpec(ApiKey.OFFSET_FETCH, c.OffsetFetchRequest, c.OffsetFetchResponse),
        ApiSpec(ApiKey.FIND_COORDINATOR, c.FindCoordinatorRequest, c.FindCoordinatorResponse),
        ApiSpec(ApiKey.JOIN_GROUP, g.JoinGroupRequest, g.JoinGroupResponse),
        ApiSpec(ApiKey.SYNC_GROUP, g.SyncGroupRequest, g.SyncGroupResponse),
        ApiSpec(ApiKey.HEARTBEAT, g.HeartbeatRequest, g.HeartbeatResponse),
        ApiSpec(ApiKey.LEAVE_GROUP, g.LeaveGroupRequest, g.LeaveGroupResponse),
        ApiSpec(ApiKey.DESCRIBE_GROUPS, g.DescribeGroupsRequest, g.DescribeGroupsResponse),
        ApiSpec(ApiKey.LIST_GROUPS, g.ListGroupsRequest, g.ListGroupsResponse),
        ApiSpec(ApiKey.DELETE_GROUPS, g.DeleteGroupsRequest, g.DeleteGroupsResponse),
        ApiSpec(ApiKey.API_VERSIONS, c.ApiVersionsRequest, c.ApiVersionsResponse),
        ApiSpec(ApiKey.CREATE_TOPICS, CreateTopicsRequest, CreateTopicsResponse),
        ApiSpec(ApiKey.DELETE_TOPICS, DeleteTopicsRequest, DeleteTopicsResponse),
        ApiSpec(ApiKey.INIT_PRODUCER_ID, c.InitProducerIdRequest, c.InitProducerIdResponse),
        ApiSpec(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            c.OffsetForLeaderEpochRequest,
            c.OffsetForLeaderEpochResponse,
        ),
        ApiSpec(ApiKey.ALTER_PARTITION, AlterPartitionRequest, AlterPartitionResponse),
        ApiSpec(ApiKey.DESCRIBE_CLUSTER, DescribeClusterRequest, DescribeClusterResponse),
        ApiSpec(
            ApiKey.BROKER_REGISTRATION,
            BrokerRegistrationRequest,
            BrokerRegistrationResponse,
        ),
        ApiSpec(ApiKey.BROKER_HEARTBEAT, BrokerHeartbeatRequest, BrokerHeartbeatResponse),
        ApiSpec(ApiKey.FETCH_METADATA, FetchMetadataRequest, FetchMetadataResponse),
        ApiSpec(
            ApiKey.ALLOCATE_PRODUCER_IDS,
            c.AllocateProducerIdsRequest,
            c.AllocateProducerIdsResponse,
        ),
        ApiSpec(ApiKey.FAULT_CONTROL, FaultControlRequest, FaultControlResponse),
        ApiSpec(
            ApiKey.DESCRIBE_REPLICA_LOG,
            DescribeReplicaLogRequest,
            DescribeReplicaLogResponse,
        ),
        ApiSpec(ApiKey.DESCRIBE_LOG_DIRS, DescribeLogDirsRequest, DescribeLogDirsResponse),
        ApiSpec(ApiKey.ELECT_LEADERS, ElectLeadersRequest, ElectLeadersResponse),
        ApiSpec(ApiKey.VOTE, q.VoteRequest, q.VoteResponse),
        ApiSpec(ApiKey.BEGIN_QUORUM_EPOCH, q.BeginQuorumEpochRequest, q.BeginQuorumEpochResponse),
        ApiSpec(ApiKey.END_QUORUM_EPOCH, q.EndQuorumEpochRequest, q.EndQuorumEpochResponse),
        ApiSpec(ApiKey.DESCRIBE_QUORUM, q.DescribeQuorumRequest, q.DescribeQuorumResponse),
        ApiSpec(ApiKey.FETCH_SNAPSHOT, q.FetchSnapshotRequest, q.FetchSnapshotResponse),
        ApiSpec(ApiKey.QUORUM_FETCH, q.QuorumFetchRequest, q.QuorumFetchResponse),
        ApiSpec(ApiKey.SASL_HANDSHAKE, sec.SaslHandshakeRequest, sec.SaslHandshakeResponse),
        ApiSpec(
            ApiKey.SASL_AUTHENTICATE, sec.SaslAuthenticateRequest, sec.SaslAuthenticateResponse
        ),
        ApiSpec(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            sec.DescribeUserScramCredentialsRequest,
            sec.DescribeUserScramCredentialsResponse,
        ),
        ApiSpec(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            sec.AlterUserScramCredentialsRequest,
            sec.AlterUserScramCredentialsResponse,
        ),
        ApiSpec(ApiKey.DESCRIBE_ACLS, sec.DescribeAclsRequest, sec.DescribeAclsResponse),
        ApiSpec(ApiKey.CREATE_ACLS, sec.CreateAclsRequest, sec.CreateAclsResponse),
        ApiSpec(ApiKey.DELETE_ACLS, sec.DeleteAclsRequest, sec.DeleteAclsResponse),
        ApiSpec(
            ApiKey.DESCRIBE_CLIENT_QUOTAS,
            qa.DescribeClientQuotasRequest,
            qa.DescribeClientQuotasResponse,
        ),
        ApiSpec(
            ApiKey.ALTER_CLIENT_QUOTAS,
            qa.AlterClientQuotasRequest,
            qa.AlterClientQuotasResponse,
        ),
    )
}

API_BY_REQUEST_TYPE: dict[type[c.Message], ApiSpec] = {s.request: s for s in API_SPECS.values()}
