"""Runs of alike records decoded in bulk (protocol/records/alike_runs.py, used by
decode_batch_into, the consumer's poll() path, and by decode_columns, poll_batches()
and the Spark source): whatever the batch, the records are exactly those of the
one-by-one decode (`runs=False`), and a batch the one-by-one decode refuses is refused
too. The invariant protected: the bulk path is a faster way
to the same answer, never a more lenient reader."""

from __future__ import annotations

import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from record_faults import raw_batch
from record_faults import record

from client.record_columns import ColumnBuffer
from client.record_columns import decode_columns
from protocol.errors import CorruptRecordError
from protocol.record_batch import BatchBuilder
from protocol.record_batch import Compression
from protocol.record_batch import decode_batch

BASE_TS = 1_700_000_000_000


def build(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    *,
    base_offset: int = 100,
    compression: Compression = Compression.NONE,
) -> bytes:
    builder = BatchBuilder(
        compression=compression, partition_leader_epoch=7, base_timestamp=BASE_TS
    )
    for value, key, headers, ts_delta in records:
        builder.append(value, key, headers, BASE_TS + ts_delta)
    return builder.build(base_offset)


def assert_bulk_is_the_reference(batch: bytes, *, verify_crc: bool = True) -> None:
    """decode_batch's bulk runs (poll()) and decode_columns (poll_batches(), Spark) say
    what the one-by-one decode says, or all three refuse the batch."""
    columns = ColumnBuffer(True)
    try:
        expected = decode_batch(batch, verify_crc=verify_crc, runs=False)
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            decode_batch(batch, verify_crc=verify_crc)
        with pytest.raises(CorruptRecordError):
            decode_columns(batch, 0, columns, verify_crc=verify_crc)
        return
    assert decode_batch(batch, verify_crc=verify_crc) == expected
    decode_columns(batch, 0, columns, verify_crc=verify_crc)
    records = expected[1]
    assert columns.offsets == [r.offset for r in records]
    assert columns.timestamps == [r.timestamp for r in records]
    assert columns.keys == [r.key for r in records]
    assert columns.values == [r.value for r in records]
    assert columns.headers == [r.headers for r in records]


odd_record = st.sampled_from(
    [
        (b"x" * 7, None, [], 0),  # another value length
        (b"v" * 100, b"key", [], 0),  # a key
        (b"v" * 100, None, [("h", b"1")], 0),  # a header
        (b"v" * 100, None, [], 5000),  # a timestamp delta of two bytes
        (b"v" * 100, None, [], 9_000_000),  # ... of four bytes
        (None, None, [], 0),  # a null value
        (b"", None, [], 0),  # an empty value
    ]
)


@settings(max_examples=80, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=300),
    value_size=st.sampled_from([None, 0, 1, 50, 100, 200]),
    key_size=st.sampled_from([None, 0, 4]),
    ts_deltas=st.sampled_from(
        [[0], [1, 2, 3], [-63, 63], [64, 8000, -8000], [9_000_000], [0, 100_000]]
    ),
    odd=st.lists(st.tuples(st.integers(min_value=0, max_value=299), odd_record), max_size=6),
    compression=st.sampled_from([Compression.NONE, Compression.LZ4]),
)
def test_runs_with_odd_records_among_them_decode_as_one_by_one(
    count, value_size, key_size, ts_deltas, odd, compression
) -> None:
    """Keys of one size or null, values of one size, null or empty, timestamp deltas
    of one, two or more varint bytes, and records of another layout anywhere."""
    records = [
        (
            None if value_size is None else bytes([i % 256]) * value_size,
            None if key_size is None else bytes([i % 7]) * key_size,
            [],
            ts_deltas[i % len(ts_deltas)],
        )
        for i in range(count)
    ]
    for at, one in odd:
        if at < count:
            records[at] = one
    assert_bulk_is_the_reference(build(records, base_offset=1000, compression=compression))


@pytest.mark.parametrize("count", [63, 64, 65, 8191, 8192, 8193, 20_000])
def test_runs_across_the_offset_deltas_where_the_varint_grows(count: int) -> None:
    batch = build([(b"%07d" % i, b"k", [], i % 3) for i in range(count)], base_offset=0)
    assert_bulk_is_the_reference(batch)
    _, records = decode_batch(batch)
    assert [r.offset for r in records] == list(range(count))
    assert records[-1].value == b"%07d" % (count - 1)


def test_log_append_time_gives_every_record_of_a_run_the_batch_timestamp() -> None:
    batch = bytearray(build([(b"v" * 10, None, [], i % 5) for i in range(100)]))
    batch[22] |= 0x08  # attributes: LogAppendTime (CRC not checked below)
    expected = decode_batch(bytes(batch), verify_crc=False, runs=False)
    assert decode_batch(bytes(batch), verify_crc=False) == expected
    assert {r.timestamp for r in expected[1]} == {expected[0].max_timestamp}


@settings(max_examples=120, deadline=None)
@given(at=st.integers(min_value=61, max_value=61 + 200 * 15 - 1), xor=st.integers(1, 255))
@example(at=64, xor=1)
def test_a_damaged_byte_inside_a_run_is_decoded_as_one_by_one(at: int, xor: int) -> None:
    """Whatever one damaged byte does (CRC not checked), the bulk path says what the
    one-by-one decode says, or both refuse the batch."""
    batch = bytearray(build([(b"v" * 10, None, [], 1)] * 200, base_offset=0))
    batch[at] ^= xor
    assert_bulk_is_the_reference(bytes(batch), verify_crc=False)


def test_a_run_never_passes_the_headers_last_offset_delta() -> None:
    """Offset deltas 1, 2, ..., 20 in a batch of 20 records whose header ends at delta
    19 (a gap first, as compaction leaves): the record at delta 20 lies outside the
    batch (it would repeat the next batch's first offset). One by one it is refused; a
    run after the first record that only checked that its deltas follow on would have
    taken it. Both decoders refuse it, CRC and all else valid."""
    block = b"".join(record(d, b"v" * 10) for d in range(1, 21))
    batch = raw_batch(block, 20, last_offset_delta=19)
    with pytest.raises(CorruptRecordError, match="offset delta 20"):
        decode_batch(batch, runs=False)
    with pytest.raises(CorruptRecordError, match="offset delta 20"):
        decode_batch(batch)
    with pytest.raises(CorruptRecordError, match="offset delta 20"):
        decode_columns(batch, 0, ColumnBuffer(True))
