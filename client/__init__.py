"""minibroker's client library: AsyncProducer, AsyncConsumer, AsyncAdmin, the metadata
cache (KIP-232) and the `minibroker` CLI. Depends on `protocol` only."""

from client.admin import AsyncAdmin, NewTopic
from client.consumer import AsyncConsumer
from client.errors import BrokerResponseError, MinibrokerError
from client.producer import AsyncProducer
from client.types import (
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)

__all__ = [
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BrokerResponseError",
    "ConsumerRecord",
    "MinibrokerError",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "RecordMetadata",
    "TopicPartition",
]
