"""The fast RecordBatch encoder and decoder (varint table, inline varints, pieces
joined once) against a plain reference written straight from the format: same bytes
out, same records back, and every damaged batch either decoded the same or refused
with CorruptRecordError, never another exception."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from protocol_strategies import mutated
from protocol_strategies import records
from protocol_strategies import wire_ints

from protocol import record_batch as rb
from protocol.errors import CorruptRecordError


def reference_varint(n: int) -> bytes:
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def reference_bytes_field(data: bytes | None) -> bytes:
    return b"\x01" if data is None else reference_varint(len(data)) + data


def reference_batch(
    items: Sequence[tuple[bytes | None, bytes | None, Sequence[rb.Header], int]],
    base_offset: int,
    epoch: int,
) -> bytes:
    """Kafka's RecordBatch v2 without compression, one field at a time."""
    base_ts = items[0][3]
    body = bytearray()
    for delta, (key, value, headers, ts) in enumerate(items):
        record = bytearray(b"\x00")
        record += reference_varint(ts - base_ts) + reference_varint(delta)
        record += reference_bytes_field(key) + reference_bytes_field(value)
        record += reference_varint(len(headers))
        for hkey, hvalue in headers:
            record += reference_bytes_field(hkey.encode()) + reference_bytes_field(hvalue)
        body += reference_varint(len(record)) + record
    tail = struct.pack(
        ">hiqqqhii", 0, len(items) - 1, base_ts, max(i[3] for i in items), -1, -1, -1, len(items)
    )
    crc = crc32c.crc32c(bytes(body), crc32c.crc32c(tail))
    head = struct.pack(">qiiBI", base_offset, 49 + len(body), epoch, 2, crc)
    return head + tail + bytes(body)


# Lengths and deltas around the varint table's edge and the 1- and 2-byte varint edges.
_edge_sizes = st.sampled_from([0, 1, 63, 64, 127, 128, 8191, 8192, rb.VARINT_CACHE_SIZE])
_sized_bytes = st.none() | _edge_sizes.map(lambda n: b"v" * n) | st.binary(max_size=300)
_timestamps = st.integers(0, 2**41)


@st.composite
def _items(draw) -> list[tuple[bytes | None, bytes | None, tuple[rb.Header, ...], int]]:
    base = draw(_timestamps)
    out = draw(st.lists(records, min_size=1, max_size=6))
    sized = draw(st.lists(st.tuples(_sized_bytes, _sized_bytes), max_size=3))
    items = [(k, v, tuple(h), ts) for k, v, h, ts in out]
    items += [(k, v, (), base + draw(st.integers(-(2**20), 2**20))) for k, v in sized]
    return items


@settings(max_examples=300, deadline=None)
@given(_items(), st.integers(0, 2**40), st.integers(-1, 2**31 - 1))
def test_builder_output_equals_the_reference_byte_for_byte(items, base_offset, epoch) -> None:
    built = rb.encode_batch(items, base_offset=base_offset, partition_leader_epoch=epoch)
    assert built == reference_batch(items, base_offset, epoch)


@settings(max_examples=300, deadline=None)
@given(_items(), st.integers(0, 2**40))
def test_decoder_returns_what_was_encoded(items, base_offset) -> None:
    built = reference_batch(items, base_offset, 7)
    _header, decoded = rb.decode_batch(built)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in decoded] == [
        (k, v, tuple(h), ts) for k, v, h, ts in items
    ]
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(items)))


def test_many_records_cross_the_two_byte_offset_delta() -> None:
    items = [(None, b"%d" % i, (), 1000 + i) for i in range(rb.VARINT_CACHE_SIZE + 10)]
    built = rb.encode_batch(items)
    assert built == reference_batch(items, 0, -1)
    _header, decoded = rb.decode_batch(built)
    assert [r.value for r in decoded] == [v for _, v, _, _ in items]


@given(wire_ints)
def test_varint_equals_the_reference(n: int) -> None:
    assert rb.encode_varint(n) == reference_varint(n)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_damaged_records_are_refused_cleanly(data) -> None:
    """Damage inside the records with a recomputed CRC, so only the record decoder
    stands between the bytes and the caller."""
    built = bytearray(reference_batch(data.draw(_items()), 0, 0))
    records_part = data.draw(mutated(bytes(built[rb.HEADER_SIZE :])))
    buf = bytearray(built[: rb.HEADER_SIZE] + records_part)
    struct.pack_into(">i", buf, 8, len(buf) - rb.LENGTH_PREFIX)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    try:
        _header, decoded = rb.decode_batch(bytes(buf))
    except CorruptRecordError:
        return
    assert all(isinstance(r, rb.Record) for r in decoded)


def test_iter_batches_drops_records_below_min_offset() -> None:
    one = rb.encode_batch([(None, b"a"), (None, b"b"), (None, b"c")], base_offset=10)
    two = rb.encode_batch([(None, b"d")], base_offset=13)
    got = [
        (h.base_offset, [r.offset for r in recs])
        for h, recs in rb.iter_batches(one + two, min_offset=12)
    ]
    assert got == [(10, [12]), (13, [13])]
    assert list(rb.iter_batches(one + two, min_offset=14)) == []
