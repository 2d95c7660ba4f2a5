"""What a broker validates on produce (Kafka's LogValidator): a batch that no reader
could read is refused with a message naming the fault, never stored.

Each fault is built by hand under a valid CRC-32C (the C library the codec uses), so
the header and CRC checks alone pass it: without the record walk every one of these
batches was acknowledged and left its partition's consumers stuck."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from protocol_strategies import batches
from protocol_strategies import mutated
from protocol_strategies import records
from record_faults import raw_batch
from record_faults import record
from record_faults import three_records
from record_faults import zeros_compressed

from client.record_columns import ColumnBuffer
from client.record_columns import decode_columns
from protocol import record_batch as rb
from protocol.errors import CorruptRecordError
from protocol.errors import InvalidRecordError
from protocol.record_batch import Compression
from protocol.record_batch import encode_varint


def refused(buf: bytes, error: type[CorruptRecordError], match: str) -> str:
    """The batch is refused with `error` (exactly: INVALID_RECORD and CORRUPT_MESSAGE
    are different answers) and a message that matches; returns the message."""
    with pytest.raises(CorruptRecordError, match=match) as info:
        rb.validate_produce_batches(bytearray(buf))
    assert type(info.value) is error, info.value
    return str(info.value)


# ---------------------------------------------------------------- the faults


def test_a_sound_hand_built_batch_passes() -> None:
    """The builder above is right: what it makes without a lie is accepted and decodes."""
    buf = raw_batch(three_records(), 3)
    assert [h.record_count for _, h in rb.validate_produce_batches(bytearray(buf))] == [3]
    assert [r.value for r in rb.decode_batch(buf)[1]] == [b"a" * 10, b"b" * 10, b"c" * 10]


def test_a_record_count_of_zero_is_refused() -> None:
    refused(raw_batch(record(0), 0, last_offset_delta=0), InvalidRecordError, "record count 0")
    # With a negative last_offset_delta the header itself is corrupt (as before).
    refused(raw_batch(b"", 0), CorruptRecordError, "negative last_offset_delta -1")


def test_a_count_that_disagrees_with_the_offsets_is_refused() -> None:
    message = refused(
        raw_batch(three_records(), 2, last_offset_delta=2), InvalidRecordError, "2 records"
    )
    assert "last_offset_delta 2" in message


def test_a_count_that_disagrees_with_the_records_is_refused() -> None:
    refused(raw_batch(three_records(), 4), InvalidRecordError, "declares 4 records but holds 3")
    refused(raw_batch(three_records(), 2), InvalidRecordError, "left over after the last of the 2")


def test_a_last_offset_delta_of_a_billion_is_refused() -> None:
    """The log end would jump by a billion offsets for one record."""
    refused(
        raw_batch(record(0), 1, last_offset_delta=10**9),
        InvalidRecordError,
        "1000000000",
    )
    # ... and a count to match it cannot fit in the batch's bytes.
    refused(
        raw_batch(record(0), 10**9 + 1, last_offset_delta=10**9),
        InvalidRecordError,
        "cannot fit",
    )


def test_garbage_records_under_a_valid_crc_are_refused() -> None:
    garbage = bytes(range(7, 250, 3)) * 3
    buf = raw_batch(garbage, 3)
    rb.validate_batch(buf)  # the header and the CRC are sound
    refused(buf, InvalidRecordError, "batch at byte 0: record 0")


def test_a_record_claiming_a_gigabyte_value_is_refused() -> None:
    bad = record(0) + record(1, b"tiny", value_len=1 << 30)
    message = refused(raw_batch(bad, 2), InvalidRecordError, "record 1 claims a value of")
    assert "1073741824 bytes" in message and "remain" in message


def test_a_negative_key_length_other_than_minus_one_is_refused() -> None:
    refused(raw_batch(record(0, key=b"k", key_len=-2), 1), InvalidRecordError, "key length -2")


def test_a_header_count_that_lies_is_refused() -> None:
    refused(raw_batch(record(0, header_count=5), 1), InvalidRecordError, "declares 5 headers")
    refused(raw_batch(record(0, header_count=-1), 1), InvalidRecordError, "declares -1 headers")
    two = record(0, headers=[(b"a", b"1"), (b"b", b"2")], header_count=3)
    refused(raw_batch(two, 1), InvalidRecordError, "record 0")


def test_bad_record_headers_are_refused() -> None:
    refused(raw_batch(record(0, headers=[(None, b"x")]), 1), InvalidRecordError, "never null")
    refused(raw_batch(record(0, headers=[(b"\xff", b"x")]), 1), InvalidRecordError, "UTF-8")


def test_offset_deltas_that_are_not_consecutive_are_refused() -> None:
    bad = record(0) + record(2) + record(3)
    refused(raw_batch(bad, 3), InvalidRecordError, "record 1 has offset delta 2, expected 1")
    refused(raw_batch(record(-1), 1), InvalidRecordError, "offset delta -1, expected 0")


def test_a_record_length_that_disagrees_with_its_fields_is_refused() -> None:
    short = record(0, b"value", length=4)
    refused(raw_batch(short + bytes(20), 1), InvalidRecordError, "record 0")
    long = record(0, b"value", length=12)
    refused(
        raw_batch(long + b"\x00\x00", 1),
        InvalidRecordError,
        "is 12 bytes long but its fields take 11",
    )
    refused(raw_batch(record(0, length=200), 1), InvalidRecordError, "claims 200 bytes")
    for length in (0, -1):
        refused(raw_batch(record(0, length=length), 1), InvalidRecordError, f"length {length}$")


def test_trailing_bytes_after_the_last_record_are_refused() -> None:
    refused(raw_batch(three_records() + b"\x00", 3), InvalidRecordError, "1 bytes left over")


@pytest.mark.parametrize(("bit", "what"), [(0x20, "control"), (0x10, "transactional")])
def test_control_and_transactional_batches_from_a_client_are_refused(bit: int, what: str) -> None:
    refused(raw_batch(three_records(), 3, attributes=bit), InvalidRecordError, what)


def test_an_idempotent_batch_without_a_sequence_is_refused() -> None:
    buf = raw_batch(three_records(), 3, producer=(7, 0, -1))
    refused(buf, InvalidRecordError, "invalid sequence number -1 for producer id 7")
    rb.validate_produce_batches(bytearray(raw_batch(three_records(), 3, producer=(7, 0, 0))))


@pytest.mark.parametrize(
    ("codec", "most"), [(Compression.ZSTD, 7_000), (Compression.GZIP, 210_000)], ids=str
)
def test_a_compression_bomb_is_refused(codec: Compression, most: int) -> None:
    """The issue's bombs: zstd 6.4 KB and gzip 204 KB that inflate into 200 MiB."""
    block = zeros_compressed(codec, 200 << 20)
    assert len(block) < most
    refused(
        raw_batch(block, 1, attributes=int(codec)), CorruptRecordError, "decompresses into more"
    )


@pytest.mark.parametrize("codec", [c for c in Compression if c], ids=lambda c: c.name)
def test_compressed_records_are_walked_like_plain_ones(codec: Compression) -> None:
    bad = record(0) + record(1, b"tiny", value_len=1 << 30)
    block = rb.compress(codec, bad)
    message = refused(raw_batch(block, 2, attributes=int(codec)), InvalidRecordError, "record 1")
    assert f"({codec.name}, {len(bad)} bytes decompressed)" in message
    garbage = raw_batch(b"not compressed", 1, attributes=int(codec))
    refused(garbage, CorruptRecordError, f"{codec.name.lower()}|{codec.name}")


def test_one_bad_batch_refuses_the_whole_record_set() -> None:
    good = raw_batch(three_records(), 3)
    bad = raw_batch(record(0) + record(5), 2)
    message = refused(good + bad, InvalidRecordError, f"batch at byte {len(good)}")
    assert "record 1 has offset delta 5" in message


# ---------------------------------------------------------------- runs of alike records


def uniform_batch(count: int, value_size: int = 100, *, codec: Compression = Compression.NONE):
    builder = rb.BatchBuilder(compression=codec)
    for i in range(count):
        builder.append(bytes([i % 251]) * value_size, None, (), 1000 + i // 40)
    return builder.build()


@pytest.mark.parametrize("count", [1, 2, 63, 64, 65, 300, 8191, 8193, 9000])
def test_long_batches_of_alike_records_pass(count: int) -> None:
    """Runs of records laid out alike are checked in bulk; the runs break where the
    offset delta or timestamp delta varint grows, and at the batch's end."""
    rb.validate_produce_batches(bytearray(uniform_batch(count, 20)))


def patched_byte(data: bytes, at: int, set_bits: int = 0, clear_bits: int = 0) -> bytes:
    out = bytearray(data)
    out[at] = (out[at] | set_bits) & ~clear_bits
    return bytes(out)


@pytest.mark.parametrize("ts_delta", [0, 100], ids=["1-byte timestamps", "2-byte timestamps"])
@pytest.mark.parametrize("where", [1, 30, 63, 64, 200, 299])
def test_a_fault_inside_a_run_of_alike_records_is_found(where: int, ts_delta: int) -> None:
    """A lie in one record in the middle of many alike ones: the bulk check sees it."""
    good = [record(i, b"x" * 20, ts_delta=ts_delta) for i in range(300)]
    ts_at = 2  # after the one-byte record length and the attributes
    ts_end = ts_at + len(encode_varint(ts_delta)) - 1
    mine = good[where]
    for lie, fault in (
        (record(where, b"x" * 20, key_len=-2, ts_delta=ts_delta), "key length -2"),
        (record(where + 1, b"x" * 20, ts_delta=ts_delta), f"offset delta {where + 1}"),
        (record(where, b"x" * 20, header_count=1, ts_delta=ts_delta), "declares 1 headers"),
        (record(where, b"x" * 19, length=len(mine) - 3, ts_delta=ts_delta), "fields take"),
        # the timestamp delta's varint made longer or shorter by its high bits
        (patched_byte(mine, ts_end, set_bits=0x80), ""),
        (patched_byte(mine, ts_at, clear_bits=0x80) if ts_end > ts_at else None, ""),
        # longer but sound: it only breaks the run
        (record(where, b"x" * 20, ts_delta=1 << 40), None),
        (record(where, b"x" * 20, key=b"k" * 200, ts_delta=ts_delta), None),
    ):
        if lie is None:
            continue
        parts = list(good)
        parts[where] = lie
        buf = bytearray(raw_batch(b"".join(parts), 300))
        if fault is None:
            rb.validate_produce_batches(buf)
        else:
            with pytest.raises(InvalidRecordError, match=rf"record {where}\b.*{fault}"):
                rb.validate_produce_batches(buf)


def test_records_with_headers_are_walked_one_by_one() -> None:
    """Header bytes are not part of a run's layout: a bad header key among records
    with alike headers is found."""
    good = [record(i, b"x" * 20, headers=[(b"h", b"\x00")]) for i in range(100)]
    rb.validate_produce_batches(bytearray(raw_batch(b"".join(good), 100)))
    good[70] = record(70, b"x" * 20, headers=[(b"\xff", b"\x00")])
    with pytest.raises(InvalidRecordError, match="record 70 header 0: the key is not UTF-8"):
        rb.validate_produce_batches(bytearray(raw_batch(b"".join(good), 100)))


# ---------------------------------------------------------------- properties

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(batch=batches(), producer=st.tuples(st.integers(0, 2**40), st.integers(0, 99)))
def test_every_batch_the_builder_builds_passes(batch: bytes, producer: tuple[int, int]) -> None:
    rb.validate_produce_batches(bytearray(batch))
    builder = rb.BatchBuilder(producer_id=producer[0], producer_epoch=0, base_sequence=producer[1])
    builder.append(b"v", b"k", [("h", None)])
    rb.validate_produce_batches(bytearray(builder.build()))


@PROPERTY
@given(
    items=st.lists(records, min_size=1, max_size=5),
    copies=st.integers(1, 150),
    codec=st.sampled_from(list(Compression)),
)
def test_every_long_batch_the_builder_builds_passes(items, copies: int, codec) -> None:
    """Many records, alike or not, so both the one-by-one walk and the bulk runs run."""
    builder = rb.BatchBuilder(compression=codec)
    for key, value, headers, ts in (items * copies)[:400]:
        builder.append(value, key, headers, ts)
    rb.validate_produce_batches(bytearray(builder.build()))


def readers_accept(buf: bytes) -> bool:
    """Whether every reader decodes the batch: the record decoder, the Spark columns."""
    try:
        header, decoded = rb.decode_batch(buf)
        decode_columns(buf, 0, ColumnBuffer(with_headers=True))
    except CorruptRecordError:
        return False
    return [r.offset for r in decoded] == list(range(header.base_offset, header.next_offset))


@st.composite
def damaged_records(draw) -> bytes:
    """A batch of up to 200 records, mostly alike (so runs are checked in bulk), whose
    records block (and sometimes count) was damaged, with the batch length and CRC
    made right again: only the record walk can tell."""
    codec = draw(st.sampled_from([Compression.NONE, Compression.NONE, Compression.LZ4]))
    value = draw(st.binary(max_size=30))
    odd = draw(st.lists(st.tuples(st.integers(0, 199), records), max_size=3))
    count = draw(st.integers(1, 200))
    parts = [record(i, value) for i in range(count)]
    for at, (key, other, headers, _) in odd:
        if at < count:
            pairs = [(k.encode(), v) for k, v in headers]
            parts[at] = record(at, other, key, pairs)
    block = bytearray(b"".join(parts))
    kind = draw(st.sampled_from(["flip", "byte", "mutated", "none"]))
    if kind == "flip":
        block[draw(st.integers(0, len(block) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "byte":
        block[draw(st.integers(0, len(block) - 1))] = draw(st.integers(0, 255))
    elif kind == "mutated":
        block = bytearray(draw(mutated(bytes(block))))
    count = draw(st.sampled_from([count] * 6 + [count + 1, count - 1, 0]))
    return raw_batch(rb.compress(codec, bytes(block)), count, attributes=int(codec))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(buf=damaged_records())
def test_damaged_records_under_a_valid_crc_never_crash_and_never_pass_unreadable(
    buf: bytes,
) -> None:
    """Invariant: the validator raises only its own errors, and what it accepts every
    reader decodes, offsets base..base+count-1 (so no consumer gets stuck on it)."""
    try:
        rb.validate_produce_batches(bytearray(buf))
    except CorruptRecordError as exc:
        assert str(exc)
        return
    assert readers_accept(buf)
