"""Data APIs of the Kafka listener: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch and
InitProducerId, declared onto the native messages with the epoch fields of the seeds
(written from Kafka's protocol guide and message definitions)."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import throttle_time
from protocol.kafka.api_spec import topics
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import INT64
from protocol.kafka.schema import RECORDS
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
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
                topics(ProduceTopic, ProducePartition, Field("index", INT32), _RECORDS),
            ),
        ),
    ),
    response=KStruct(
        ProduceResponse,
        (
            Field(
                "topics",
                topics(
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
            throttle_time("1+"),
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
                topics(
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
            throttle_time("1+"),
            Field("error_code", INT16, "7+"),
            Field("session_id", INT32, "7+", default=0, mapped=False),
            Field(
                "responses",
                topics(
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
                topics(
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
            throttle_time("2+"),
            Field(
                "topics",
                topics(
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
                topics(
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
            throttle_time("0+"),
            Field(
                "topics",
                topics(
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
            throttle_time("0+"),
            Field("error_code", INT16),
            Field("producer_id", INT64),
            Field("producer_epoch", INT16),
        ),
    ),
)
