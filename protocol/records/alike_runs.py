"""Runs of records laid out alike: after one record of a batch has been walked (or
decoded) field by field, how many of the records that follow it have exactly its
layout, checked with strided slices (C loops) instead of a Python step per record.

A record's layout is the bytes that fix where its fields lie: its length varint, the
size of its timestamp-delta varint, its key and value length varints, no headers. Two
records with the same layout parse alike, so when every byte that the per-record walk
would branch on is the same (or, for the timestamp and offset deltas, of the same
size and in order), the whole run is valid exactly when the first record was. Produce
validation (the leader) uses the count; the consumer's decoders also use the field
positions to cut keys, values and timestamps out of the run in bulk.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from functools import lru_cache
from itertools import chain
from itertools import repeat
from operator import add
from operator import and_
from operator import itemgetter
from operator import lshift
from operator import or_
from typing import NamedTuple

from protocol.records.varints import OFFSET_DELTA_LIMITS
from protocol.records.varints import UNZIGZAG
from protocol.records.varints import decode_varint
from protocol.records.varints import offset_delta_bytes

# A run is checked in chunks of records, the first of this many, doubling while they
# all match; in the chunk where they stop matching, each check measures how many
# records from its start pass it (C calls over strided slices), so the run's end is
# found in that one step, without halving the chunk again and again.
_FIRST_RUN_CHUNK = 64
RUN_PROBE = 8  # walked one by one after a record whose next one differs in length; a run
# shorter than this sends the next try RUN_RETRY_AFTER records on
# After a record whose successors are not laid out like it, walk (or decode) this many
# one by one before looking for a run again.
RUN_RETRY_AFTER = 64
_HIGH = bytes(b >> 7 for b in range(256))  # translate: high bit set -> 1, clear -> 0


def _leading(piece: bytes, byte: bytes) -> int:
    """How many bytes at the start of `piece` are `byte` (a one-byte bytes)."""
    return len(piece) - len(piece.lstrip(byte))


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` (of one length) share."""
    if a == b:
        return len(a)
    differ = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
    return len(a) - (differ.bit_length() + 7) // 8


class AlikeRun(NamedTuple):
    """`count` records of `stride` bytes each, laid out alike; field positions are
    relative to a record's first byte. A null key or value has length -1."""

    count: int
    stride: int
    ts_at: int  # the timestamp delta varint
    ts_size: int
    key_at: int  # the key's first byte (after its length varint)
    key_len: int
    value_at: int  # the value's first byte
    value_len: int


def alike_run(
    body: bytes | bytearray, start: int, end: int, stop: int, left: int, delta: int
) -> AlikeRun:
    """The record at body[start:end] (offset delta `delta`, already walked or decoded
    and found valid) is followed by how many records (at most `left`, inside `stop`)
    laid out exactly like it, with offset deltas delta+1, delta+2, ...? A count of 0
    when none (or when the record has headers, which no run carries)."""
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
    key_len_at = at + 1
    key_len, key_at = decode_varint(body, key_len_at)
    same += range(key_len_at, key_at)
    value_len_at = key_at + max(key_len, 0)
    value_len, value_at = decode_varint(body, value_len_at)
    same += range(value_len_at, value_at)
    layout = AlikeRun(
        0,
        stride,
        ts_at - start,
        ts_size,
        key_at - start,
        key_len,
        value_at - start,
        value_len,
    )
    if od_size > 3 or ts_size > 9 or value_at + max(value_len, 0) != end - 1:
        return layout  # a record with headers, or deltas no run can follow on from
    same.append(end - 1)  # header count 0
    # (position in the record, byte) of what must be equal, the timestamp delta's
    # continuation bytes (high bit set) and last byte, the offset delta's bytes
    equal = [(x - start, bytes((body[x],))) for x in same]
    ts_more = range(ts_at - start, ts_at - start + ts_size - 1)
    ts_last = ts_at - start + ts_size - 1
    deltas = list(enumerate(offset_delta_bytes(od_size), od_at - start))
    limit = min(left, (stop - end) // stride, OFFSET_DELTA_LIMITS[od_size] - delta)
    done = 0
    chunk = _FIRST_RUN_CHUNK
    while done < limit:
        n = min(chunk, limit - done)
        first = end + done * stride  # the first record of this chunk
        # `good`: how many records from `first` on pass every check so far; each
        # check looks at those only.
        high = body[first + ts_last : first + ts_last + n * stride : stride].translate(_HIGH)
        good = _leading(high, b"\0")
        for x, byte in equal:
            if good:
                good = _leading(body[first + x : first + x + good * stride : stride], byte)
        for x in ts_more:
            if good:
                high = body[first + x : first + x + good * stride : stride].translate(_HIGH)
                good = _leading(high, b"\1")
        first_delta = delta + 1 + done
        for x, table in deltas:
            if good:
                good = _common_prefix(
                    body[first + x : first + x + good * stride : stride],
                    table[first_delta : first_delta + good],
                )
        done += good
        if good < n:
            break
        chunk *= 2
    return layout._replace(count=done)


def run_timestamps(body: bytes, first: int, run: AlikeRun, base: int) -> Iterable[int] | None:
    """The timestamps (`base` + delta) of the run whose first record starts at
    body[first], in C loops (maps over strided slices); None when their delta varints
    are longer than two bytes (more than 8.2 s from the batch's base timestamp): decode
    those one by one."""
    stride, at, n = run.stride, first + run.ts_at, run.count
    stop = first + n * stride
    if run.ts_size == 1:
        deltas = body[at:stop:stride]
        if deltas.count(deltas[0]) == n:  # one timestamp for the whole run
            return repeat(base + UNZIGZAG[deltas[0]], n)
        if n > 256:  # one int per possible byte rather than one per record
            return map([base + delta for delta in UNZIGZAG[:128]].__getitem__, deltas)
        return map(add, repeat(base), map(UNZIGZAG.__getitem__, deltas))
    if run.ts_size == 2:
        low = map(and_, body[at:stop:stride], repeat(0x7F))
        high = map(lshift, body[at + 1 : stop : stride], repeat(7))
        return map(add, repeat(base), map(UNZIGZAG.__getitem__, map(or_, low, high)))
    return None


def run_keys(body: bytes, first: int, run: AlikeRun) -> Iterable[bytes | None]:
    """The keys of the run whose first record starts at body[first]."""
    return run_keys_and_values(body, first, run, values=False)[0]


def run_keys_and_values(
    body: bytes, first: int, run: AlikeRun, *, values: bool = True
) -> tuple[Iterable[bytes | None], Iterable[bytes | None]]:
    """The keys and (with `values`) the values of the run whose first record starts
    at body[first], as bytes (None: null), cut out by one struct unpack per record (a
    C loop over a view of the run: nothing copied but the fields)."""
    key_len = run.key_len
    value_len = run.value_len if values else -1
    if key_len < 0 and value_len < 0:
        return repeat(None, run.count), repeat(None, run.count)
    cutter = _cutter(run.stride, run.key_at, key_len, run.value_at, value_len)
    # (the view is released with the iterator: `body` is bytes, nothing waits on it)
    pieces = cutter.iter_unpack(memoryview(body)[first : first + run.count * run.stride])
    if key_len < 0:
        return repeat(None, run.count), chain.from_iterable(pieces)
    if value_len < 0:
        return chain.from_iterable(pieces), repeat(None, run.count)
    both = list(pieces)
    return map(itemgetter(0), both), map(itemgetter(1), both)


@lru_cache(maxsize=256)  # one per record layout seen recently
def _cutter(stride: int, key_at: int, key_len: int, value_at: int, value_len: int) -> struct.Struct:
    """A struct that unpacks one record of `stride` bytes into its non-null key and
    value (pad bytes around them)."""
    fields = [(at, n) for at, n in ((key_at, key_len), (value_at, value_len)) if n >= 0]
    fmt, at = "<", 0
    for field_at, n in fields:
        fmt += f"{field_at - at}x{n}s"
        at = field_at + n
    return struct.Struct(fmt + f"{stride - at}x")
