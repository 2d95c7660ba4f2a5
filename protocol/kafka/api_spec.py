"""What a Kafka API declaration is (`KafkaApi`), and the shapes several declarations
share: the topics-and-partitions layout and the throttle time.
The declarations themselves: protocol/kafka/cluster_apis.py, data_apis.py, group_apis.py;
the registry: protocol/kafka/apis.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.api import ApiKey
from protocol.kafka.schema import INT32
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct


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


def throttle_time(versions: str) -> Field:
    """throttle_time_ms: how long a quota throttles the client (runtime/quotas.py);
    every native answer that Kafka gives one carries it."""
    return Field("throttle_time_ms", INT32, versions, default=0)


def names_of(items: list[dict[str, Any]] | None) -> list[str] | None:
    """A list of one-field structs {name} on the wire -> the names natively."""
    return None if items is None else [item["name"] for item in items]


def named(names: list[str] | None) -> list[dict[str, Any]] | None:
    """The names -> a list of one-field structs {name}, as the wire has them."""
    return None if names is None else [{"name": n} for n in names]


def topics(
    topic: type, partition: type, *fields: Field, name: str = "name", partitions: str = "partitions"
) -> Array:
    """The usual shape of a partitioned message: topics, each its name (`name`) and its
    partitions (`partitions`), each partition `fields`."""
    partition_struct = KStruct(partition, fields)
    return Array(KStruct(topic, (Field(name, STRING), Field(partitions, Array(partition_struct)))))
