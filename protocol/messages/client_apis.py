"""What clients send, and the parts every body shares: the base class, ApiVersions,
Metadata (KIP-232), Produce (KIP-359), Fetch (KIP-320, KIP-903), ListOffsets,
OffsetsForLeaderEpoch, the group coordinator's committed offsets (with their leader
epochs) and the producer ids of the idempotent producer."""

from __future__ import annotations

import msgspec

__all__ = [
    "AllocateProducerIdsRequest",
    "AllocateProducerIdsResponse",
    "ApiVersionRange",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "EpochEndOffset",
    "EpochEndOffsetResult",
    "ErrorBody",
    "FetchPartition",
    "FetchPartitionResponse",
    "FetchRequest",
    "FetchResponse",
    "FetchTopic",
    "FetchTopicResponse",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "ForgottenTopic",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "LeaderIdAndEpoch",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "Message",
    "MetadataBroker",
    "MetadataPartition",
    "MetadataRequest",
    "MetadataResponse",
    "MetadataTopic",
    "OffsetCommitPartition",
    "OffsetCommitPartitionResponse",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetCommitTopic",
    "OffsetCommitTopicResponse",
    "OffsetFetchPartitionResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "OffsetFetchTopic",
    "OffsetFetchTopicResponse",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderPartition",
    "OffsetForLeaderTopic",
    "OffsetForLeaderTopicResult",
    "ProducePartition",
    "ProducePartitionResponse",
    "ProduceRequest",
    "ProduceResponse",
    "ProduceTopic",
    "ProduceTopicResponse",
]


class Message(msgspec.Struct, kw_only=True):
    """Base of every request and response body."""


# ------------------------------------------------------------------ shared parts


class ErrorBody(Message, kw_only=True):
    """Body of a response whose header carries a non-zero error code."""

    error_message: str = ""


class LeaderIdAndEpoch(Message, kw_only=True):
    leader_id: int = -1
    leader_epoch: int = -1


class EpochEndOffset(Message, kw_only=True):
    epoch: int = -1
    end_offset: int = -1


# ------------------------------------------------------------------ ApiVersions


class ApiVersionsRequest(Message, kw_only=True):
    client_software_name: str = "minibroker"
    client_software_version: str = ""


class ApiVersionRange(Message, kw_only=True):
    api_key: int
    min_version: int
    max_version: int


class ApiVersionsResponse(Message, kw_only=True):
    error_code: int = 0
    api_keys: list[ApiVersionRange] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


# ------------------------------------------------------------------ Metadata (KIP-232)


class MetadataRequest(Message, kw_only=True):
    topics: list[str] | None = None  # None: all topics
    allow_auto_topic_creation: bool = False


class MetadataBroker(Message, kw_only=True):
    node_id: int
    host: str
    port: int
    rack: str | None = None


class MetadataPartition(Message, kw_only=True):
    error_code: int = 0
    partition_index: int
    leader_id: int = -1
    leader_epoch: int = -1
    replica_nodes: list[int] = []
    isr_nodes: list[int] = []
    offline_replicas: list[int] = []


class MetadataTopic(Message, kw_only=True):
    error_code: int = 0
    name: str
    topic_id: str = ""
    is_internal: bool = False
    partitions: list[MetadataPartition] = []


class MetadataResponse(Message, kw_only=True):
    brokers: list[MetadataBroker] = []
    cluster_id: str | None = None
    controller_id: int = -1
    topics: list[MetadataTopic] = []
    # Offset of the metadata log this answer reflects; lets tools see staleness.
    metadata_offset: int = -1
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


# ------------------------------------------------------------------ Produce (KIP-359)


class ProducePartition(Message, kw_only=True):
    index: int
    current_leader_epoch: int = -1
    records: memoryview  # see the module docstring; bytes are fine when sending


class ProduceTopic(Message, kw_only=True):
    name: str
    partitions: list[ProducePartition]


class ProduceRequest(Message, kw_only=True):
    transactional_id: str | None = None
    acks: int = -1
    timeout_ms: int = 30_000
    topics: list[ProduceTopic]


class ProducePartitionResponse(Message, kw_only=True):
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    current_leader: LeaderIdAndEpoch = msgspec.field(default_factory=LeaderIdAndEpoch)


class ProduceTopicResponse(Message, kw_only=True):
    name: str
    partitions: list[ProducePartitionResponse]


class ProduceResponse(Message, kw_only=True):
    topics: list[ProduceTopicResponse] = []
    throttle_time_ms: int = 0


# ------------------------------------------------------------------ Fetch (KIP-320, KIP-903)


class FetchPartition(Message, kw_only=True):
    partition: int
    current_leader_epoch: int = -1
    fetch_offset: int
    last_fetched_epoch: int = -1
    log_start_offset: int = -1
    partition_max_bytes: int = 1024 * 1024


class FetchTopic(Message, kw_only=True):
    topic: str
    partitions: list[FetchPartition]


class ForgottenTopic(Message, kw_only=True):
    topic: str
    partitions: list[int]


class FetchRequest(Message, kw_only=True, omit_defaults=True):
    replica_id: int = -1  # broker id of a follower, -1 for consumers
    replica_epoch: int = -1  # the follower's broker epoch (KIP-903)
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 * 1024 * 1024
    isolation_level: int = 0
    topics: list[FetchTopic]
    # Incremental fetch sessions (KIP-227), followers only (broker/fetch_sessions.py).
    # The defaults are a sessionless full fetch, which is what a peer that predates
    # sessions sends (unknown fields are ignored, missing ones take these defaults;
    # fields at their default are not encoded, so a sessionless fetch costs nothing).
    session_id: int = 0  # 0: none
    session_epoch: int = -1  # -1: no session (closes session_id); 0: full, new session
    forgotten: list[ForgottenTopic] = []  # incremental: partitions leaving the session


class FetchPartitionResponse(Message, kw_only=True):
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    diverging_epoch: EpochEndOffset = msgspec.field(default_factory=EpochEndOffset)
    current_leader: LeaderIdAndEpoch = msgspec.field(default_factory=LeaderIdAndEpoch)
    records: memoryview = memoryview(b"")  # see the module docstring


class FetchTopicResponse(Message, kw_only=True):
    topic: str
    partitions: list[FetchPartitionResponse]


class FetchResponse(Message, kw_only=True, omit_defaults=True):
    error_code: int = 0
    throttle_time_ms: int = 0
    responses: list[FetchTopicResponse] = []
    # The fetch session the answer belongs to; 0: sessionless (a full answer). An
    # incremental answer holds only the partitions with news (KIP-227).
    session_id: int = 0


# ------------------------------------------------------------------ ListOffsets (KIP-320)


class ListOffsetsPartition(Message, kw_only=True):
    partition_index: int
    current_leader_epoch: int = -1
    timestamp: int  # -2 earliest, -1 latest, else ms


class ListOffsetsTopic(Message, kw_only=True):
    name: str
    partitions: list[ListOffsetsPartition]


class ListOffsetsRequest(Message, kw_only=True):
    replica_id: int = -1
    isolation_level: int = 0
    topics: list[ListOffsetsTopic]


class ListOffsetsPartitionResponse(Message, kw_only=True):
    partition_index: int
    error_code: int = 0
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


class ListOffsetsTopicResponse(Message, kw_only=True):
    name: str
    partitions: list[ListOffsetsPartitionResponse]


class ListOffsetsResponse(Message, kw_only=True):
    topics: list[ListOffsetsTopicResponse] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


# ------------------------------------------------------------------ OffsetsForLeaderEpoch


class OffsetForLeaderPartition(Message, kw_only=True):
    partition: int
    current_leader_epoch: int = -1
    leader_epoch: int


class OffsetForLeaderTopic(Message, kw_only=True):
    topic: str
    partitions: list[OffsetForLeaderPartition]


class OffsetForLeaderEpochRequest(Message, kw_only=True):
    replica_id: int = -1
    topics: list[OffsetForLeaderTopic]


class EpochEndOffsetResult(Message, kw_only=True):
    partition: int
    error_code: int = 0
    leader_epoch: int = -1
    end_offset: int = -1


class OffsetForLeaderTopicResult(Message, kw_only=True):
    topic: str
    partitions: list[EpochEndOffsetResult]


class OffsetForLeaderEpochResponse(Message, kw_only=True):
    topics: list[OffsetForLeaderTopicResult] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


# ------------------------------------------------------------------ groups (KIP-320 epochs)


class FindCoordinatorRequest(Message, kw_only=True):
    key: str
    key_type: int = 0  # 0 group, 1 transaction


class FindCoordinatorResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class OffsetCommitPartition(Message, kw_only=True):
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1
    committed_metadata: str | None = None


class OffsetCommitTopic(Message, kw_only=True):
    name: str
    partitions: list[OffsetCommitPartition]


class OffsetCommitRequest(Message, kw_only=True):
    group_id: str
    generation_id: int = -1  # -1 with an empty member id: a consumer outside any group
    member_id: str = ""
    group_instance_id: str | None = None
    topics: list[OffsetCommitTopic]


class OffsetCommitPartitionResponse(Message, kw_only=True):
    partition_index: int
    error_code: int = 0


class OffsetCommitTopicResponse(Message, kw_only=True):
    name: str
    partitions: list[OffsetCommitPartitionResponse]


class OffsetCommitResponse(Message, kw_only=True):
    topics: list[OffsetCommitTopicResponse] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class OffsetFetchTopic(Message, kw_only=True):
    name: str
    partition_indexes: list[int]


class OffsetFetchRequest(Message, kw_only=True):
    group_id: str
    topics: list[OffsetFetchTopic] | None = None  # None: all committed


class OffsetFetchPartitionResponse(Message, kw_only=True):
    partition_index: int
    committed_offset: int = -1
    committed_leader_epoch: int = -1
    metadata: str | None = None
    error_code: int = 0


class OffsetFetchTopicResponse(Message, kw_only=True):
    name: str
    partitions: list[OffsetFetchPartitionResponse]


class OffsetFetchResponse(Message, kw_only=True):
    error_code: int = 0
    topics: list[OffsetFetchTopicResponse] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


# ------------------------------------------------------------------ idempotent producer


class InitProducerIdRequest(Message, kw_only=True):
    transactional_id: str | None = None
    transaction_timeout_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1


class InitProducerIdResponse(Message, kw_only=True):
    error_code: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class AllocateProducerIdsRequest(Message, kw_only=True):
    """Broker -> controller: a block of producer ids to hand out (KIP-730)."""

    broker_id: int
    broker_epoch: int = -1


class AllocateProducerIdsResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    producer_id_start: int = -1
    producer_id_len: int = 0
