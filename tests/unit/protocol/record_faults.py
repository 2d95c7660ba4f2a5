"""Record batches with one lie each, built by hand under a valid CRC-32C (the C library
the codec uses), so that only a check of the records can tell: shared by the unit tests
of the validator and the integration test that sends them to a real broker."""

from __future__ import annotations

import struct
import zlib

import cramjam
import crc32c

from protocol.record_batch import Compression
from protocol.record_batch import encode_varint


def record(
    delta: int,
    value: bytes | None = b"v",
    key: bytes | None = None,
    headers: list[tuple[bytes | None, bytes | None]] | None = None,
    *,
    ts_delta: int = 0,
    key_len: int | None = None,
    value_len: int | None = None,
    header_count: int | None = None,
    length: int | None = None,
) -> bytes:
    """One record as the spec lays it out; each *_len / count / length, when given,
    is written instead of the true one (the lie under test)."""
    body = b"\x00" + encode_varint(ts_delta) + encode_varint(delta)
    body += encode_varint(key_len if key_len is not None else -1 if key is None else len(key))
    body += key or b""
    body += encode_varint(
        value_len if value_len is not None else -1 if value is None else len(value)
    )
    body += value or b""
    headers = headers or []
    body += encode_varint(len(headers) if header_count is None else header_count)
    for hkey, hvalue in headers:
        body += encode_varint(-1 if hkey is None else len(hkey)) + (hkey or b"")
        body += encode_varint(-1 if hvalue is None else len(hvalue)) + (hvalue or b"")
    return encode_varint(len(body) if length is None else length) + body


def raw_batch(
    records_block: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    attributes: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
    base_offset: int = 0,
) -> bytes:
    """A batch around `records_block` (already compressed if `attributes` says so)
    with the header fields given, batch length and CRC-32C computed: only the
    records (or the header's counts) can be wrong."""
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    tail = struct.pack(">hiqqqhii", attributes, lod, 1000, 1000, *producer, count)
    crc = crc32c.crc32c(records_block, crc32c.crc32c(tail))
    head = struct.pack(">qiiBI", base_offset, 49 + len(records_block), -1, 2, crc)
    return head + tail + records_block


def three_records() -> bytes:
    """Three sound records, offset deltas 0-2, values of 10 bytes."""
    return record(0, b"a" * 10) + record(1, b"b" * 10) + record(2, b"c" * 10)


def zeros_compressed(codec: Compression, size: int) -> bytes:
    """`size` zero bytes compressed in 1 MiB steps (the bomb never sits in memory)."""
    chunk = bytes(1 << 20)
    if codec == Compression.GZIP:
        deflate = zlib.compressobj(9, zlib.DEFLATED, 31, 9, zlib.Z_RLE)
        parts = [deflate.compress(chunk) for _ in range(size >> 20)]
        return b"".join(parts) + deflate.flush()
    assert codec == Compression.ZSTD
    zstd = cramjam.zstd.Compressor()
    for _ in range(size >> 20):
        zstd.compress(chunk)
    return bytes(zstd.finish())
