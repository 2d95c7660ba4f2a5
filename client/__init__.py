"""minibroker's client library: AsyncProducer, AsyncConsumer, AsyncAdmin for asyncio
programs, Producer, Consumer, Admin (client/sync.py, own loop on a background thread)
for scripts and Spark executors, the metadata cache (KIP-232) and the `minibroker`
CLI. Depends on `protocol` only."""

from client.admin import AsyncAdmin, NewTopic
from client.consumer import AsyncConsumer
from client.errors import (
    BrokerResponseError,
    FencedLeaderEpochError,
    LogTruncationError,
    MinibrokerError,
    OffsetOutOfRangeError,
    PossiblyWrittenError,
    UnknownLeaderEpochError,
)
from client.producer import AsyncProducer
from client.sync import Admin, Consumer, Producer
from client.types import (
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BrokerResponseError",
    "Consumer",
    "ConsumerRecord",
    "FencedLeaderEpochError",
    "LogTruncationError",
    "MinibrokerError",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "PossiblyWrittenError",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
    "UnknownLeaderEpochError",
]
