"""The Kafka APIs a Kafka listener serves: per API its versions, the first flexible
version, and its request and response declared once (protocol/kafka/schema.py) onto
the native messages (protocol/messages), so the broker's handlers serve both listeners.

Written from Kafka's protocol guide and message definitions (field names, types and
the versions each field exists in); the versions served are the smallest set the real
clients need (../shared/kafka-clients.md, issue 15).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.api import ApiKey
from protocol.kafka.schema import BOOL
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import INT64
from protocol.kafka.schema import RECORDS
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import ApiVersionRange
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import CreatableReplicaAssignment
from protocol.messages import CreatableTopic
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeletableTopicResult
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import EpochEndOffset
from protocol.messages import EpochEndOffsetResult
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import FetchTopicResponse
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from protocol.messages import LeaderIdAndEpoch
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopic
from protocol.messages import ListOffsetsTopicResponse
from protocol.messages import MetadataBroker
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderPartition
from protocol.messages import OffsetForLeaderTopic
from protocol.messages import OffsetForLeaderTopicResult
from protocol.messages import ProducePartition
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.messages import ProduceTopicResponse

# Kafka's "no authorized operations asked for" value.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


@dataclass(frozen=True)
class KafkaApi:
    key: ApiKey
    min_version: int
    max_version: int
    flexible_from: int  # the first version with compact types, tagged fields, header v2
    request: KStruct
    response: KStruct

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_from

    def response_header_flexible(self, version: int) -> bool:
        # ApiVersions answers with header v0 always: a client that sent a version the
        # broker does not know must still be able to read the answer.
        return self.flexible(version) and self.key != ApiKey.API_VERSIONS


def _no_throttle(versions: str) -> Field:
    """throttle_time_ms where the native answer has none: 0 (quotas come with issue 18)."""
    return Field("throttle_time_ms", INT32, versions, default=0, mapped=False)


def _names(topics: list[dict[str, Any]] | None) -> list[str] | None:
    return None if topics is None else [t["name"] for t in topics]


def _named(names: list[str] | None) -> list[dict[str, Any]] | None:
    return None if names is None else [{"name": n} for n in names]


def _all_when_empty_v0(topics: list[str] | None) -> list[str] | None:
    # Metadata v0 has no null: an empty list asks for every topic.
    return topics or None


API_VERSIONS = KafkaApi(
    ApiKey.API_VERSIONS,
    0,
    3,
    3,
    request=KStruct(
        ApiVersionsRequest,
        (
            Field("client_software_name", STRING, "3+"),
            Field("client_software_version", STRING, "3+"),
        ),
    ),
    response=KStruct(
        ApiVersionsResponse,
        (
            Field("error_code", INT16),
            Field(
                "api_keys",
                Array(
                    KStruct(
                        ApiVersionRange,
                        (
                            Field("api_key", INT16),
                            Field("min_version", INT16),
                            Field("max_version", INT16),
                        ),
                    )
                ),
            ),
            _no_throttle("1+"),
            Field("finalized_features_epoch", INT64, "3+", tag=1, default=-1, mapped=False),
        ),
    ),
)

_METADATA_TOPIC_NAME = KStruct(None, (Field("name", STRING),))

METADATA = KafkaApi(
    ApiKey.METADATA,
    0,
    9,
    9,
    request=KStruct(
        MetadataRequest,
        (
            Field(
                "topics",
                Array(_METADATA_TOPIC_NAME),
                "0",
                to_native=lambda t: _all_when_empty_v0(_names(t)),
                from_native=lambda names: _named(names or []),
            ),
            Field(
                "topics",
                Array(_METADATA_TOPIC_NAME),
                "1+",
                nullable="1+",
                to_native=_names,
                from_native=_named,
            ),
            Field("allow_auto_topic_creation", BOOL, "4+", default=True),
            Field("include_cluster_authorized_operations", BOOL, "8+", default=False, mapped=False),
            Field("include_topic_authorized_operations", BOOL, "8+", default=False, mapped=False),
        ),
    ),
    response=KStruct(
        MetadataResponse,
        (
            _no_throttle("3+"),
            Field(
                "brokers",
                Array(
                    KStruct(
                        MetadataBroker,
                        (
                            Field("node_id", INT32),
                            Field("host", STRING),
                            Field("port", INT32),
                            Field("rack", STRING, "1+", nullable="1+"),
                        ),
                    )
                ),
            ),
            Field("cluster_id", STRING, "2+", nullable="2+"),
            Field("controller_id", INT32, "1+"),
            Field(
                "topics",
                Array(
                    KStruct(
                        MetadataTopic,
                        (
                            Field("error_code", INT16),
                            Field("name", STRING),
                            Field("is_internal", BOOL, "1+"),
                            Field(
                                "partitions",
                                Array(
                                    KStruct(
                                        MetadataPartition,
                                        (
                                            Field("error_code", INT16),
                                            Field("partition_index", INT32),
                                            Field("leader_id", INT32),
                                            Field("leader_epoch", INT32, "7+"),
                                            Field("replica_nodes", Array(INT32)),
                                            Field("isr_nodes", Array(INT32)),
                                            Field("offline_replicas", Array(INT32), "5+"),
                                        ),
                                    )
                                ),
                            ),
                            Field(
                                "topic_authorized_operations",
                                INT32,
                                "8+",
                                default=AUTHORIZED_OPERATIONS_OMITTED,
                                mapped=False,
                            ),
                        ),
                    )
                ),
            ),
            Field(
                "cluster_authorized_operations",
                INT32,
                "8-10",
                default=AUTHORIZED_OPERATIONS_OMITTED,
                mapped=False,
            ),
        ),
    ),
)


def _topics(
    topic: type, partition: type, *fields: Field, name: str = "name", partitions: str = "partitions"
) -> Array:
    """The usual shape of a partitioned message: topics, each its name (`name`) and its
    partitions (`partitions`), each partition `fields`."""
    partition_struct = KStruct(partition, fields)
    return Array(KStruct(topic, (Field(name, STRING), Field(partitions, Array(partition_struct)))))


def _records(value: memoryview | None) -> memoryview:
    # A null record set is an empty one natively (and never sent: kafka-python
    # crashes on null records).
    return memoryview(b"") if value is None else value


_RECORDS = Field("records", RECORDS, nullable="0+", to_native=_records)
_RECORD_ERROR = KStruct(
    None, (Field("batch_index", INT32), Field("batch_index_error_message", STRING, nullable="0+"))
)
_FORGOTTEN_TOPIC = KStruct(None, (Field("topic", STRING), Field("partitions", Array(INT32))))
_ABORTED_TRANSACTION = KStruct(None, (Field("producer_id", INT64), Field("first_offset", INT64)))
_EPOCH_END_OFFSET = KStruct(EpochEndOffset, (Field("epoch", INT32), Field("end_offset", INT64)))
_LEADER_ID_AND_EPOCH = KStruct(
    LeaderIdAndEpoch, (Field("leader_id", INT32), Field("leader_epoch", INT32))
)

PRODUCE = KafkaApi(
    ApiKey.PRODUCE,
    0,  # advertised from 0: librdkafka 2.0 turns compression off otherwise
    8,
    9,
    request=KStruct(
        ProduceRequest,
        (
            Field("transactional_id", STRING, "3+", nullable="3+"),
            Field("acks", INT16),
            Field("timeout_ms", INT32),
            Field(
                "topics",
                _topics(ProduceTopic, ProducePartition, Field("index", INT32), _RECORDS),
            ),
        ),
    ),
    response=KStruct(
        ProduceResponse,
        (
            Field(
                "topics",
                _topics(
                    ProduceTopicResponse,
                    ProducePartitionResponse,
                    Field("index", INT32),
                    Field("error_code", INT16),
                    Field("base_offset", INT64),
                    Field("log_append_time_ms", INT64, "2+"),
                    Field("log_start_offset", INT64, "5+"),
                    Field("record_errors", Array(_RECORD_ERROR), "8+", default=[], mapped=False),
                    Field("error_message", STRING, "8+", nullable="8+"),
                ),
            ),
            Field("throttle_time_ms", INT32, "1+"),
        ),
    ),
)

FETCH = KafkaApi(
    ApiKey.FETCH,
    4,
    12,  # above 12 librdkafka switches to topic ids
    12,
    request=KStruct(
        FetchRequest,
        (
            Field("cluster_id", STRING, "12+", nullable="12+", tag=0, mapped=False),
            Field("replica_id", INT32),
            Field("max_wait_ms", INT32),
            Field("min_bytes", INT32),
            Field("max_bytes", INT32),
            Field("isolation_level", INT8),
            # Fetch sessions (KIP-227) are not kept: every answer is sessionless
            # (session id 0), so clients send full fetches.
            Field("session_id", INT32, "7+", default=0, mapped=False),
            Field("session_epoch", INT32, "7+", default=-1, mapped=False),
            Field(
                "topics",
                _topics(
                    FetchTopic,
                    FetchPartition,
                    Field("partition", INT32),
                    Field("current_leader_epoch", INT32, "9+"),
                    Field("fetch_offset", INT64),
                    Field("last_fetched_epoch", INT32, "12+"),
                    Field("log_start_offset", INT64, "5+"),
                    Field("partition_max_bytes", INT32),
                    name="topic",
                ),
            ),
            Field("forgotten_topics_data", Array(_FORGOTTEN_TOPIC), "7+", default=[], mapped=False),
            Field("rack_id", STRING, "11+", default="", mapped=False),
        ),
    ),
    response=KStruct(
        FetchResponse,
        (
            Field("throttle_time_ms", INT32, "1+"),
            Field("error_code", INT16, "7+"),
            Field("session_id", INT32, "7+", default=0, mapped=False),
            Field(
                "responses",
                _topics(
                    FetchTopicResponse,
                    FetchPartitionResponse,
                    Field("partition_index", INT32),
                    Field("error_code", INT16),
                    Field("high_watermark", INT64),
                    Field("last_stable_offset", INT64, "4+"),
                    Field("log_start_offset", INT64, "5+"),
                    # KIP-320: where the fetcher's log diverges, and who leads now.
                    Field(
                        "diverging_epoch",
                        _EPOCH_END_OFFSET,
                        "12+",
                        tag=0,
                        default=EpochEndOffset(),
                    ),
                    Field(
                        "current_leader",
                        _LEADER_ID_AND_EPOCH,
                        "12+",
                        tag=1,
                        default=LeaderIdAndEpoch(),
                    ),
                    Field(
                        "aborted_transactions",
                        Array(_ABORTED_TRANSACTION),
                        "4+",
                        nullable="4+",
                        mapped=False,
                    ),
                    Field("preferred_read_replica", INT32, "11+", default=-1, mapped=False),
                    _RECORDS,
                    name="topic",
                ),
            ),
        ),
    ),
)

LIST_OFFSETS = KafkaApi(
    ApiKey.LIST_OFFSETS,
    1,
    5,
    6,
    request=KStruct(
        ListOffsetsRequest,
        (
            Field("replica_id", INT32),
            Field("isolation_level", INT8, "2+"),
            Field(
                "topics",
                _topics(
                    ListOffsetsTopic,
                    ListOffsetsPartition,
                    Field("partition_index", INT32),
                    Field("current_leader_epoch", INT32, "4+"),
                    Field("timestamp", INT64),
                ),
            ),
        ),
    ),
    response=KStruct(
        ListOffsetsResponse,
        (
            _no_throttle("2+"),
            Field(
                "topics",
                _topics(
                    ListOffsetsTopicResponse,
                    ListOffsetsPartitionResponse,
                    Field("partition_index", INT32),
                    Field("error_code", INT16),
                    Field("timestamp", INT64),
                    Field("offset", INT64),
                    Field("leader_epoch", INT32, "4+"),
                ),
            ),
        ),
    ),
)

OFFSET_FOR_LEADER_EPOCH = KafkaApi(
    ApiKey.OFFSET_FOR_LEADER_EPOCH,
    2,  # v2: current_leader_epoch, what librdkafka sends (exactly v2)
    3,
    4,
    request=KStruct(
        OffsetForLeaderEpochRequest,
        (
            Field("replica_id", INT32, "3+"),
            Field(
                "topics",
                _topics(
                    OffsetForLeaderTopic,
                    OffsetForLeaderPartition,
                    Field("partition", INT32),
                    Field("current_leader_epoch", INT32),
                    Field("leader_epoch", INT32),
                    name="topic",
                ),
            ),
        ),
    ),
    response=KStruct(
        OffsetForLeaderEpochResponse,
        (
            _no_throttle("0+"),
            Field(
                "topics",
                _topics(
                    OffsetForLeaderTopicResult,
                    EpochEndOffsetResult,
                    Field("error_code", INT16),
                    Field("partition", INT32),
                    Field("leader_epoch", INT32),
                    Field("end_offset", INT64),
                    name="topic",
                ),
            ),
        ),
    ),
)

INIT_PRODUCER_ID = KafkaApi(
    ApiKey.INIT_PRODUCER_ID,
    0,
    4,  # v3+: the epoch bump of KIP-360, which kafka-python and librdkafka use
    2,
    request=KStruct(
        InitProducerIdRequest,
        (
            Field("transactional_id", STRING, nullable="0+"),
            Field("transaction_timeout_ms", INT32),
            Field("producer_id", INT64, "3+"),
            Field("producer_epoch", INT16, "3+"),
        ),
    ),
    response=KStruct(
        InitProducerIdResponse,
        (
            _no_throttle("0+"),
            Field("error_code", INT16),
            Field("producer_id", INT64),
            Field("producer_epoch", INT16),
        ),
    ),
)


def _configs_to_native(configs: list[dict[str, Any]]) -> dict[str, str]:
    # A null value asks for the default: the same as not setting it.
    return {c["name"]: c["value"] for c in configs if c["value"] is not None}


def _configs_from_native(configs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": name, "value": value} for name, value in configs.items()]


_CREATABLE_TOPIC = KStruct(
    CreatableTopic,
    (
        Field("name", STRING),
        Field("num_partitions", INT32),
        Field("replication_factor", INT16),
        Field(
            "assignments",
            Array(
                KStruct(
                    CreatableReplicaAssignment,
                    (Field("partition_index", INT32), Field("broker_ids", Array(INT32))),
                )
            ),
        ),
        Field(
            "configs",
            Array(KStruct(None, (Field("name", STRING), Field("value", STRING, nullable="0+")))),
            to_native=_configs_to_native,
            from_native=_configs_from_native,
        ),
    ),
)

CREATE_TOPICS = KafkaApi(
    ApiKey.CREATE_TOPICS,
    2,
    4,  # v4: -1 partitions / replication factor for the cluster's defaults
    5,
    request=KStruct(
        CreateTopicsRequest,
        (
            Field("topics", Array(_CREATABLE_TOPIC)),
            Field("timeout_ms", INT32),
            Field("validate_only", BOOL),
        ),
    ),
    response=KStruct(
        CreateTopicsResponse,
        (
            _no_throttle("2+"),
            Field(
                "topics",
                Array(
                    KStruct(
                        CreatableTopicResult,
                        (
                            Field("name", STRING),
                            Field("error_code", INT16),
                            Field("error_message", STRING, nullable="0+"),
                        ),
                    )
                ),
            ),
        ),
    ),
)

DELETE_TOPICS = KafkaApi(
    ApiKey.DELETE_TOPICS,
    1,
    3,
    4,
    request=KStruct(
        DeleteTopicsRequest, (Field("topic_names", Array(STRING)), Field("timeout_ms", INT32))
    ),
    response=KStruct(
        DeleteTopicsResponse,
        (
            _no_throttle("1+"),
            Field(
                "responses",
                Array(
                    KStruct(
                        DeletableTopicResult, (Field("name", STRING), Field("error_code", INT16))
                    )
                ),
            ),
        ),
    ),
)

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
    )
}
