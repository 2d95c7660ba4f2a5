"""LogSegment: appends, whole-batch reads, truncation, reopen, recovery, timestamps."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from broker.storage.errors import CorruptIndexError
from broker.storage.errors import CorruptSegmentError
from broker.storage.segment import LogSegment
from protocol.record_batch import iter_headers
from protocol.record_batch import iter_records
from protocol.record_batch import validate_batch

BASE = 100
MakeBatch = Callable[..., bytes]


def _segment(tmp_path: Path, interval: int = 0) -> LogSegment:
    return LogSegment.create(tmp_path, BASE, index_interval_bytes=interval, now_ms=0)


def _fill(segment: LogSegment, make_batch: MakeBatch, counts: list[int], epoch: int = 1) -> bytes:
    """Append batches of `counts` records each; returns the file's expected bytes."""
    written = b""
    offset = segment.next_offset
    for n, count in enumerate(counts):
        batch = make_batch(count, base_offset=offset, epoch=epoch, timestamp=10_000 + 100 * n)
        header = validate_batch(batch)
        segment.append(batch, [header])
        written += batch
        offset = header.next_offset
    return written


def _bases(data: bytes) -> list[int]:
    return [header.base_offset for _, header in iter_headers(data)]


def test_file_names_use_twenty_digit_base_offset(tmp_path: Path):
    segment = _segment(tmp_path)
    segment.close()
    assert sorted(os.listdir(tmp_path)) == [
        "00000000000000000100.index",
        "00000000000000000100.log",
        "00000000000000000100.timeindex",
    ]


def test_append_then_read_returns_whole_batches(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path)
    written = _fill(segment, make_batch, [3, 1, 4, 2])
    assert segment.size == len(written)
    assert segment.next_offset == BASE + 10
    assert (tmp_path / "00000000000000000100.log").read_bytes() == written
    assert segment.read(BASE, 10**6) == written
    # From inside the third batch (offsets 104..107): that batch is returned whole.
    assert _bases(segment.read(BASE + 5, 10**6)) == [104, 108]
    assert segment.read(BASE + 10, 10**6) == b""
    segment.close()


def test_read_limits(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path)
    written = _fill(segment, make_batch, [3, 1, 4, 2])
    first_size = validate_batch(written).size
    assert _bases(segment.read(BASE, first_size + 5)) == [100]  # no partial second batch
    assert _bases(segment.read(BASE, 1)) == [100]  # min_one_batch: first batch whole
    assert segment.read(BASE, 1, min_one_batch=False) == b""
    assert _bases(segment.read(BASE, 10**6, max_offset=104)) == [100, 103]
    assert _bases(segment.read(BASE, 10**6, max_offset=105)) == [100, 103, 104]
    assert segment.read(BASE + 4, 10**6, max_offset=104) == b""
    assert _bases(segment.read(BASE, 10**6, max_position=first_size)) == [100]
    sliced = segment.read_slice(BASE, 10**6)
    assert sliced.reached_end and sliced.data == written
    assert not segment.read_slice(BASE, 10**6, max_offset=104).reached_end
    segment.close()


def test_index_entries_point_at_batch_starts(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path, interval=200)
    written = _fill(segment, make_batch, [2] * 12)
    starts = {header.base_offset: position for position, header in iter_headers(written)}
    assert len(segment.offset_index) > 0
    for offset, position in segment.offset_index.entries:
        assert starts[offset] == position
    # Every lookup lands on the batch holding the offset.
    for offset in range(BASE, segment.next_offset):
        position, header = segment.translate_offset(offset)
        assert header.base_offset <= offset <= header.last_offset
        assert starts[header.base_offset] == position
    segment.close()


def test_append_asserts_offsets_continue_from_next_offset(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path)
    _fill(segment, make_batch, [3])
    for base in (BASE, BASE + 2, BASE + 4):  # overlapping, going back, or leaving a gap
        batch = make_batch(1, base_offset=base)
        with pytest.raises(AssertionError):
            segment.append(batch, [validate_batch(batch)])
    segment.close()


def test_truncate_to_cuts_at_the_start_of_the_batch_holding_the_offset(
    tmp_path: Path, make_batch: MakeBatch
):
    segment = _segment(tmp_path)
    written = _fill(segment, make_batch, [3, 1, 4, 2])
    position_of_104 = next(p for p, h in iter_headers(written) if h.base_offset == 104)
    removed = segment.truncate_to(BASE + 6)  # inside batch 104..107
    assert removed == len(written) - position_of_104
    assert segment.next_offset == 104
    assert segment.read(BASE, 10**6) == written[:position_of_104]
    assert all(offset < 104 for offset, _ in segment.offset_index.entries)
    assert segment.truncate_to(BASE + 50) == 0
    segment.close()


def test_reopen_after_close_restores_state(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path, interval=150)
    written = _fill(segment, make_batch, [3, 1, 4, 2, 2, 2])
    state = (segment.next_offset, segment.max_timestamp, segment.offset_index.entries)
    segment.close()
    reopened = LogSegment.open(tmp_path, BASE, index_interval_bytes=150, now_ms=0)
    reopened.sanity_check()
    assert (reopened.next_offset, reopened.max_timestamp, reopened.offset_index.entries) == state
    assert reopened.read(BASE, 10**6) == written
    assert reopened.last_epoch == 1
    # Appends continue with the same index spacing as before the restart.
    more = _fill(reopened, make_batch, [1, 1, 1])
    assert reopened.read(BASE, 10**6) == written + more
    reopened.close()


def test_sanity_check_detects_a_torn_tail_and_a_bad_index(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path, interval=0)
    written = _fill(segment, make_batch, [3, 1, 4])
    segment.close()
    log_path = tmp_path / "00000000000000000100.log"
    with open(log_path, "ab") as f:
        f.write(b"\x00" * 20)
    torn = LogSegment.open(tmp_path, BASE, index_interval_bytes=0, now_ms=0)
    with pytest.raises(CorruptSegmentError, match="partial batch header"):
        torn.sanity_check()
    assert torn.recover() == 20
    assert torn.read(BASE, 10**6) == written
    torn.close()

    index_path = tmp_path / "00000000000000000100.index"
    raw = bytearray(index_path.read_bytes())
    raw[-1] ^= 0x01  # the last entry now points one byte off
    index_path.write_bytes(bytes(raw))
    bad = LogSegment.open(tmp_path, BASE, index_interval_bytes=0, now_ms=0)
    with pytest.raises(CorruptIndexError):
        bad.sanity_check()
    bad.close()

    index_path.unlink()
    missing = LogSegment.open(tmp_path, BASE, index_interval_bytes=0, now_ms=0)
    with pytest.raises(CorruptIndexError, match="missing"):
        missing.sanity_check()
    assert missing.recover() == 0
    assert len(missing.offset_index) == 2
    missing.close()


def test_recover_rebuilds_identical_indexes(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path, interval=150)
    _fill(segment, make_batch, [3, 1, 4, 2, 2, 2, 5, 1])
    entries = (segment.offset_index.entries, segment.time_index.entries)
    segment.close()
    (tmp_path / "00000000000000000100.index").write_bytes(b"garbage!")
    reopened = LogSegment.open(tmp_path, BASE, index_interval_bytes=150, now_ms=0)
    assert reopened.recover() == 0
    reopened.on_become_inactive()  # the final time index entry close() had written
    assert (reopened.offset_index.entries, reopened.time_index.entries) == entries
    reopened.close()


def test_recover_refuses_a_whole_batch_leaving_a_gap(tmp_path: Path, make_batch: MakeBatch):
    """A whole, CRC-valid batch after a gap in the offsets (104..108 skipped) is out of
    place, not torn: recovery refuses it and cuts nothing."""
    segment = _segment(tmp_path)
    _fill(segment, make_batch, [3, 1])
    segment.close()
    path = tmp_path / "00000000000000000100.log"
    with open(path, "ab") as f:
        f.write(make_batch(2, base_offset=BASE + 9, epoch=1))  # skips 104..108
    before = path.read_bytes()
    reopened = LogSegment.open(tmp_path, BASE, index_interval_bytes=0, now_ms=0)
    with pytest.raises(CorruptSegmentError, match="base offset 109 where 104 was expected"):
        reopened.recover()
    reopened.close()
    assert path.read_bytes() == before


def test_find_offset_by_timestamp(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path, interval=100)
    # Batch n holds timestamps 10_000 + 100 n .. + count - 1
    _fill(segment, make_batch, [3, 1, 4, 2, 2, 2])
    records = [r for _, r in iter_records(segment.read(BASE, 10**6))]
    for target in range(9_990, 10_520, 7):
        # The first record (not batch: Kafka looks inside the batch) at or after it.
        expected = next((r for r in records if r.timestamp >= target), None)
        found = segment.find_offset_by_timestamp(target)
        if expected is None:
            assert found is None
        else:
            assert found == (expected.offset, expected.timestamp, 1)
    # Inside a batch: batch 2 holds offsets 4-7 at 10_200-10_203.
    assert segment.find_offset_by_timestamp(10_202) == (BASE + 6, 10_202, 1)
    assert segment.find_offset_by_timestamp(10_200, start_offset=BASE + 5) == (BASE + 5, 10_201, 1)
    segment.close()


def test_find_offset_by_timestamp_in_a_log_append_time_batch(tmp_path: Path, make_batch: MakeBatch):
    """A LogAppendTime batch's records all carry its max timestamp (Kafka's rule): the
    lookup answers the batch's first offset, whatever the records' own times say."""
    segment = _segment(tmp_path)
    batch = bytearray(make_batch(4, base_offset=BASE, epoch=1, timestamp=10_000))
    attributes = int.from_bytes(batch[21:23], "big") | 0x08  # timestamp type bit
    batch[21:23] = attributes.to_bytes(2, "big")
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    header = validate_batch(bytes(batch))
    segment.append(bytes(batch), [header])
    assert segment.find_offset_by_timestamp(10_002) == (BASE, 10_003, 1)
    assert segment.find_offset_by_timestamp(10_000, start_offset=BASE + 2) == (BASE + 2, 10_003, 1)
    segment.close()


def test_flush_close_delete(tmp_path: Path, make_batch: MakeBatch):
    segment = _segment(tmp_path)
    _fill(segment, make_batch, [3])
    segment.flush()
    segment.delete()
    assert os.listdir(tmp_path) == []
    segment.flush()  # a flush racing a deletion is harmless
