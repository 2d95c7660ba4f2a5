"""The value types users hold: names and fields as in kafka-python / aiokafka.

All are NamedTuples: immutable, hashable where it matters (TopicPartition is a dict
key everywhere) and cheap to build once per consumed record.
"""

from __future__ import annotations

from typing import NamedTuple

from protocol.api import NO_EPOCH

Header = tuple[str, bytes | None]


class TopicPartition(NamedTuple):
    """A partition of a topic: the key of every per-partition map."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class ConsumerRecord(NamedTuple):
    """One consumed record. `leader_epoch` is the partition leader epoch stamped on
    its batch (KIP-101): the consumer keeps it with its position so it can later
    detect a log truncation (KIP-320)."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. `offset` is -1 with acks=0 (the producer
    never hears back). `leader_epoch` is the epoch the producer sent as
    current_leader_epoch and the leader accepted, i.e. the epoch stamped on the batch."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    leader_epoch: int = NO_EPOCH
    log_start_offset: int = -1
    serialized_key_size: int = -1
    serialized_value_size: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        """The record's TopicPartition."""
        return TopicPartition(self.topic, self.partition)


class OffsetAndMetadata(NamedTuple):
    """A position to resume from. Keep `leader_epoch` with the offset (KIP-320): it is
    the epoch of the last consumed record, which lets a consumer validate the offset
    against the current log instead of silently reading a different lineage."""

    offset: int
    metadata: str = ""
    leader_epoch: int = NO_EPOCH


class OffsetAndTimestamp(NamedTuple):
    """An offset found by timestamp (offsets_for_times, ListOffsets), with the leader epoch
    of its record."""

    offset: int
    timestamp: int
    leader_epoch: int = NO_EPOCH
