"""client.record_columns.decode_columns against protocol.record_batch.decode_batch (the
reference decode): the same fields for every record, offsets cut at min/end, epochs
once per batch, truncate(), and corrupt batches refused with nothing appended. Runs of
records laid out alike (taken in bulk) are tested with odd records among them, across
the offset deltas where the varint grows (64, 8192), and with damaged bytes inside a
run. The offset column (OffsetColumn) is tested against the list it stands for."""

from __future__ import annotations

import struct
from bisect import bisect_left

import crc32c
import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from client.record_columns import ColumnBuffer
from client.record_columns import OffsetColumn
from client.record_columns import decode_columns
from protocol.errors import CorruptRecordError
from protocol.record_batch import MAX_DECOMPRESSED_SIZE
from protocol.record_batch import BatchBuilder
from protocol.record_batch import Compression
from protocol.record_batch import decode_batch

headers_strategy = st.lists(
    st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=8)), max_size=2
)
record_strategy = st.tuples(
    st.none() | st.binary(max_size=300),  # value
    st.none() | st.binary(max_size=20),  # key
    headers_strategy,
    st.integers(min_value=-5000, max_value=5000),  # timestamp delta
)


def build(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    *,
    base_offset: int = 100,
    epoch: int = 7,
    compression: Compression = Compression.NONE,
) -> bytes:
    builder = BatchBuilder(
        compression=compression, partition_leader_epoch=epoch, base_timestamp=1_700_000_000_000
    )
    for value, key, headers, ts_delta in records:
        builder.append(value, key, headers, 1_700_000_000_000 + ts_delta)
    return builder.build(base_offset)


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(record_strategy, min_size=1, max_size=40),
    compression=st.sampled_from([Compression.NONE, Compression.LZ4]),
)
def test_columns_match_the_reference_decode(records, compression) -> None:
    batch = build(records, compression=compression)
    header, expected = decode_batch(batch, runs=False)
    columns = ColumnBuffer(True)
    got = decode_columns(batch, 0, columns)
    assert got == header
    assert columns.offsets == [r.offset for r in expected]
    assert columns.timestamps == [r.timestamp for r in expected]
    assert columns.keys == [r.key for r in expected]
    assert columns.values == [r.value for r in expected]
    assert columns.headers == [r.headers for r in expected]
    assert columns.epochs() == [7] * len(expected)


def assert_same_as_reference(batch: bytes) -> None:
    header, expected = decode_batch(batch, runs=False)
    columns = ColumnBuffer(True)
    assert decode_columns(batch, 0, columns) == header
    assert columns.offsets == [r.offset for r in expected]
    assert columns.timestamps == [r.timestamp for r in expected]
    assert columns.keys == [r.key for r in expected]
    assert columns.values == [r.value for r in expected]
    assert columns.headers == [r.headers for r in expected]


odd_record = st.sampled_from(
    [
        (b"x" * 7, None, [], 0),  # another value length
        (b"v" * 100, b"key", [], 0),  # a key
        (b"v" * 100, None, [("h", b"1")], 0),  # a header
        (b"v" * 100, None, [], 5000),  # a timestamp delta of two bytes
        (None, None, [], 0),  # a null value
        (b"", None, [], 0),  # an empty value
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=300),
    value_size=st.sampled_from([0, 1, 50, 100, 200]),
    ts_deltas=st.lists(st.integers(min_value=-63, max_value=63), min_size=1, max_size=4),
    odd=st.lists(st.tuples(st.integers(min_value=0, max_value=299), odd_record), max_size=6),
)
def test_runs_of_alike_records_with_odd_ones_among_them(count, value_size, ts_deltas, odd) -> None:
    records = [
        (bytes([i % 256]) * value_size, None, [], ts_deltas[i % len(ts_deltas)])
        for i in range(count)
    ]
    for at, record in odd:
        if at < count:
            records[at] = record
    assert_same_as_reference(build(records, base_offset=1000))


@pytest.mark.parametrize("count", [63, 64, 65, 8191, 8192, 8193, 20_000])
def test_runs_across_the_offset_deltas_where_the_varint_grows(count: int) -> None:
    assert_same_as_reference(build([(b"%07d" % i, None, [], i % 3) for i in range(count)]))


@settings(max_examples=80, deadline=None)
@given(at=st.integers(min_value=61, max_value=61 + 200 * 15 - 1), xor=st.integers(1, 255))
# The first record's offset delta turned into -1: the reference decoded it at offset -1,
# the columns dropped it (below min_offset); both now refuse deltas that do not increase.
@example(at=64, xor=1)
def test_a_damaged_byte_inside_a_run_is_decoded_as_the_reference_does(at, xor) -> None:
    """Whatever one damaged byte does (CRC not checked here), the columns say what
    decode_batch says, or both refuse the batch."""
    batch = bytearray(build([(b"v" * 10, None, [], 1)] * 200, base_offset=0))
    batch[at] ^= xor
    try:
        _, expected = decode_batch(bytes(batch), verify_crc=False, runs=False)
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            decode_columns(bytes(batch), 0, ColumnBuffer(True), verify_crc=False)
        return
    columns = ColumnBuffer(True)
    decode_columns(bytes(batch), 0, columns, verify_crc=False)
    assert columns.offsets == [r.offset for r in expected]
    assert columns.timestamps == [r.timestamp for r in expected]
    assert columns.keys == [r.key for r in expected]
    assert columns.values == [r.value for r in expected]
    assert columns.headers == [r.headers for r in expected]


def test_many_records_three_byte_offset_deltas_and_bounds() -> None:
    """A batch of 20,000 records (offset deltas past 8191 take three varint bytes),
    cut to [min_offset, end_offset)."""
    batch = build([(b"v%d" % i, None, [], 0) for i in range(20_000)], base_offset=0)
    columns = ColumnBuffer(False)
    decode_columns(batch, 0, columns, min_offset=9_000, end_offset=15_000)
    assert columns.offsets == list(range(9_000, 15_000))
    assert columns.values == [b"v%d" % i for i in range(9_000, 15_000)]
    assert columns.headers is None
    assert columns.epoch_runs == [(7, 6_000)]


def test_batches_append_and_truncate_keeps_epoch_runs() -> None:
    columns = ColumnBuffer(False)
    first = build([(b"a", None, [], 0)] * 3, base_offset=0, epoch=1)
    second = build([(b"b", None, [], 0)] * 4, base_offset=3, epoch=2)
    decode_columns(first, 0, columns)
    decode_columns(second, 0, columns)
    assert columns.offsets == list(range(7))
    assert columns.epochs() == [1, 1, 1, 2, 2, 2, 2]
    columns.truncate(5)
    assert columns.offsets == list(range(5)) and columns.values == [b"a"] * 3 + [b"b"] * 2
    assert columns.epoch_runs == [(1, 3), (2, 2)]
    columns.truncate(2)
    assert columns.epoch_runs == [(1, 2)]
    columns.clear()
    assert len(columns) == 0 and columns.epoch_runs == []


def test_a_batch_wholly_outside_the_bounds_adds_nothing() -> None:
    batch = build([(b"x", None, [], 0)] * 5, base_offset=10)
    columns = ColumnBuffer(False)
    header = decode_columns(batch, 0, columns, min_offset=15)
    assert header.next_offset == 15
    assert len(columns) == 0 and columns.epoch_runs == []


def _recrc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))


def _flip_a_body_byte(batch: bytearray) -> None:
    batch[70] ^= 0xFF  # the CRC no longer matches


def _first_record_too_long(batch: bytearray) -> None:
    batch[61] = 0x7E  # length varint 63: past the end of the body
    _recrc(batch)


def _byte_left_over(batch: bytearray) -> None:
    batch.append(0)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    _recrc(batch)


@pytest.mark.parametrize("damage", [_flip_a_body_byte, _first_record_too_long, _byte_left_over])
def test_corrupt_batches_raise_and_append_nothing(damage) -> None:
    batch = bytearray(build([(b"value-%d" % i, b"k", [], i) for i in range(3)]))
    damage(batch)
    columns = ColumnBuffer(False)
    with pytest.raises(CorruptRecordError):
        decode_columns(bytes(batch), 0, columns)
    assert len(columns) == 0 and columns.epoch_runs == []


def test_a_compression_bomb_is_refused_with_nothing_appended() -> None:
    """The column decoder inflates through the same bounded decompress as decode_batch."""
    bomb = BatchBuilder(compression=Compression.ZSTD)
    bomb.append(bytes(MAX_DECOMPRESSED_SIZE), timestamp=0)
    columns = ColumnBuffer(with_headers=False)
    with pytest.raises(CorruptRecordError, match="decompresses into more than"):
        decode_columns(bomb.build(), 0, columns)
    assert columns.offsets == []


@st.composite
def offset_pieces(draw: st.DrawFn) -> tuple[list[range | list[int]], list[int]]:
    """Increasing offsets cut into pieces, each a range or a list: (pieces, the list)."""
    pieces: list[range | list[int]] = []
    reference: list[int] = []
    at = draw(st.integers(min_value=0, max_value=2**40))
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        at += draw(st.integers(min_value=0, max_value=3))  # a gap, or none
        n = draw(st.integers(min_value=0, max_value=12))
        if draw(st.booleans()):
            piece: range | list[int] = range(at, at + n)
        else:
            steps = draw(st.lists(st.integers(min_value=1, max_value=3), min_size=n, max_size=n))
            piece = []
            for step in steps:
                piece.append(at)
                at += step
            at -= 1 if steps else 0
        pieces.append(piece)
        reference += piece
        at = (reference[-1] + 1) if reference else at
    return pieces, reference


@settings(max_examples=300, deadline=None)
@given(
    drawn=offset_pieces(),
    cut=st.tuples(st.integers(-30, 30) | st.none(), st.integers(-30, 30) | st.none()),
    step=st.sampled_from([None, 1, 2, -1]),
    probe=st.integers(min_value=-2, max_value=2**40 + 120),
)
def test_the_offset_column_is_the_list_it_stands_for(drawn, cut, step, probe) -> None:
    """OffsetColumn is a Sequence[int] like the list of its offsets: length, every
    index, slices, iteration, ==, rows_below (bisect), truncate; and it stays compact:
    consecutive offsets are ranges, a list piece has a gap in it."""
    pieces, reference = drawn
    column = OffsetColumn(pieces)
    assert len(column) == len(reference) and bool(column) == bool(reference)
    assert list(column) == reference and column.to_list() == reference
    assert column == reference and column == OffsetColumn([reference]) and column != [-1]
    for i in range(-len(reference), len(reference)):
        assert column[i] == reference[i]
    for i in (len(reference), -len(reference) - 1):
        with pytest.raises(IndexError):
            column[i]
    assert column[cut[0] : cut[1] : step] == reference[cut[0] : cut[1] : step]
    assert column.rows_below(probe) == bisect_left(reference, probe)
    for piece in column.pieces:
        assert isinstance(piece, range) or piece[-1] - piece[0] > len(piece) - 1
    keep = cut[0] if cut[0] is not None else 0
    column.truncate(keep)
    assert column == reference[: max(keep, 0)]


def test_an_offset_that_does_not_follow_is_refused() -> None:
    column = OffsetColumn([range(10, 20)])
    with pytest.raises(ValueError, match="offset 19 does not follow 19"):
        column.add([19, 21])
    assert column == list(range(10, 20))


def test_a_fetch_of_consecutive_offsets_is_one_range_whatever_its_length() -> None:
    """The invariant that keeps poll_batches() cheap: rows of consecutive offsets cost
    no Python int each. Three batches of 5,000 alike records (taken as runs) and one
    of records decoded one by one (sizes vary) make one range."""
    columns = ColumnBuffer(False)
    for first in (0, 5_000, 10_000):
        decode_columns(build([(b"x" * 50, None, [], 0)] * 5_000, base_offset=first), 0, columns)
    varied = [(b"y" * (i % 7), None, [], 0) for i in range(100)]
    decode_columns(build(varied, base_offset=15_000), 0, columns)
    assert columns.offsets.pieces == [range(0, 15_100)]
    assert columns.offsets[12_345] == 12_345 and columns.offsets[-1] == 15_099


def test_a_batch_overlapping_what_the_columns_hold_adds_only_what_follows() -> None:
    """A broker that answers with batches overlapping each other (5-14 after 0-9):
    each offset is handed out once, in order, as Kafka's consumer skips the records
    below its position; the overlap is neither repeated nor an error."""
    columns = ColumnBuffer(False)
    decode_columns(build([(b"a", None, [], 0)] * 10, base_offset=0), 0, columns)
    decode_columns(build([(b"b", None, [], 0)] * 10, base_offset=5), 0, columns)
    assert columns.offsets == list(range(15))
    assert columns.values == [b"a"] * 10 + [b"b"] * 5
    assert columns.epoch_runs == [(7, 10), (7, 5)]
