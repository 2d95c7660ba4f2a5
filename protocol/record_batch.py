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

The code lives in protocol/records/ by job (batch_format, varints, compression,
batch_builder, batch_headers, produce_validation, batch_decoder); this module is its
public face: every caller imports from here.
"""

from __future__ import annotations

from protocol.records.batch_builder import BatchBuilder
from protocol.records.batch_builder import encode_batch
from protocol.records.batch_decoder import decode_batch
from protocol.records.batch_decoder import decode_batch_into
from protocol.records.batch_decoder import decode_record_headers
from protocol.records.batch_decoder import iter_batches
from protocol.records.batch_decoder import iter_records
from protocol.records.batch_format import HEADER_SIZE
from protocol.records.batch_format import LENGTH_PREFIX
from protocol.records.batch_format import MAGIC
from protocol.records.batch_format import MAX_BATCH_SIZE
from protocol.records.batch_format import NO_PARTITION_LEADER_EPOCH
from protocol.records.batch_format import NO_PRODUCER_EPOCH
from protocol.records.batch_format import NO_PRODUCER_ID
from protocol.records.batch_format import NO_SEQUENCE
from protocol.records.batch_format import BatchHeader
from protocol.records.batch_format import Compression
from protocol.records.batch_format import Header
from protocol.records.batch_format import Record
from protocol.records.batch_format import TimestampType
from protocol.records.batch_headers import check_batch
from protocol.records.batch_headers import iter_headers
from protocol.records.batch_headers import parse_header
from protocol.records.batch_headers import scan_valid_prefix
from protocol.records.batch_headers import stamp
from protocol.records.batch_headers import validate_batch
from protocol.records.batch_headers import validate_batches
from protocol.records.compression import MAX_DECOMPRESSED_SIZE
from protocol.records.compression import compress
from protocol.records.compression import decompress
from protocol.records.produce_validation import check_client_batch
from protocol.records.produce_validation import check_produce_batches
from protocol.records.produce_validation import check_records
from protocol.records.produce_validation import validate_produce_batches
from protocol.records.varints import OFFSET_DELTA_LIMITS
from protocol.records.varints import VARINT_CACHE_SIZE
from protocol.records.varints import decode_varint
from protocol.records.varints import encode_varint
from protocol.records.varints import offset_delta_bytes

__all__ = [
    "HEADER_SIZE",
    "LENGTH_PREFIX",
    "MAGIC",
    "MAX_BATCH_SIZE",
    "MAX_DECOMPRESSED_SIZE",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "OFFSET_DELTA_LIMITS",
    "VARINT_CACHE_SIZE",
    "BatchBuilder",
    "BatchHeader",
    "Compression",
    "Header",
    "Record",
    "TimestampType",
    "check_batch",
    "check_client_batch",
    "check_produce_batches",
    "check_records",
    "compress",
    "decode_batch",
    "decode_batch_into",
    "decode_record_headers",
    "decode_varint",
    "decompress",
    "encode_batch",
    "encode_varint",
    "iter_batches",
    "iter_headers",
    "iter_records",
    "offset_delta_bytes",
    "parse_header",
    "scan_valid_prefix",
    "stamp",
    "validate_batch",
    "validate_batches",
    "validate_produce_batches",
]
