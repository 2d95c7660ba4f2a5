"""Kafka's consumer protocol: how a consumer's subscription (JoinGroup's protocol
metadata) and its assignment (SyncGroup's) are encoded, declared once (written from
Kafka's ConsumerProtocolSubscription / ConsumerProtocolAssignment message definitions)
with the codec's schema (protocol/kafka/schema.py). The coordinator never looks inside;
members of any client read each other's, so a minibroker consumer and a kafka-python,
librdkafka or aiokafka consumer can share a group.

    Subscription  version INT16, then at that version:
                  topics ARRAY[STRING], user_data NULLABLE_BYTES,
                  owned_partitions ARRAY[topic STRING, partitions ARRAY[INT32]] (v1+),
                  generation_id INT32 (v2+), rack_id NULLABLE_STRING (v3+)
    Assignment    version INT16, then assigned_partitions
                  ARRAY[topic STRING, partitions ARRAY[INT32]], user_data NULLABLE_BYTES

A version newer than the ones declared is read as the newest declared one, the fields
it adds ignored (Kafka's rule: versions only append fields).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from dataclasses import field

from protocol.errors import DecodeError
from protocol.kafka.primitives import Reader
from protocol.kafka.primitives import Writer
from protocol.kafka.schema import BYTES
from protocol.kafka.schema import INT32
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct

SUBSCRIPTION_VERSION = 1  # what is written: owned partitions, for cooperative rebalancing
MAX_SUBSCRIPTION_VERSION = 3
MAX_ASSIGNMENT_VERSION = 3
_VERSION = struct.Struct(">h")


@dataclass
class TopicPartitions:
    topic: str
    partitions: list[int]


@dataclass
class Subscription:
    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: list[TopicPartitions] = field(default_factory=list)
    generation_id: int = -1
    rack_id: str | None = None


@dataclass
class Assignment:
    assigned_partitions: list[TopicPartitions]
    user_data: bytes | None = None


def _opaque(value: memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


_TOPIC_PARTITIONS = KStruct(
    TopicPartitions, (Field("topic", STRING), Field("partitions", Array(INT32)))
)
_USER_DATA = Field("user_data", BYTES, nullable="0+", to_native=_opaque)

SUBSCRIPTION = KStruct(
    Subscription,
    (
        Field("topics", Array(STRING)),
        _USER_DATA,
        Field("owned_partitions", Array(_TOPIC_PARTITIONS), "1+"),
        Field("generation_id", INT32, "2+"),
        Field("rack_id", STRING, "3+", nullable="3+"),
    ),
)

ASSIGNMENT = KStruct(
    Assignment, (Field("assigned_partitions", Array(_TOPIC_PARTITIONS)), _USER_DATA)
)


def _encode(struct_: KStruct, version: int, value: object) -> bytes:
    w = Writer()
    w.raw(_VERSION.pack(version))
    struct_.write(w, value, version, False)
    return w.getvalue()


def _decode(struct_: KStruct, newest: int, data: bytes, what: str) -> object:
    if len(data) < _VERSION.size:
        raise DecodeError(f"{what}: {len(data)} bytes, no version")
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        raise DecodeError(f"{what}: version {version}")
    # Bytes after the fields of the version read are a newer version's: ignored.
    return struct_.read(Reader(data, _VERSION.size), min(version, newest), False)


def encode_subscription(value: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    return _encode(SUBSCRIPTION, version, value)


def decode_subscription(data: bytes) -> Subscription:
    """Raises DecodeError for bytes that are not a subscription."""
    value = _decode(SUBSCRIPTION, MAX_SUBSCRIPTION_VERSION, data, "subscription")
    assert isinstance(value, Subscription)
    return value


def encode_assignment(value: Assignment, version: int = 0) -> bytes:
    return _encode(ASSIGNMENT, version, value)


def decode_assignment(data: bytes) -> Assignment:
    """Raises DecodeError for bytes that are not an assignment. Empty bytes (what the
    coordinator hands a member the leader gave nothing) are an empty assignment."""
    if not data:
        return Assignment(assigned_partitions=[])
    value = _decode(ASSIGNMENT, MAX_ASSIGNMENT_VERSION, data, "assignment")
    assert isinstance(value, Assignment)
    return value
