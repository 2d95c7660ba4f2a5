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
from protocol.messages import MetadataBroker
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic

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
            Field("throttle_time_ms", INT32, "1+", default=0, mapped=False),
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
            Field("include_cluster_authorized_operations", BOOL, "8+", mapped=False),
            Field("include_topic_authorized_operations", BOOL, "8+", mapped=False),
        ),
    ),
    response=KStruct(
        MetadataResponse,
        (
            Field("throttle_time_ms", INT32, "3+", default=0, mapped=False),
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

KAFKA_APIS: dict[int, KafkaApi] = {int(api.key): api for api in (API_VERSIONS, METADATA)}
