"""Encoding: BatchBuilder collects records and builds one RecordBatch v2."""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

import crc32c

from protocol.invariants import invariant
from protocol.records.batch_format import _ATTR_COMPRESSION_MASK
from protocol.records.batch_format import HEADER_SIZE
from protocol.records.batch_format import LENGTH_PREFIX
from protocol.records.batch_format import MAGIC
from protocol.records.batch_format import NO_PARTITION_LEADER_EPOCH
from protocol.records.batch_format import NO_PRODUCER_EPOCH
from protocol.records.batch_format import NO_PRODUCER_ID
from protocol.records.batch_format import NO_SEQUENCE
from protocol.records.batch_format import Compression
from protocol.records.batch_format import Header
from protocol.records.compression import compress
from protocol.records.varints import _NULL_VARINT
from protocol.records.varints import _VARINTS
from protocol.records.varints import VARINT_CACHE_SIZE
from protocol.records.varints import encode_varint

# ---------------------------------------------------------------- encoding

# The batch header: the fields before the CRC, then the ones it covers with the records.
_HEAD = struct.Struct(">qiiBI")
_TAIL = struct.Struct(">hiqqqhii")
_CRC_FROM = _HEAD.size
_HEADER_ROOM = bytes(HEADER_SIZE)
invariant(_HEAD.size + _TAIL.size == HEADER_SIZE, "the header is the two parts")


def _encode_headers(headers: Sequence[Header]) -> bytes:
    """Header count, then per header: key length, key (UTF-8), value length, value."""
    out = bytearray(encode_varint(len(headers)))
    for hkey, hvalue in headers:
        hk = hkey.encode()
        out += encode_varint(len(hk))
        out += hk
        if hvalue is None:
            out += _NULL_VARINT
        else:
            out += encode_varint(len(hvalue))
            out += hvalue
    return bytes(out)


class BatchBuilder:
    """Accumulates records for one batch; `build()` returns the encoded batch.

    Offsets are relative (the leader stamps the base offset); the partition leader
    epoch is stamped by the leader too unless given here.
    """

    def __init__(
        self,
        *,
        compression: Compression = Compression.NONE,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        base_timestamp: int | None = None,
    ) -> None:
        self.compression = compression
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.partition_leader_epoch = partition_leader_epoch
        self._base_timestamp = base_timestamp
        self._max_timestamp = -1
        # The header's room first: build() joins everything into one buffer and
        # writes the header there.
        self._parts: list[bytes] = [_HEADER_ROOM]
        self._count = 0
        self._size = HEADER_SIZE

    def __len__(self) -> int:
        return self._count

    @property
    def estimated_size(self) -> int:
        """Uncompressed size so far, header included."""
        return self._size

    @property
    def base_timestamp(self) -> int:
        """Timestamp of the first record (-1 while empty)."""
        return -1 if self._base_timestamp is None else self._base_timestamp

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        timestamp: int | None = None,
    ) -> int:
        """Add a record; returns its offset delta within the batch."""
        if timestamp is None:
            timestamp = int(time.time() * 1000)
        if self._base_timestamp is None:
            self._base_timestamp = timestamp
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        delta = self._count
        # One record is: length, attributes (0), timestamp delta, offset delta, key,
        # value, headers. The pieces go to `_parts` as they are and are joined once in
        # build(), so a value is copied once; small varints come from a table.
        varints = _VARINTS
        ts_delta = timestamp - self._base_timestamp
        head = b"\x00" + (
            varints[ts_delta] if 0 <= ts_delta < VARINT_CACHE_SIZE else encode_varint(ts_delta)
        )
        head += varints[delta] if delta < VARINT_CACHE_SIZE else encode_varint(delta)
        if key is None:
            head += _NULL_VARINT
        else:
            key_len = len(key)
            head += (
                varints[key_len] if key_len < VARINT_CACHE_SIZE else encode_varint(key_len)
            ) + key
        if value is None:
            head += _NULL_VARINT
            value = b""
        else:
            value_len = len(value)
            head += (
                varints[value_len] if value_len < VARINT_CACHE_SIZE else encode_varint(value_len)
            )
        tail = _encode_headers(headers) if headers else b"\x00"
        body_len = len(head) + len(value) + len(tail)
        length = varints[body_len] if body_len < VARINT_CACHE_SIZE else encode_varint(body_len)
        self._parts += (length, head, value, tail)
        self._count = delta + 1
        self._size += len(length) + body_len
        return delta

    def build(self, base_offset: int = 0) -> bytearray:
        """The encoded batch, in one buffer allocated once: a 1 MiB batch is new
        memory, page-faulted in by the kernel, so joining the records and then adding
        the header in front (two allocations) cost twice that (runtime/allocator.py)."""
        if self._count == 0:
            raise ValueError("a record batch needs at least one record")
        base_ts = self._base_timestamp if self._base_timestamp is not None else 0
        parts = self._parts
        if self.compression is not Compression.NONE:
            parts = [_HEADER_ROOM, compress(self.compression, b"".join(parts[1:]))]
        out = bytearray().join(parts)
        attributes = int(self.compression) & _ATTR_COMPRESSION_MASK
        _TAIL.pack_into(
            out,
            _CRC_FROM,
            attributes,
            self._count - 1,
            base_ts,
            self._max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self._count,
        )
        with memoryview(out) as view, view[_CRC_FROM:] as covered:
            crc = crc32c.crc32c(covered)
        batch_length = len(out) - LENGTH_PREFIX
        _HEAD.pack_into(out, 0, base_offset, batch_length, self.partition_leader_epoch, MAGIC, crc)
        return out


def encode_batch(
    records: Sequence[tuple[bytes | None, bytes | None]]
    | Sequence[tuple[bytes | None, bytes | None, Sequence[Header], int | None]],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """Encode `(key, value)` or `(key, value, headers, timestamp)` tuples as one batch."""
    builder = BatchBuilder(
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )
    for item in records:
        if len(item) == 2:
            builder.append(item[1], item[0])
        else:
            key, value, headers, timestamp = item  # type: ignore[misc]
            builder.append(value, key, headers, timestamp)
    return builder.build(base_offset)
