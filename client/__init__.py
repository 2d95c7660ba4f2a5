"""minibroker's client library: AsyncProducer, AsyncConsumer, AsyncAdmin for asyncio
programs, Producer, Consumer, Admin (client/sync.py, own loop on a background thread)
for scripts and Spark executors, the metadata cache (KIP-232) and the `minibroker`
CLI. Depends on `protocol` only.

The names below are imported on first use (PEP 562), not with the package: a process
that needs one part (a Spark task reading a partition, the CLI) does not pay for
importing every other (the admin clients alone took ~0.3 s of CPU, and Spark imports
the data source in five Python processes for a query's first run)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
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

# Each public name -> the module that defines it.
_EXPORTS = {
    "Admin": "client.sync",
    "AsyncAdmin": "client.admin",
    "AsyncConsumer": "client.consumer",
    "AsyncProducer": "client.producer",
    "BrokerResponseError": "client.errors",
    "Consumer": "client.sync",
    "ConsumerRecord": "client.types",
    "FencedLeaderEpochError": "client.errors",
    "LogTruncationError": "client.errors",
    "MinibrokerError": "client.errors",
    "NewTopic": "client.admin",
    "OffsetAndMetadata": "client.types",
    "OffsetAndTimestamp": "client.types",
    "OffsetOutOfRangeError": "client.errors",
    "PossiblyWrittenError": "client.errors",
    "Producer": "client.sync",
    "RecordMetadata": "client.types",
    "TopicPartition": "client.types",
    "UnknownLeaderEpochError": "client.errors",
    "create_ssl_context": "client.security",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
