"""The leader's full check of produced batches: header, CRC, and a walk of every
record's lengths in one pass without building a record object (runs of records laid
out alike are checked in bulk: a deliberate, measured hot-path specialisation)."""

from __future__ import annotations

from protocol.errors import CorruptRecordError
from protocol.errors import InvalidRecordError
from protocol.records.alike_runs import RUN_PROBE
from protocol.records.alike_runs import RUN_RETRY_AFTER
from protocol.records.alike_runs import alike_run
from protocol.records.batch_format import _ATTR_COMPRESSION_MASK
from protocol.records.batch_format import _ATTR_CONTROL
from protocol.records.batch_format import _ATTR_TRANSACTIONAL
from protocol.records.batch_format import HEADER_SIZE
from protocol.records.batch_format import NO_PRODUCER_ID
from protocol.records.batch_format import BatchHeader
from protocol.records.batch_headers import validate_batches
from protocol.records.compression import MAX_DECOMPRESSED_SIZE
from protocol.records.compression import _codec_name
from protocol.records.compression import decompress
from protocol.records.varints import UNZIGZAG
from protocol.records.varints import decode_varint

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
    through decode_varint; runs of alike records are checked in bulk (alike_run)."""
    first = record_start = p
    unzigzag = UNZIGZAG
    i = 0
    next_run = 1  # after this many records, look for a run of records laid out alike
    try:
        while i < count:
            if i >= next_run:
                # The previous record has no headers and this one's length starts alike:
                # they may begin a run of records laid out alike.
                if body[p - 1] == 0 and body[p] == body[record_start]:
                    run = alike_run(body, record_start, p, end, count - i, i - 1)
                    i += run.count
                    p += run.count * run.stride
                    if i == count:
                        break
                    # after a run, look again past the next record; else walk a while
                    next_run = i + (1 if run.count >= RUN_PROBE else RUN_RETRY_AFTER)
                else:
                    next_run = i + RUN_PROBE
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
