"""The batch codecs (gzip, snappy, lz4, zstd) and decompression under a size bound, so
a compression bomb is refused (CorruptRecordError) instead of inflated."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable

import cramjam

from protocol.errors import CorruptRecordError
from protocol.records.batch_format import _MAX_CODEC
from protocol.records.batch_format import MAX_BATCH_SIZE
from protocol.records.batch_format import Compression

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


# snappy-java's stream framing ("xerial"), which kafka-python and Java producers may
# write: this magic, two INT32 versions, then blocks of an INT32 length and raw snappy.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = len(_XERIAL_MAGIC) + 8


def _snappy_block(data: bytes | memoryview, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(data) > limit:
        raise _too_large(Compression.SNAPPY, limit)
    return bytes(cramjam.snappy.decompress_raw(data))


def _snappy_xerial(data: bytes | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    at = _XERIAL_HEADER
    out: list[bytes] = []
    size = 0
    while at < len(view):
        if at + 4 > len(view):
            raise CorruptRecordError("xerial snappy block length cut short")
        n = int.from_bytes(view[at : at + 4], "big")
        at += 4
        if n <= 0 or at + n > len(view):
            raise CorruptRecordError(f"xerial snappy block of {n} bytes at {at} overruns the data")
        block = view[at : at + n]
        size += cramjam.snappy.decompress_raw_len(block)
        if size > limit:
            raise _too_large(Compression.SNAPPY, limit)
        out.append(bytes(cramjam.snappy.decompress_raw(block)))
        at += n
    return b"".join(out)


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
            if bytes(data[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
                return _snappy_xerial(data, limit)
            return _snappy_block(data, limit)
        if codec in _DECOMPRESS_INTO:
            return _decompress_bounded(codec, data, limit)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each codec raises its own type; all mean "corrupt"
        raise CorruptRecordError(f"cannot decompress batch ({_codec_name(codec)}): {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec {codec}")
