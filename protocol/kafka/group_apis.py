"""Consumer-group APIs of the Kafka listener: FindCoordinator, OffsetCommit and
OffsetFetch (offsets for consumers that assign partitions themselves), declared onto the
native messages."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import throttle_time
from protocol.kafka.api_spec import topics
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import INT64
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitPartitionResponse
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetCommitTopicResponse
from protocol.messages import OffsetFetchPartitionResponse
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopic
from protocol.messages import OffsetFetchTopicResponse

FIND_COORDINATOR = KafkaApi(
    ApiKey.FIND_COORDINATOR,
    0,
    2,
    3,
    request=KStruct(FindCoordinatorRequest, (Field("key", STRING), Field("key_type", INT8, "1+"))),
    response=KStruct(
        FindCoordinatorResponse,
        (
            throttle_time("1+"),
            Field("error_code", INT16),
            Field("error_message", STRING, "1+", nullable="1+"),
            Field("node_id", INT32),
            Field("host", STRING),
            Field("port", INT32),
        ),
    ),
)

OFFSET_COMMIT = KafkaApi(
    ApiKey.OFFSET_COMMIT,
    2,
    7,  # v6: the committed leader epoch (KIP-320)
    8,
    request=KStruct(
        OffsetCommitRequest,
        (
            Field("group_id", STRING),
            Field("generation_id", INT32, "1+"),
            Field("member_id", STRING, "1+"),
            Field("group_instance_id", STRING, "7+", nullable="7+"),
            Field("retention_time_ms", INT64, "2-4", default=-1, mapped=False),
            Field(
                "topics",
                topics(
                    OffsetCommitTopic,
                    OffsetCommitPartition,
                    Field("partition_index", INT32),
                    Field("committed_offset", INT64),
                    Field("committed_leader_epoch", INT32, "6+"),
                    Field("committed_metadata", STRING, nullable="0+"),
                ),
            ),
        ),
    ),
    response=KStruct(
        OffsetCommitResponse,
        (
            throttle_time("3+"),
            Field(
                "topics",
                topics(
                    OffsetCommitTopicResponse,
                    OffsetCommitPartitionResponse,
                    Field("partition_index", INT32),
                    Field("error_code", INT16),
                ),
            ),
        ),
    ),
)

_OFFSET_FETCH_TOPIC = KStruct(
    OffsetFetchTopic, (Field("name", STRING), Field("partition_indexes", Array(INT32)))
)

OFFSET_FETCH = KafkaApi(
    ApiKey.OFFSET_FETCH,
    1,
    5,  # v5: the committed leader epoch (KIP-320)
    6,
    request=KStruct(
        OffsetFetchRequest,
        (
            Field("group_id", STRING),
            Field("topics", Array(_OFFSET_FETCH_TOPIC), nullable="2+"),
        ),
    ),
    response=KStruct(
        OffsetFetchResponse,
        (
            throttle_time("3+"),
            Field(
                "topics",
                topics(
                    OffsetFetchTopicResponse,
                    OffsetFetchPartitionResponse,
                    Field("partition_index", INT32),
                    Field("committed_offset", INT64),
                    Field("committed_leader_epoch", INT32, "5+"),
                    Field("metadata", STRING, nullable="0+"),
                    Field("error_code", INT16),
                ),
            ),
            Field("error_code", INT16, "2+"),
        ),
    ),
)
