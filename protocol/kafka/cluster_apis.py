"""Cluster and topic APIs of the Kafka listener: ApiVersions, Metadata, CreateTopics,
DeleteTopics, declared onto the native messages (written from Kafka's protocol guide and
message definitions)."""

from __future__ import annotations

from typing import Any

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import named
from protocol.kafka.api_spec import names_of
from protocol.kafka.api_spec import throttle_time
from protocol.kafka.schema import BOOL
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import INT64
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
from protocol.messages import MetadataBroker
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic

# Kafka's "no authorized operations asked for" value.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


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
            throttle_time("1+"),
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
                to_native=lambda t: _all_when_empty_v0(names_of(t)),
                from_native=lambda names: named(names or []),
            ),
            Field(
                "topics",
                Array(_METADATA_TOPIC_NAME),
                "1+",
                nullable="1+",
                to_native=names_of,
                from_native=named,
            ),
            Field("allow_auto_topic_creation", BOOL, "4+", default=True),
            Field("include_cluster_authorized_operations", BOOL, "8+", default=False, mapped=False),
            Field("include_topic_authorized_operations", BOOL, "8+", default=False, mapped=False),
        ),
    ),
    response=KStruct(
        MetadataResponse,
        (
            throttle_time("3+"),
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
            throttle_time("2+"),
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
            throttle_time("1+"),
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
