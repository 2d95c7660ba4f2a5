"""minibroker's client library: AsyncProducer, AsyncConsumer, AsyncAdmin for asyncio
programs, Producer, Consumer, Admin (client/sync.py, own loop on a background thread)
for scripts and Spark executors, the metadata cache (KIP-232) and the `minibroker`
CLI. Depends on `protocol` only."""

from client.admin import AsyncAdmin
from client.admin import NewTopic
from client.consumer import AsyncConsumer
from client.errors import BrokerResponseError
from client.errors import FencedLeaderEpochError
from client.errors import LogTruncationError
from client.errors import MinibrokerError
from client.errors import OffsetOutOfRangeError
from client.errors import PossiblyWrittenError
from client.errors import UnknownLeaderEpochError
from client.producer import AsyncProducer
from client.security import create_ssl_context
from client.sync import Admin
from client.sync import Consumer
from client.sync import Producer
from client.types import ConsumerRecord
from client.types import OffsetAndMetadata
from client.types import OffsetAndTimestamp
from client.types import RecordMetadata
from client.types import TopicPartition

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
    "create_ssl_context",
]
