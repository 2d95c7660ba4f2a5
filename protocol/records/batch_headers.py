"""Header access without decoding records: parse, CRC check, validation of a run of
batches, the valid prefix used by log recovery, and the in-place stamp of base
offset and leader epoch (both outside the CRC)."""

from __future__ import annotations

from collections.abc import Iterator

import crc32c

from protocol.errors import CorruptRecordError
from protocol.records.batch_format import _ATTR_COMPRESSION_MASK
from protocol.records.batch_format import _CRC_START
from protocol.records.batch_format import _EPOCH
from protocol.records.batch_format import _HEADER
from protocol.records.batch_format import _MAX_CODEC
from protocol.records.batch_format import _STAMP
from protocol.records.batch_format import HEADER_SIZE
from protocol.records.batch_format import LENGTH_PREFIX
from protocol.records.batch_format import MAGIC
from protocol.records.batch_format import MAX_BATCH_SIZE
from protocol.records.batch_format import BatchHeader

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
