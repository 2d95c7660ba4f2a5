"""Kafka RecordBatch v2 (magic 2), byte for byte.

Batch header, 61 bytes, big-endian::

    offset  size  field
         0     8  base_offset               stamped in place by the leader
         8     4  batch_length              bytes that follow this field
        12     4  partition_leader_epoch    stamped in place by the leader
        16     1  magic (= 2)
        17     4  crc                       CRC-32C (Castagnoli) of bytes 21..end
        21     2  attributes                bits 0-2 compression, 3 timestamp type,
                                            4 transactional, 5 control
        23     4  last_offset_delta
        27     8  base_timestamp
        35     8  max_timestamp
        43     8  producer_id
        51     2  producer_epoch
        53     4  base_sequence
        57     4  record_count
        61     -  records (compressed as one block when compression != 0)

Record (all ints zig-zag varints unless noted)::

    length, attributes (int8, raw byte), timestamp_delta, offset_delta,
    key_length (-1 = null), key, value_length (-1 = null), value,
    header_count, then per header: key_length, key (utf-8), value_length, value

Base offset and partition leader epoch lie outside the CRC, so the broker stamps
them without recomputing it and without ever decoding a record.
"""

from __future__ import annotations

import gzip
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from enum import IntEnum
from functools import cache
from typing import NamedTuple, TypeVar

import cramjam
import crc32c

from protocol.errors import CorruptRecordError, InvalidRecordError

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
_T = TypeVar("_T", bound=tuple)  # type: ignore[type-arg]


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


# ---------------------------------------------------------------- varints


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _encode_uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Zig-zag varints of 0 .. 2**14-1, precomputed: record lengths, offset deltas, key and
# value lengths and timestamp deltas of a typical batch are all below this, so encoding
# one is an index instead of a loop (the builder's per-record cost is what bounds a
# Python producer).
VARINT_CACHE_SIZE = 1 << 14
_VARINTS: tuple[bytes, ...] = tuple(_encode_uvarint(n << 1) for n in range(VARINT_CACHE_SIZE))
_NULL_VARINT = b"\x01"  # varint(-1): a null key, value or header value


def encode_varint(n: int) -> bytes:
    """Zig-zag varint (Kafka's varint/varlong)."""
    if 0 <= n < VARINT_CACHE_SIZE:
        return _VARINTS[n]
    return _encode_uvarint(_zigzag(n) & 0xFFFFFFFFFFFFFFFF)


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Return (value, new position). Raises CorruptRecordError on truncation or a
    value beyond 64 bits."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise CorruptRecordError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")
    if result >> 64:
        # Only the low bit of a 10th byte fits in 64 bits; Kafka's varlong is an int64.
        raise CorruptRecordError("varint overflows 64 bits")
    return (result >> 1) ^ -(result & 1), pos


# Largest offset delta whose zig-zag varint takes 1, 2, 3 bytes.
OFFSET_DELTA_LIMITS = {1: 63, 2: 8191, 3: 1_048_575}


@cache
def offset_delta_bytes(size: int) -> tuple[bytes, ...]:
    """For offset deltas whose zig-zag varint takes `size` bytes: table[i][v] is byte i
    of the encoding of delta v (for v up to OFFSET_DELTA_LIMITS[size]); built by
    repeating patterns, not per value. Readers and the validator compare the offset
    deltas of a run of records with a strided slice against these."""
    limit = OFFSET_DELTA_LIMITS[size] + 1
    if size == 1:
        return (bytes(range(0, 128, 2)),)  # zigzag(v) = 2v
    low = bytes(0x80 | (2 * v & 0x7F) for v in range(64)) * (limit // 64)
    # zigzag(v) >> 7 == v >> 6: each value 64 times
    mid = b"".join(bytes([x]) * 64 for x in range(limit // 64 if size == 2 else 128))
    if size == 2:
        return (low, mid)
    mid = bytes(0x80 | x for x in mid) * (limit // 8192)
    high = b"".join(bytes([x]) * 8192 for x in range(limit // 8192))
    return (low, mid, high)


# ---------------------------------------------------------------- compression


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        return gzip.compress(data, compresslevel=1)
    if codec == Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


# A batch decompresses into at most this many bytes: a small batch that expands beyond
# it (a compression bomb, or a corrupt length) is refused before it takes the reader's
# memory. Producers build batches of batch_size (16 KiB by default) before compression.
MAX_DECOMPRESSED_SIZE = MAX_BATCH_SIZE

_DECOMPRESS_INTO: dict[int, Callable[[bytes | memoryview, memoryview], int]] = {
    Compression.LZ4: cramjam.lz4.decompress_into,
    Compression.ZSTD: cramjam.zstd.decompress_into,
}
# LZ4 and ZSTD decompress into a per-thread scratch buffer, then one copy out: first
# into a window of this size (or 8x the compressed size), 8x larger on each overflow.
_FIRST_WINDOW = 256 * 1024
_SCRATCH_KEEP = 1 << 20  # a thread keeps at most this much scratch between batches
_scratch = threading.local()


def _codec_name(codec: int) -> str:
    return Compression(codec).name if 0 <= codec <= _MAX_CODEC else f"codec {codec}"


def _too_large(codec: int, limit: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"batch ({_codec_name(codec)}) decompresses into more than {limit} bytes: refusing "
        "it (a corrupt or hostile batch; producers send batches of batch_size)"
    )


def _decompress_bounded(codec: int, data: bytes | memoryview, limit: int) -> bytes:
    decompress_into = _DECOMPRESS_INTO[codec]
    window = min(limit, max(_FIRST_WINDOW, 8 * len(data)))
    while True:
        buf: bytearray | None = getattr(_scratch, "buf", None)
        if buf is None or len(buf) < window:
            buf = bytearray(window)
            if window <= _SCRATCH_KEEP:
                _scratch.buf = buf
        view = memoryview(buf)
        try:
            size = decompress_into(data, view[:window])
        except cramjam.DecompressionError as exc:
            if "whole buffer" not in str(exc):
                raise
            if window >= limit:
                raise _too_large(codec, limit) from None
            window = min(limit, window * 8)
            continue
        return bytes(view[:size])  # one copy out of the scratch


def decompress(codec: int, data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """The records block of a batch, decompressed; CorruptRecordError if it is not valid
    `codec` data or would decompress into more than `limit` bytes."""
    if codec == Compression.NONE:
        return bytes(data)
    try:
        if codec == Compression.GZIP:
            inflater = zlib.decompressobj(wbits=31)  # one gzip member, as Kafka writes
            out = inflater.decompress(data, limit + 1)
            if len(out) > limit:
                raise _too_large(codec, limit)
            if not inflater.eof:
                raise CorruptRecordError(f"gzip data of a batch ends early ({len(data)} bytes)")
            return out
        if codec == Compression.SNAPPY:
            if cramjam.snappy.decompress_raw_len(data) > limit:
                raise _too_large(codec, limit)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec in _DECOMPRESS_INTO:
            return _decompress_bounded(codec, data, limit)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each codec raises its own type; all mean "corrupt"
        raise CorruptRecordError(f"cannot decompress batch ({_codec_name(codec)}): {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec {codec}")


# ---------------------------------------------------------------- encoding


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
        self._parts: list[bytes] = []
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

    def build(self, base_offset: int = 0) -> bytes:
        if self._count == 0:
            raise ValueError("a record batch needs at least one record")
        base_ts = self._base_timestamp if self._base_timestamp is not None else 0
        records = compress(self.compression, b"".join(self._parts))
        attributes = int(self.compression) & _ATTR_COMPRESSION_MASK
        tail = struct.pack(
            ">hiqqqhii",
            attributes,
            self._count - 1,
            base_ts,
            self._max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self._count,
        )
        crc = crc32c.crc32c(records, crc32c.crc32c(tail))
        batch_length = HEADER_SIZE - LENGTH_PREFIX + len(records)
        head = struct.pack(
            ">qiiBI", base_offset, batch_length, self.partition_leader_epoch, MAGIC, crc
        )
        return head + tail + records


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


# ---------------------------------------------------------------- header access


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Read the 61-byte header at `pos` without checking the CRC."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(
            f"batch header needs {HEADER_SIZE} bytes, only {max(0, len(buf) - pos)} left"
        )
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptRecordError(f"unsupported record batch magic {header.magic} (expected 2)")
    if not HEADER_SIZE - LENGTH_PREFIX <= header.batch_length <= MAX_BATCH_SIZE:
        raise CorruptRecordError(f"implausible batch length {header.batch_length}")
    # Codec ids 5-7 are unassigned; refuse them here so `BatchHeader.compression`
    # never raises ValueError on a header that came through this function.
    if header.attributes & _ATTR_COMPRESSION_MASK > _MAX_CODEC:
        raise CorruptRecordError(
            f"unknown compression codec {header.attributes & _ATTR_COMPRESSION_MASK}"
        )
    return header


def validate_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Check length, magic, CRC and counts of the batch at `pos`; return its header."""
    header = parse_header(buf, pos)
    check_batch(buf, pos, header)
    return header


def check_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> None:
    """The checks of `validate_batch` beyond `parse_header`: the batch is complete in
    `buf`, its CRC matches, its counts are consistent."""
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError(
            f"batch at byte {pos} claims {header.size} bytes but only {len(buf) - pos} remain"
        )
    view = memoryview(buf)[pos + _CRC_START : end]
    actual = crc32c.crc32c(view)
    if actual != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch in batch at byte {pos}: "
            f"stored {header.crc:#010x}, computed {actual:#010x}"
        )
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptRecordError(
            f"negative last_offset_delta {header.last_offset_delta} "
            f"or record_count {header.record_count}"
        )
    if header.record_count > header.last_offset_delta + 1:
        raise CorruptRecordError(
            f"record_count {header.record_count} exceeds last_offset_delta+1 "
            f"{header.last_offset_delta + 1}"
        )


def validate_batches(buf: bytes | bytearray | memoryview) -> list[tuple[int, BatchHeader]]:
    """Validate a record set of one or more complete batches (a Produce payload).

    Returns (position, header) for each. Any trailing partial batch is corruption.
    """
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    total = len(buf)
    if total == 0:
        raise CorruptRecordError("empty record set")
    while pos < total:
        header = validate_batch(buf, pos)
        out.append((pos, header))
        pos += header.size
    return out


# ---------------------------------------------------------------- produce validation


def validate_produce_batches(
    buf: bytes | bytearray, *, limit: int = MAX_DECOMPRESSED_SIZE
) -> list[tuple[int, BatchHeader]]:
    """Validate a client's Produce payload for one partition as Kafka's LogValidator
    does, so that nothing a reader would trip on is ever stored. Returns (position,
    header) of each batch.

    Beyond `validate_batches` (length, magic, CRC): each batch's header is one a
    client may write (`check_client_batch`) and its records parse (`check_records`,
    compressed ones inflated under `limit` first). Raises CorruptRecordError for a
    batch that is damaged (length, CRC, compressed data) and InvalidRecordError for
    one that breaks the format's rules; the message names the batch and the fault."""
    batches = validate_batches(buf)
    check_produce_batches(buf, batches, limit=limit)
    return batches


def check_produce_batches(
    buf: bytes | bytearray,
    batches: list[tuple[int, BatchHeader]],
    *,
    limit: int = MAX_DECOMPRESSED_SIZE,
) -> None:
    """The checks of `validate_produce_batches` beyond `validate_batches`, for
    `batches` as it returned them (a broker checks their sizes in between)."""
    for pos, header in batches:
        check_client_batch(header, pos)
        check_records(buf, pos, header, limit=limit)


def check_client_batch(header: BatchHeader, pos: int = 0) -> None:
    """The header rules of Kafka's LogValidator for a batch from a client: at least one
    record, as many records as offsets (record_count == last_offset_delta + 1), no
    control batch, a sequence when there is a producer id. This broker has no
    transactions, so a transactional batch is refused too. InvalidRecordError if not."""
    count = header.record_count
    if count <= 0:
        raise InvalidRecordError(f"batch at byte {pos}: invalid record count {count}")
    if count != header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"batch at byte {pos}: {count} records but last_offset_delta "
            f"{header.last_offset_delta} spans {header.last_offset_delta + 1} offsets "
            "(record_count must be last_offset_delta + 1)"
        )
    if header.attributes & _ATTR_CONTROL:
        raise InvalidRecordError(
            f"batch at byte {pos}: clients may not write control batches (attributes "
            f"{header.attributes:#06x})"
        )
    if header.attributes & _ATTR_TRANSACTIONAL:
        raise InvalidRecordError(
            f"batch at byte {pos}: transactional batch refused: this broker has no "
            "transactions (send it without a transactional id)"
        )
    if header.producer_id > NO_PRODUCER_ID and header.base_sequence < 0:
        raise InvalidRecordError(
            f"batch at byte {pos}: invalid sequence number {header.base_sequence} for "
            f"producer id {header.producer_id} (an idempotent batch starts at a sequence >= 0)"
        )


def check_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    *,
    limit: int = MAX_DECOMPRESSED_SIZE,
) -> None:
    """Walk the records of the batch at `pos` (complete in `buf`, header parsed) as a
    reader would decode them, building nothing: every record's length fits the batch,
    its fields fit the record and use up exactly its length, offset deltas are 0, 1,
    2, ..., key, value and header lengths are -1 (null) or fit, header keys are UTF-8,
    and the records fill the batch to its last byte. A compressed batch is inflated
    under `limit` bytes first (CorruptRecordError beyond it or for bad compressed
    data). Raises InvalidRecordError naming the batch, the record and the fault."""
    start = pos + HEADER_SIZE
    end = pos + header.size
    codec = header.attributes & _ATTR_COMPRESSION_MASK
    if codec:
        body: bytes | bytearray = decompress(codec, memoryview(buf)[start:end], limit)
        start, end = 0, len(body)
    elif isinstance(buf, memoryview):
        body = buf[start:end].tobytes()  # indexing bytes is cheaper than a memoryview
        start, end = 0, end - start
    else:
        body = buf
    try:
        count = header.record_count
        # The smallest record is 7 bytes (length, attributes and five one-byte
        # varints): a count beyond that is refused before walking anything.
        if count > (end - start) // 7:
            raise InvalidRecordError(
                f"{count} records cannot fit in {end - start} bytes of records"
            )
        _walk_records(body, start, end, count)
    except InvalidRecordError as exc:
        where = f"batch at byte {pos}"
        if codec:
            where += f" ({_codec_name(codec)}, {end} bytes decompressed)"
        raise InvalidRecordError(f"{where}: {exc}") from None


def _walk_records(body: bytes | bytearray, p: int, end: int, count: int) -> None:
    """The loop of `check_records` over body[p:end]. One pass, no object per record:
    one- and two-byte varints are read inline (decoded through a table), longer ones
    through decode_varint; runs of alike records are checked in bulk (_alike_run)."""
    first = record_start = p
    unzigzag = _UNZIGZAG
    i = 0
    next_run = 1  # after this many records, look for a run of records laid out alike
    try:
        while i < count:
            if i >= next_run:
                # The previous record has no headers and this one's length starts alike:
                # they may begin a run of records laid out alike.
                if body[p - 1] == 0 and body[p] == body[record_start]:
                    run, stride = _alike_run(body, record_start, p, end, count - i, i - 1)
                    i += run
                    p += run * stride
                    if i == count:
                        break
                    # after a run, look again past the next record; else walk a while
                    next_run = i + (1 if run >= _RUN_PROBE else _RUN_RETRY_AFTER)
                else:
                    next_run = i + _RUN_PROBE
            record_start = p
            b = body[p]
            if b < 0x80:
                length = unzigzag[b]
                p += 1
            else:
                c = body[p + 1]
                if c < 0x80:
                    length = unzigzag[(b & 0x7F) | (c << 7)]
                    p += 2
                else:
                    length, p = decode_varint(body, p)
            record_end = p + length
            if not 0 < length <= end - p:
                raise _length_fault(i, count, length, end - p, p - first)
            # attributes (any value: unused in v2), then the timestamp delta
            q = p + 2 if body[p + 1] < 0x80 else decode_varint(body, p + 1)[1]
            b = body[q]  # the offset delta, zig-zag encoded: must be i
            if b < 0x80:
                q += 1
            else:
                c = body[q + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    q += 2
                else:
                    delta, q = decode_varint(body, q)
                    b = delta << 1 if delta >= 0 else ~(delta << 1)  # zig-zag again
            if b != i << 1:
                raise InvalidRecordError(
                    f"record {i} has offset delta {unzigzag[b] if b < 1 << 14 else b}, "
                    f"expected {i} (inner offsets must be consecutive from 0)"
                )
            b = body[q]
            if b == 1:  # null key
                q += 1
            else:
                if b < 0x80:
                    n = unzigzag[b]
                    q += 1
                else:
                    n, q = decode_varint(body, q)
                if not -1 <= n <= record_end - q:
                    raise _field_fault(i, "key", n, record_end - q)
                if n > 0:
                    q += n
            b = body[q]
            if b == 1:  # null value
                q += 1
            else:
                if b < 0x80:
                    n = unzigzag[b]
                    q += 1
                else:
                    c = body[q + 1]
                    if c < 0x80:
                        n = unzigzag[(b & 0x7F) | (c << 7)]
                        q += 2
                    else:
                        n, q = decode_varint(body, q)
                if not -1 <= n <= record_end - q:
                    raise _field_fault(i, "value", n, record_end - q)
                if n > 0:
                    q += n
            if body[q] == 0:  # no headers
                q += 1
            else:
                q = _walk_headers(body, q, record_end, i)
            if q != record_end:
                raise InvalidRecordError(
                    f"record {i} is {length} bytes long but its fields take {q - p}"
                )
            p = record_end
            i += 1
        if p != end:
            raise InvalidRecordError(
                f"{end - p} bytes left over after the last of the {count} records "
                "(the records must fill the batch)"
            )
    except IndexError:
        if p >= end:  # at a record's start: the records ran out
            raise _length_fault(i, count, 0, 0, 0) from None
        raise InvalidRecordError(
            f"record {i} runs past the end of the records (byte {end - first})"
        ) from None
    except InvalidRecordError:  # a CorruptRecordError too: through as it is
        raise
    except CorruptRecordError as exc:  # a varint of decode_varint
        raise InvalidRecordError(f"record {i}: {exc}") from None


# One- and two-byte zig-zag varints (their 14 payload bits) -> value.
_UNZIGZAG = tuple((v >> 1) ^ -(v & 1) for v in range(1 << 14))
# After a record whose successors are not laid out like it, walk this many one by one.
_RUN_RETRY_AFTER = 64
# A run is checked in chunks of records, the first of this many, doubling while they
# match (halving when not): a run that breaks early costs little.
_FIRST_RUN_CHUNK = 256
_RUN_PROBE = 8  # when the first chunk does not match: try this many, then halve
_HIGH_BIT = bytes(b ^ 0x80 for b in range(256))  # translate: high bit set -> clear


def _alike_run(
    body: bytes | bytearray, start: int, end: int, stop: int, left: int, delta: int
) -> tuple[int, int]:
    """The record at body[start:end] (offset delta `delta`, already walked, no headers)
    is followed by how many records (at most `left`, inside `stop`) laid out exactly
    like it: the same length, key length and value length varints, no headers, a
    timestamp delta varint of the same size and offset deltas delta+1, delta+2, ...?
    Such records parse as that one did, so checking those bytes with strided slices
    (C loops) checks them all. Returns (count, stride)."""
    stride = end - start
    at = start
    while body[at] & 0x80:  # the record length
        at += 1
    same = list(range(start, at + 1))
    ts_at = at = at + 2  # past the attributes
    while body[at] & 0x80:
        at += 1
    ts_size = at + 1 - ts_at
    od_at = at = at + 1
    while body[at] & 0x80:
        at += 1
    od_size = at + 1 - od_at
    if od_size > 3 or ts_size > 9:
        return 0, stride
    key_at = at + 1
    key_len, at = decode_varint(body, key_at)
    same += range(key_at, at)
    value_at = at + max(key_len, 0)
    value_len, at = decode_varint(body, value_at)
    same += range(value_at, at)
    if at + max(value_len, 0) != end - 1:  # headers follow the value
        return 0, stride
    same.append(end - 1)  # header count 0
    # (position in the record, byte) of what must be equal, the timestamp delta's
    # continuation bytes (high bit set) and last byte, the offset delta's bytes
    equal = [(x - start, body[x]) for x in same]
    ts_more = range(ts_at - start, ts_at - start + ts_size - 1)
    ts_last = ts_at - start + ts_size - 1
    deltas = list(enumerate(offset_delta_bytes(od_size), od_at - start))
    limit = min(left, (stop - end) // stride, OFFSET_DELTA_LIMITS[od_size] - delta)
    done = 0
    chunk = _FIRST_RUN_CHUNK
    while done < limit:
        n = min(chunk, limit - done)
        first = end + done * stride  # the first record of this chunk
        span = n * stride
        ok = body[first + ts_last : first + ts_last + span : stride].isascii()
        for x, byte in equal:
            if ok:
                ok = body[first + x : first + x + span : stride].count(byte) == n
        for x in ts_more:
            if ok:
                ok = body[first + x : first + x + span : stride].translate(_HIGH_BIT).isascii()
        first_delta = delta + 1 + done
        for x, table in deltas:
            if ok:
                ok = (
                    body[first + x : first + x + span : stride]
                    == table[first_delta : first_delta + n]
                )
        if ok:
            done += n
            chunk *= 2
        elif done == 0 and n > _RUN_PROBE:
            chunk = _RUN_PROBE  # not alike so far: a few more tries, small ones
        elif n > 1 and (done or n <= _RUN_PROBE):
            chunk = n // 2
        else:
            break
    return done, stride


def _length_fault(i: int, count: int, length: int, remaining: int, at: int) -> InvalidRecordError:
    if remaining <= 0:
        return InvalidRecordError(f"the batch declares {count} records but holds {i}")
    if length < 1:
        return InvalidRecordError(f"record {i} (byte {at} of the records) has length {length}")
    return InvalidRecordError(
        f"record {i} (byte {at} of the records) claims {length} bytes, only {remaining} remain"
    )


def _field_fault(i: int, field: str, n: int, remaining: int) -> InvalidRecordError:
    if n < -1:
        return InvalidRecordError(
            f"record {i} has {field} length {n} (-1, a null {field}, is the only negative one)"
        )
    return InvalidRecordError(
        f"record {i} claims a {field} of {n} bytes, only {remaining} remain in the record"
    )


def _walk_headers(body: bytes | bytearray, q: int, record_end: int, i: int) -> int:
    """The headers of record `i` starting at their count: each key non-null, UTF-8 and
    inside the record, each value -1 (null) or inside it. Returns the position after."""
    header_count, q = decode_varint(body, q)
    if header_count < 0 or header_count > record_end - q:
        raise InvalidRecordError(
            f"record {i} declares {header_count} headers in {max(0, record_end - q)} bytes"
        )
    for j in range(header_count):
        n, q = decode_varint(body, q)
        if n < 0 or n > record_end - q:
            raise InvalidRecordError(
                f"record {i} header {j} has a key of {n} bytes, {record_end - q} remain "
                "(a header key is never null)"
            )
        try:
            bytes(body[q : q + n]).decode()
        except UnicodeDecodeError:
            raise InvalidRecordError(f"record {i} header {j}: the key is not UTF-8") from None
        q += n
        n, q = decode_varint(body, q)
        if n < -1 or n > record_end - q:
            raise _field_fault(i, f"header {j} value", n, record_end - q)
        if n > 0:
            q += n
    return q


def scan_valid_prefix(
    buf: bytes | bytearray | memoryview, *, expect_offset: int | None = None
) -> tuple[int, list[tuple[int, BatchHeader]]]:
    """Walk batches from the start until the first invalid or incomplete one.

    Used by log recovery: returns the length of the longest valid prefix and the
    batches in it. Each batch's base offset must be at least the previous batch's
    next offset (the first batch's is free); `expect_offset` also sets the floor for
    the first batch.
    """
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    total = len(buf)
    next_offset = expect_offset
    while pos < total:
        try:
            header = validate_batch(buf, pos)
        except CorruptRecordError:
            break
        if next_offset is not None and header.base_offset < next_offset:
            break
        out.append((pos, header))
        next_offset = header.next_offset
        pos += header.size
    return pos, out


def iter_headers(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """Headers of the complete batches in `buf` (no CRC check), stopping at a partial one."""
    pos = 0
    total = len(buf)
    while total - pos >= HEADER_SIZE:
        header = parse_header(buf, pos)
        if pos + header.size > total:
            return
        yield pos, header
        pos += header.size


def stamp(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Write base offset and partition leader epoch into the batch at `pos`, in place."""
    _STAMP.pack_into(buf, pos, base_offset)
    _EPOCH.pack_into(buf, pos + 12, leader_epoch)


# ---------------------------------------------------------------- decoding


def _read_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(data, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(data):
        raise CorruptRecordError("record field runs past the end of the batch")
    return data[pos:end], end


def decode_record_headers(
    body: bytes, p: int, record_length: int
) -> tuple[tuple[Header, ...], int]:
    """The headers of the record whose header count is at `body[p]`, and the position
    after them; `record_length` bounds the count (a corrupt count cannot loop long)."""
    header_count, p = decode_varint(body, p)
    if header_count < 0 or header_count > record_length:
        raise CorruptRecordError(f"bad header count {header_count}")
    headers: list[Header] = []
    for _ in range(header_count):
        hkey, p = _read_bytes(body, p)
        if hkey is None:
            raise CorruptRecordError("null record header key")
        hvalue, p = _read_bytes(body, p)
        try:
            headers.append((hkey.decode(), hvalue))
        except UnicodeDecodeError as exc:
            raise CorruptRecordError("record header key is not UTF-8") from exc
    return tuple(headers), p


_new_tuple = tuple.__new__


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True
) -> tuple[BatchHeader, list[Record]]:
    """Decode one batch at `pos` into records with absolute offsets."""
    header = validate_batch(buf, pos) if verify_crc else parse_header(buf, pos)
    full: list[tuple[object, ...]] = []
    decode_batch_into(full, buf, pos, header, tuple, "", 0)
    return header, [_new_tuple(Record, r[2:3] + r[4:]) for r in full]


def decode_batch_into(
    out: list[_T],
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    record_type: type[_T],
    topic: str,
    partition: int,
) -> None:
    """Append the records of the batch at `pos` (whose header, already parsed and
    checked as the caller wishes, is `header`) to `out`, each made as
    ``record_type((topic, partition, offset, leader_epoch, timestamp, key, value,
    headers))`` with tuple.__new__ (the field order of client.types.ConsumerRecord),
    key and value as bytes. On CorruptRecordError `out` is left as it was.

    The per-record loop is the consumer's hot path, so it is one pass with no
    function call per field: a varint whose first byte has the high bit clear (every
    field of a small record but its length) or of two bytes is read inline, longer
    ones through `decode_varint`, and the record tuple is built in one step."""
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError("batch runs past the end of the buffer")
    # One copy of the records as bytes (or the decompressed block): key and value
    # slices of it are bytes with no further conversion.
    body = decompress(header.compression, memoryview(buf)[pos + HEADER_SIZE : end])
    start = len(out)
    append = out.append
    new = _new_tuple
    p = 0
    body_len = len(body)
    base_offset = header.base_offset
    epoch = header.partition_leader_epoch
    base_ts = header.base_timestamp
    log_append = bool(header.attributes & _ATTR_TIMESTAMP_TYPE)
    log_append_ts = header.max_timestamp
    no_headers: tuple[Header, ...] = ()
    # Offset deltas increase and stay within the header's (a damaged delta would give
    # a record another record's offset, or one outside the batch).
    previous_delta = -1
    last_delta = header.last_offset_delta
    try:
        for _ in range(header.record_count):
            b = body[p]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                p += 1
            elif body[p + 1] < 0x80:  # two bytes: records of 64 B to 8 KiB
                b = (b & 0x7F) | (body[p + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                length, p = decode_varint(body, p)
            record_end = p + length
            if length < 1 or record_end > body_len:
                raise CorruptRecordError(f"record length {length} runs past the end of the batch")
            # attributes (unused in v2) at p, then the timestamp delta
            b = body[p + 1]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                ts_delta, p = decode_varint(body, p + 1)
            b = body[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif body[p + 1] < 0x80:  # two bytes: the 65th to the 8192nd record
                b = (b & 0x7F) | (body[p + 1] << 7)
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                offset_delta, p = decode_varint(body, p)
            if not previous_delta < offset_delta <= last_delta:
                raise CorruptRecordError(
                    f"record offset delta {offset_delta} after {previous_delta} (the batch "
                    f"ends at delta {last_delta})"
                )
            previous_delta = offset_delta
            b = body[p]
            if b == 1:  # null key
                key = None
                p += 1
            else:
                if b < 0x80:
                    n = (b >> 1) ^ -(b & 1)
                    p += 1
                elif body[p + 1] < 0x80:
                    b = (b & 0x7F) | (body[p + 1] << 7)
                    n = (b >> 1) ^ -(b & 1)
                    p += 2
                else:
                    n, p = decode_varint(body, p)
                if n < 0:
                    key = None
                else:
                    key = body[p : p + n]
                    p += n
            b = body[p]
            if b == 1:  # null value
                value = None
                p += 1
            else:
                if b < 0x80:
                    n = (b >> 1) ^ -(b & 1)
                    p += 1
                elif body[p + 1] < 0x80:
                    b = (b & 0x7F) | (body[p + 1] << 7)
                    n = (b >> 1) ^ -(b & 1)
                    p += 2
                else:
                    n, p = decode_varint(body, p)
                if n < 0:
                    value = None
                else:
                    value = body[p : p + n]
                    p += n
            if p < record_end and body[p] == 0:  # no headers
                headers = no_headers
                p += 1
            else:
                headers, p = decode_record_headers(body, p, length)
            if p != record_end:
                raise CorruptRecordError("record length does not match its fields")
            append(
                new(
                    record_type,
                    (
                        topic,
                        partition,
                        base_offset + offset_delta,
                        epoch,
                        log_append_ts if log_append else base_ts + ts_delta,
                        key,
                        value,
                        headers,
                    ),
                )
            )
        if p != body_len:
            raise CorruptRecordError("bytes left over after the last record")
    except IndexError:
        # A field read past the end of the body: the slice bounds hid it until now.
        del out[start:]
        raise CorruptRecordError("record field runs past the end of the batch") from None
    except CorruptRecordError:
        del out[start:]
        raise


def iter_batches(
    buf: bytes | bytearray | memoryview, *, min_offset: int = 0, verify_crc: bool = True
) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Each complete batch in `buf` (a fetch response) with its records, those below
    `min_offset` left out; a batch left with none is skipped. A partial trailing batch
    (cut by max_bytes) is ignored. Cheaper than `iter_records` for a consumer: the
    per-record work is only what decode_batch does."""
    for pos, _header in iter_headers(buf):
        header, records = decode_batch(buf, pos, verify_crc=verify_crc)
        if header.base_offset < min_offset:
            records = [r for r in records if r[0] >= min_offset]
            if not records:
                continue
        yield header, records


def iter_records(
    buf: bytes | bytearray | memoryview, *, min_offset: int = 0, verify_crc: bool = True
) -> Iterator[tuple[BatchHeader, Record]]:
    """Records of every complete batch in `buf` (a fetch response), skipping those
    below `min_offset`. A partial trailing batch (cut by max_bytes) is ignored."""
    for header, records in iter_batches(buf, min_offset=min_offset, verify_crc=verify_crc):
        for record in records:
            yield header, record
