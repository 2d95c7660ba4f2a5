"""The RecordBatch v2 layout: the header's fields and constants, the compression and
timestamp-type attributes, and the decoded Record and BatchHeader tuples (the byte
layout is drawn in protocol/record_batch.py)."""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

HEADER_SIZE = 61
MAGIC = 2
LENGTH_PREFIX = 12  # base_offset + batch_length: bytes not counted in batch_length
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
MAX_BATCH_SIZE = 64 * 1024 * 1024  # refuse to believe a batch_length beyond this

_HEADER = struct.Struct(">qiiBIhiqqqhii")
_STAMP = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_CRC_START = 21
_ATTR_COMPRESSION_MASK = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


def first_batch_epoch(records: bytes | bytearray | memoryview) -> int | None:
    """The partition leader epoch of the first batch of `records` (the field right
    after base_offset and batch_length; read, not checked), or None when too short."""
    if len(records) < LENGTH_PREFIX + _EPOCH.size:
        return None
    epoch: int = _EPOCH.unpack_from(records, LENGTH_PREFIX)[0]
    return epoch


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str | None) -> Compression:
        if name is None or name.lower() in ("none", ""):
            return cls.NONE
        try:
            return cls[name.upper()]
        except KeyError:
            choices = ", ".join(c.name.lower() for c in cls)
            raise ValueError(f"unknown compression {name!r}; choose one of {choices}") from None


_MAX_CODEC = int(max(Compression))


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


Header = tuple[str, bytes | None]


class Record(NamedTuple):
    """One decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LENGTH_PREFIX

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & _ATTR_COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & _ATTR_TIMESTAMP_TYPE else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _ATTR_CONTROL)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF
