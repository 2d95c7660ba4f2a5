"""Decoding: records of a batch (or of many) into Record tuples or columns."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from itertools import repeat

from protocol.errors import CorruptRecordError
from protocol.records.alike_runs import RUN_PROBE
from protocol.records.alike_runs import RUN_RETRY_AFTER
from protocol.records.alike_runs import alike_run
from protocol.records.alike_runs import run_keys_and_values
from protocol.records.alike_runs import run_timestamps
from protocol.records.batch_format import _ATTR_TIMESTAMP_TYPE
from protocol.records.batch_format import HEADER_SIZE
from protocol.records.batch_format import BatchHeader
from protocol.records.batch_format import Header
from protocol.records.batch_format import Record
from protocol.records.batch_headers import iter_headers
from protocol.records.batch_headers import parse_header
from protocol.records.batch_headers import validate_batch
from protocol.records.compression import decompress
from protocol.records.varints import UNZIGZAG
from protocol.records.varints import decode_varint

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

# One decoded record: (topic, partition, offset, leader_epoch, timestamp, key, value,
# headers), an exact tuple so that CPython's GC untracks it at its first pass.
DecodedRecord = tuple[str, int, int, int, int, bytes | None, bytes | None, tuple[Header, ...]]


def decode_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    runs: bool = True,
) -> tuple[BatchHeader, list[Record]]:
    """Decode one batch at `pos` into records with absolute offsets (`runs=False`: every
    record one by one, the reference that the bulk decoding of runs is tested against)."""
    header = validate_batch(buf, pos) if verify_crc else parse_header(buf, pos)
    full: list[DecodedRecord] = []
    decode_batch_into(full, buf, pos, header, "", 0, runs=runs)
    return header, [_new_tuple(Record, r[2:3] + r[4:]) for r in full]


def decode_batch_into(
    out: list[DecodedRecord],
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    topic: str,
    partition: int,
    *,
    runs: bool = True,
) -> None:
    """Append the records of the batch at `pos` (whose header, already parsed and
    checked as the caller wishes, is `header`) to `out`, each an exact tuple
    ``(topic, partition, offset, leader_epoch, timestamp, key, value, headers)`` (the
    field order of client.types.ConsumerRecord: the consumer makes its records from
    them with tuple.__new__), key and value as bytes. On CorruptRecordError `out` is
    left as it was.

    The per-record loop is the consumer's hot path, so it is one pass with no
    function call per field: a varint whose first byte has the high bit clear (every
    field of a small record but its length) or of two bytes is read inline and
    decoded through a table (UNZIGZAG), longer ones through `decode_varint`, and the
    record tuple is built in one step. Records laid out like the one before them
    (alike_runs: same sizes, no headers, offset deltas following on) are checked and
    cut out in bulk with C loops, unless `runs` is False."""
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError("batch runs past the end of the buffer")
    # One copy of the records as bytes (or the decompressed block): key and value
    # slices of it are bytes with no further conversion.
    body = decompress(header.compression, memoryview(buf)[pos + HEADER_SIZE : end])
    start = len(out)
    append = out.append
    p = 0
    body_len = len(body)
    base_offset = header.base_offset
    epoch = header.partition_leader_epoch
    base_ts = header.base_timestamp
    log_append = bool(header.attributes & _ATTR_TIMESTAMP_TYPE)
    log_append_ts = header.max_timestamp
    no_headers: tuple[Header, ...] = ()
    unzigzag = UNZIGZAG  # a one- or two-byte varint's payload -> its value
    # Offset deltas increase and stay within the header's (a damaged delta would give
    # a record another record's offset, or one outside the batch).
    previous_delta = -1
    last_delta = header.last_offset_delta
    count = header.record_count
    done = 0
    # after this many records, look for a run of records laid out alike
    next_run_try = 1 if runs else count
    try:
        while done < count:
            record_start = p
            b = body[p]
            if b < 0x80:
                length = unzigzag[b]
                p += 1
            elif (c := body[p + 1]) < 0x80:  # two bytes: records of 64 B to 8 KiB
                length = unzigzag[(b & 0x7F) | (c << 7)]
                p += 2
            else:
                length, p = decode_varint(body, p)
            record_end = p + length
            if length < 1 or record_end > body_len:
                raise CorruptRecordError(f"record length {length} runs past the end of the batch")
            # attributes (unused in v2) at p, then the timestamp delta
            b = body[p + 1]
            if b < 0x80:
                ts_delta = unzigzag[b]
                p += 2
            else:
                ts_delta, p = decode_varint(body, p + 1)
            b = body[p]
            if b < 0x80:
                offset_delta = unzigzag[b]
                p += 1
            elif (c := body[p + 1]) < 0x80:  # two bytes: the 65th to the 8192nd record
                offset_delta = unzigzag[(b & 0x7F) | (c << 7)]
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
                    n = unzigzag[b]
                    p += 1
                elif (c := body[p + 1]) < 0x80:
                    n = unzigzag[(b & 0x7F) | (c << 7)]
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
                    n = unzigzag[b]
                    p += 1
                elif (c := body[p + 1]) < 0x80:
                    n = unzigzag[(b & 0x7F) | (c << 7)]
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
                (
                    topic,
                    partition,
                    base_offset + offset_delta,
                    epoch,
                    log_append_ts if log_append else base_ts + ts_delta,
                    key,
                    value,
                    headers,
                )
            )
            done += 1
            if done >= next_run_try and done < count and headers is no_headers:
                if body[p] != body[record_start]:  # the next length differs: no run
                    next_run_try = done + RUN_PROBE
                    continue
                # The records after this one may be laid out like it: decode them in bulk
                # (at most up to the header's last offset delta: a run must not pass it).
                left = min(count - done, last_delta - offset_delta)
                taken = _take_run(
                    out, body, record_start, p, left, offset_delta, header, topic, partition
                )
                done += taken
                p += taken * (p - record_start)
                previous_delta += taken
                next_run_try = done + (1 if taken >= RUN_PROBE else RUN_RETRY_AFTER)
        if p != body_len:
            raise CorruptRecordError("bytes left over after the last record")
    except IndexError:
        # A field read past the end of the body: the slice bounds hid it until now.
        del out[start:]
        raise CorruptRecordError("record field runs past the end of the batch") from None
    except CorruptRecordError:
        del out[start:]
        raise


def _take_run(
    out: list[DecodedRecord],
    body: bytes,
    start: int,
    end: int,
    left: int,
    delta: int,
    header: BatchHeader,
    topic: str,
    partition: int,
) -> int:
    """The record at body[start:end] (offset delta `delta`) was just decoded; append the
    records after it laid out like it (at most `left`), each field cut out of the run
    with C loops (alike_runs), and return how many."""
    run = alike_run(body, start, end, len(body), left, delta)
    n = run.count
    if n == 0:
        return 0
    if header.attributes & _ATTR_TIMESTAMP_TYPE:
        timestamps: Iterable[int] = repeat(header.max_timestamp)
    else:
        stamps = run_timestamps(body, end, run, header.base_timestamp)
        if stamps is None:
            return 0  # deltas too long to cut out in bulk: one by one
        timestamps = stamps
    keys, values = run_keys_and_values(body, end, run)
    first = header.base_offset + delta + 1
    out += zip(
        repeat(topic),
        repeat(partition),
        range(first, first + n),
        repeat(header.partition_leader_epoch),
        timestamps,
        keys,
        values,
        repeat(()),
    )
    return n


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
