"""Zig-zag varints of the record format: encoding (cached for small values) and
decoding, and the offset-delta bytes the batch builder reuses."""

from __future__ import annotations

from functools import cache

from protocol.errors import CorruptRecordError

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


# The payload of a one- or two-byte zig-zag varint (its 7 or 14 bits, as read inline by
# the hot loops) -> its value.
UNZIGZAG = tuple((v >> 1) ^ -(v & 1) for v in range(1 << 14))

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
