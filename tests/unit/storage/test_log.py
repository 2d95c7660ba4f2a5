"""Log: leader and follower appends, reads across segments, truncation, retention,
timestamps, configuration, flushing from another thread."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker.storage.epoch_cache import EpochEntry
from broker.storage.epoch_cache import LeaderEpochCheckpointFile
from broker.storage.errors import InvalidAppendError
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.errors import RecordTooLargeError
from broker.storage.errors import StorageError
from broker.storage.log import Log
from broker.storage.log import LogConfig
from broker.storage.log import parse_topic_partition
from protocol.errors import CorruptRecordError
from protocol.record_batch import BatchBuilder
from protocol.record_batch import BatchHeader
from protocol.record_batch import Compression
from protocol.record_batch import iter_headers
from protocol.record_batch import validate_batch

MakeBatch = Callable[..., bytes]
OpenLog = Callable[..., Log]
BIG = 10**9


def headers_of(data: bytes) -> list[BatchHeader]:
    return [header for _, header in iter_headers(data)]


def bases_of(data: bytes) -> list[int]:
    return [header.base_offset for header in headers_of(data)]


def fill(log: Log, make_batch: MakeBatch, epochs: list[int], *, records: int = 3) -> None:
    """One leader batch of `records` records per entry of `epochs`."""
    for epoch in epochs:
        log.append_as_leader(make_batch(records), epoch, now_ms=0)


# ---------------------------------------------------------------- open / names


def test_topic_partition_is_parsed_from_the_directory_name(tmp_path: Path):
    assert parse_topic_partition(tmp_path / "orders-0") == ("orders", 0)
    assert parse_topic_partition(tmp_path / "my-dashed-topic-12") == ("my-dashed-topic", 12)
    for bad in ("orders", "orders-", "-3", "orders-x"):
        with pytest.raises(StorageError, match="not <topic>-<partition>"):
            parse_topic_partition(tmp_path / bad)


def test_new_log_is_empty(open_log: OpenLog, log_dir: Path):
    log = open_log()
    assert log.topic_partition == ("orders", 0)
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (0, 0, 0)
    assert log.latest_epoch == -1
    assert log.read(0, BIG) == b""
    # No leader-epoch checkpoint until the first epoch: absent, it reads as the empty
    # cache it would hold (two fsyncs fewer per replica created).
    assert sorted(os.listdir(log_dir)) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
    ]


def test_open_removes_leftovers_and_refuses_unknown_files(
    open_log: OpenLog, log_dir: Path, make_batch: MakeBatch
):
    log = open_log()
    fill(log, make_batch, [0, 0])
    log.close()
    (log_dir / "leader-epoch-checkpoint.tmp").write_text("half")
    (log_dir / "00000000000000000042.log.deleted").write_text("old")
    (log_dir / "00000000000000000042.index").write_bytes(b"")  # orphan index
    reopened = open_log()
    assert reopened.log_end_offset == 6
    assert sorted(os.listdir(log_dir)) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "00000000000000000006.snapshot",  # producer state written at the clean close
        "leader-epoch-checkpoint",
    ]
    reopened.close()
    (log_dir / "notes.txt").write_text("mine")
    with pytest.raises(StorageError, match=r"unexpected file .*notes.txt.*move it out"):
        open_log()


# ---------------------------------------------------------------- leader appends


def test_leader_append_assigns_offsets_and_stamps_epoch(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    log.epoch_cache.assign(4, 0)  # what a new leader does before accepting writes
    info = log.append_as_leader(make_batch(3, epoch=-1, base_offset=999), 4, now_ms=0)
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 2, 1)
    assert info.log_append_time == -1 and info.max_timestamp == 1_000_002
    info = log.append_as_leader(make_batch(2) + make_batch(5), 4, now_ms=0)
    assert (info.first_offset, info.last_offset, info.batch_count) == (3, 9, 2)
    assert info.valid_bytes == len(make_batch(2) + make_batch(5))
    data = log.read(0, BIG)
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers_of(data)] == [
        (0, 4),
        (3, 4),
        (5, 4),
    ]
    for position, _ in iter_headers(data):
        validate_batch(data, position)  # stamping never touches the CRC-covered bytes
    assert log.log_end_offset == 10
    assert log.epoch_cache.entries == [EpochEntry(4, 0)]


def test_leader_append_learns_a_new_epoch_and_refuses_a_stale_one(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log()
    fill(log, make_batch, [1, 1, 3])
    assert log.epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(3, 6)]
    with pytest.raises(StorageError, match="deposed leader"):
        log.append_as_leader(make_batch(1), 2, now_ms=0)
    assert log.log_end_offset == 9


def test_leader_append_rejects_corrupt_and_oversized_batches(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log(LogConfig(max_message_bytes=150))
    corrupt = bytearray(make_batch(3))
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append_as_leader(bytes(corrupt), 0)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(b"", 0)
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes=150") as info:
        log.append_as_leader(make_batch(10), 0)
    assert isinstance(info.value, ValueError)
    assert log.log_end_offset == 0


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name)
def test_a_request_read_into_its_own_buffer_is_stamped_there_not_copied(
    open_log: OpenLog, tmp_path: Path, compression: Compression
):
    """Issue 20 (produce cost per MB): a Produce read into its own buffer
    (protocol/framing.py) is validated, stamped and written where it lies: the log
    holds exactly what the copying path writes, for every codec, and the buffer itself
    carries the stamps. A batch the copying path refuses is refused in place too."""
    builder = BatchBuilder(compression=compression, base_timestamp=5_000)
    for i in range(20):
        builder.append(b"value-%d" % i, b"key", headers=[("h", b"v")], timestamp=5_000 + i)
    wire = builder.build() + builder.build()
    copied = open_log()
    in_place = Log.open(tmp_path / "orders-1", LogConfig(), had_clean_shutdown=True)
    try:
        copied.append_as_leader(wire, 3, now_ms=0)
        copied.append_as_leader(wire, 3, now_ms=0)
        request = bytearray(wire)
        in_place.append_as_leader(memoryview(bytearray(wire)), 3, now_ms=0, in_place=True)
        in_place.append_as_leader(memoryview(request), 3, now_ms=0, in_place=True)
        assert in_place.read(0, BIG) == copied.read(0, BIG)
        assert [h.base_offset for h in headers_of(bytes(request))] == [40, 60]  # stamped
        assert {h.partition_leader_epoch for h in headers_of(bytes(request))} == {3}
        corrupt = bytearray(wire)
        corrupt[-1] ^= 1
        with pytest.raises(CorruptRecordError):
            copied.append_as_leader(bytes(corrupt), 3)
        with pytest.raises(CorruptRecordError):
            in_place.append_as_leader(memoryview(corrupt), 3, in_place=True)
        assert in_place.log_end_offset == copied.log_end_offset == 80
    finally:
        in_place.close()


# ---------------------------------------------------------------- follower appends


def test_follower_append_keeps_offsets_and_epochs(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    batches = make_batch(3, base_offset=0, epoch=2) + make_batch(2, base_offset=3, epoch=5)
    info = log.append_as_follower(batches, now_ms=0)
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 4, 2)
    assert log.read(0, BIG) == batches
    assert log.epoch_cache.entries == [EpochEntry(2, 0), EpochEntry(5, 3)]
    assert log.append_as_follower(b"").batch_count == 0


def test_follower_append_refuses_bad_offsets_epochs_and_corruption(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log()
    log.append_as_follower(make_batch(3, base_offset=0, epoch=2), now_ms=0)
    with pytest.raises(InvalidAppendError, match="below 3"):
        log.append_as_follower(make_batch(1, base_offset=2, epoch=2))
    with pytest.raises(InvalidAppendError, match="strictly increase"):
        log.append_as_follower(
            make_batch(2, base_offset=3, epoch=2) + make_batch(1, base_offset=4, epoch=2)
        )
    with pytest.raises(InvalidAppendError, match="leader epoch 1, below"):
        log.append_as_follower(make_batch(1, base_offset=3, epoch=1))
    with pytest.raises(InvalidAppendError, match="no leader epoch"):
        log.append_as_follower(make_batch(1, base_offset=3, epoch=-1))
    corrupt = bytearray(make_batch(1, base_offset=3, epoch=2))
    corrupt[30] ^= 1
    with pytest.raises(InvalidAppendError, match="CRC") as info:
        log.append_as_follower(bytes(corrupt))
    assert isinstance(info.value.__cause__, CorruptRecordError)
    assert log.log_end_offset == 3


def test_new_epochs_are_on_disk_before_the_follower_appends_them(
    open_log: OpenLog, make_batch: MakeBatch
):
    """Issue 20 (a follower of thousands of partitions after a failover): the epochs a
    fetch answer starts are learnt and their checkpoint written on a worker thread
    before the append, which then writes nothing on the loop; the file is never behind
    the log. Invalid batches and batches of the current epoch start no write."""
    log = open_log()
    log.append_as_follower(make_batch(3, base_offset=0, epoch=2), now_ms=0)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="epoch-ckpt") as writer:
        assert log.learn_epochs_ahead(make_batch(1, base_offset=3, epoch=2), writer) is None
        corrupt = bytearray(make_batch(1, base_offset=3, epoch=4))
        corrupt[30] ^= 1
        assert log.learn_epochs_ahead(bytes(corrupt), writer) is None
        assert log.learn_epochs_ahead(make_batch(1, base_offset=2, epoch=4), writer) is None
        assert log.epoch_cache.entries == [EpochEntry(2, 0)]
        batches = make_batch(2, base_offset=3, epoch=4) + make_batch(1, base_offset=5, epoch=6)
        future = log.learn_epochs_ahead(batches, writer)
        assert future is not None
        future.result(5)
        on_disk = LeaderEpochCheckpointFile(log.epoch_cache.path).read()
        assert on_disk == [EpochEntry(2, 0), EpochEntry(4, 3), EpochEntry(6, 5)]
        written_at = os.stat(log.epoch_cache.path).st_mtime_ns, os.stat(log.epoch_cache.path).st_ino
        log.append_as_follower(batches, now_ms=0)
    assert not log.epoch_cache.unwritten
    # The append found the file written: it did not replace it.
    assert (os.stat(log.epoch_cache.path).st_mtime_ns, os.stat(log.epoch_cache.path).st_ino) == (
        written_at
    )
    assert log.log_end_offset == 6


def test_follower_gap_starts_a_new_segment(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    log.append_as_follower(make_batch(3, base_offset=0, epoch=1), now_ms=0)
    log.append_as_follower(make_batch(2, base_offset=10, epoch=1), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 10]
    assert log.log_end_offset == 12
    assert bases_of(log.read(5, BIG)) == [10]  # an offset in the gap reads what follows
    assert bases_of(log.read(0, BIG)) == [0, 10]


def test_follower_gap_on_an_empty_log_moves_the_log_start(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    log.append_as_follower(make_batch(2, base_offset=500, epoch=7), now_ms=0)
    assert [s.base_offset for s in log.segments] == [500]
    assert (log.log_start_offset, log.log_end_offset) == (500, 502)


def test_follower_replaces_epoch_claims_without_data(open_log: OpenLog, make_batch: MakeBatch):
    """This replica led epoch 3 without writing; the leader's epoch-2 batches replace it."""
    log = open_log()
    log.append_as_follower(make_batch(3, base_offset=0, epoch=2), now_ms=0)
    log.epoch_cache.assign(3, 3)
    log.append_as_follower(make_batch(2, base_offset=3, epoch=2), now_ms=0)
    assert log.epoch_cache.entries == [EpochEntry(2, 0)]
    log.append_as_follower(make_batch(2, base_offset=5, epoch=4), now_ms=0)
    assert log.epoch_cache.entries == [EpochEntry(2, 0), EpochEntry(4, 5)]


# ---------------------------------------------------------------- rolling


def test_segments_roll_by_size_and_reads_span_them(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    fill(log, make_batch, [0] * 20)
    assert len(log.segments) > 2
    assert all(s.size <= 700 for s in log.segments)
    assert [s.base_offset for s in log.segments] == sorted(s.base_offset for s in log.segments)
    data = log.read(0, BIG)
    assert bases_of(data) == list(range(0, 60, 3))
    assert log.size_in_bytes == len(data)
    # Any starting offset returns the batch holding it first, across segment boundaries.
    for offset in range(60):
        assert bases_of(log.read(offset, BIG))[0] == offset - offset % 3
    # max_bytes stops at whole batches even across a segment boundary.
    one = len(make_batch(3))
    boundary = log.segments[1].base_offset
    assert bases_of(log.read(boundary - 3, 2 * one + 10)) == [boundary - 3, boundary]


def test_single_batch_larger_than_segment_bytes_gets_its_own_segment(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log(LogConfig(segment_bytes=200))
    fill(log, make_batch, [0])
    log.append_as_leader(make_batch(20), 0, now_ms=0)
    fill(log, make_batch, [0])
    assert [s.base_offset for s in log.segments] == [0, 3, 23]


def test_segments_roll_by_age(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log(LogConfig(segment_ms=1000), now_ms=0)
    log.append_as_leader(make_batch(1), 0, now_ms=0)
    log.append_as_leader(make_batch(1), 0, now_ms=1000)
    assert len(log.segments) == 1
    log.append_as_leader(make_batch(1), 0, now_ms=1001)
    assert [s.base_offset for s in log.segments] == [0, 2]
    assert log.maybe_roll(now_ms=1500) is log.active_segment
    assert log.maybe_roll(now_ms=2002).base_offset == 3


def test_explicit_roll(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    empty = log.roll(now_ms=0)
    assert empty.base_offset == 0 and len(log.segments) == 1  # nothing to roll
    fill(log, make_batch, [0])
    assert log.roll(now_ms=0).base_offset == 3
    assert log.active_segment.is_empty


# ---------------------------------------------------------------- reads


def test_read_bounds(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    fill(log, make_batch, [0] * 10)
    assert log.read(30, BIG) == b""  # at the LEO
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(31, BIG)
    assert (info.value.offset, info.value.log_start_offset, info.value.log_end_offset) == (
        31,
        0,
        30,
    )
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, BIG)


def test_read_with_max_offset_stops_before_the_high_watermark(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log()
    fill(log, make_batch, [0] * 10)
    assert bases_of(log.read(0, BIG, max_offset=14)) == [0, 3, 6, 9, 12]
    assert bases_of(log.read(0, BIG, max_offset=15)) == [0, 3, 6, 9, 12]
    assert bases_of(log.read(0, BIG, max_offset=16)) == [0, 3, 6, 9, 12, 15]
    assert log.read(15, BIG, max_offset=15) == b""
    assert bases_of(log.read(9, 1, max_offset=20)) == [9]


def test_read_min_one_batch(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    fill(log, make_batch, [0] * 3)
    assert bases_of(log.read(3, 10)) == [3]
    assert log.read(3, 10, min_one_batch=False) == b""
    assert bases_of(log.read(3, 0)) == [3]


# ---------------------------------------------------------------- truncation


def test_truncate_to_removes_everything_at_or_past_the_offset(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log()
    fill(log, make_batch, [0] * 6 + [2] * 6 + [5] * 6)  # offsets 0..53, several segments
    before = log.read(0, BIG)
    log.flush()
    assert log.recovery_point == 54
    assert log.truncate_to(40)  # inside batch 39..41: cut at 39
    assert log.log_end_offset == 39
    assert log.recovery_point == 39
    assert log.read(0, BIG) == before[: len(log.read(0, BIG))]
    assert bases_of(log.read(0, BIG))[-1] == 36
    assert log.epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(2, 18), EpochEntry(5, 36)]
    assert all(s.base_offset <= 39 for s in log.segments)
    assert log.truncate_to(36)
    assert log.epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(2, 18)]
    assert not log.truncate_to(36)  # nothing left to remove
    fill(log, make_batch, [6])  # appends continue at the new end
    assert bases_of(log.read(33, BIG)) == [33, 36]


def test_truncate_to_at_or_past_the_end_drops_epoch_claims_only(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log()
    fill(log, make_batch, [1, 1])
    log.epoch_cache.assign(3, 6)  # became leader, wrote nothing, then deposed
    assert not log.truncate_to(6)
    assert log.epoch_cache.entries == [EpochEntry(1, 0)]
    assert log.log_end_offset == 6


def test_truncate_below_the_first_segment_restarts_the_log(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log()
    fill(log, make_batch, [0] * 12)
    log.delete_old_segments(high_watermark=36, now_ms=0)
    log.delete_records_before(20)
    first = log.segments[0].base_offset
    assert first > 10
    assert log.truncate_to(10)
    assert [s.base_offset for s in log.segments] == [10]
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (10, 10, 10)
    assert log.epoch_cache.entries == []


def test_truncate_fully_and_start_at(open_log: OpenLog, make_batch: MakeBatch, log_dir: Path):
    log = open_log()
    fill(log, make_batch, [0] * 12)
    log.truncate_fully_and_start_at(1000)
    assert [s.base_offset for s in log.segments] == [1000]
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1000)
    assert log.epoch_cache.entries == []
    assert sorted(p for p in os.listdir(log_dir) if p.endswith(".log")) == [
        "00000000000000001000.log"
    ]
    log.append_as_follower(make_batch(2, base_offset=1000, epoch=9), now_ms=0)
    assert log.epoch_cache.entries == [EpochEntry(9, 1000)]


# ---------------------------------------------------------------- retention


def test_retention_by_size_deletes_whole_old_segments(open_log: OpenLog, make_batch: MakeBatch):
    one = len(make_batch(3))
    log = open_log(LogConfig(segment_bytes=700, retention_bytes=8 * one, retention_ms=-1))
    fill(log, make_batch, [0] * 6 + [1] * 6 + [2] * 6)
    segment_count = len(log.segments)
    assert log.delete_old_segments(high_watermark=0, now_ms=0) == 0  # nothing below the HW
    deleted = log.delete_old_segments(high_watermark=log.log_end_offset, now_ms=0)
    assert deleted >= 1
    assert len(log.segments) == segment_count - deleted
    assert log.size_in_bytes <= 8 * one + 700
    assert log.log_start_offset == log.segments[0].base_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, BIG)
    assert bases_of(log.read(log.log_start_offset, BIG))[0] == log.log_start_offset
    # The epoch cache keeps the entry covering the new log start, moved up to it.
    start = log.log_start_offset
    expected_epoch = 0 if start < 18 else 1 if start < 36 else 2
    assert log.epoch_cache.earliest_entry == EpochEntry(expected_epoch, start)


def test_retention_by_time_never_deletes_the_active_segment(
    open_log: OpenLog, make_batch: MakeBatch
):
    log = open_log(LogConfig(segment_bytes=700, retention_ms=5_000))
    for n in range(18):  # batch n has timestamps 1_000_000 + 1000 n ...
        log.append_as_leader(make_batch(3, timestamp=1_000_000 + 1000 * n), n // 6, now_ms=0)
    now = 1_000_000 + 1000 * 30
    deleted = log.delete_old_segments(high_watermark=log.log_end_offset, now_ms=now)
    assert deleted == len(log.segments) + deleted - 1  # all but the active one
    assert len(log.segments) == 1
    assert log.log_start_offset == log.active_segment.base_offset
    assert log.epoch_cache.entries == [EpochEntry(2, log.log_start_offset)]
    # Young segments are kept.
    log2_dir = log.dir.with_name("young-0")
    young = Log.open(
        log2_dir, LogConfig(segment_bytes=700, retention_ms=5_000), had_clean_shutdown=True
    )
    for n in range(12):
        young.append_as_leader(make_batch(3, timestamp=1_000_000 + 1000 * n), 0, now_ms=0)
    assert young.delete_old_segments(high_watermark=36, now_ms=1_000_000 + 3_000) == 0
    young.close()


def test_retention_respects_the_high_watermark(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log(LogConfig(segment_bytes=700, retention_bytes=0))
    fill(log, make_batch, [0] * 18)
    second = log.segments[1].base_offset
    assert log.delete_old_segments(high_watermark=second - 1, now_ms=0) == 0
    assert log.delete_old_segments(high_watermark=second, now_ms=0) == 1


def test_delete_records_before(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    fill(log, make_batch, [0] * 6 + [4] * 12)  # offsets 0..53 in three segments
    third = log.segments[2].base_offset
    assert log.delete_records_before(third + 1) == third + 1
    assert log.segments[0].base_offset == third  # whole segments below it are gone
    assert bases_of(log.read(third + 1, BIG))[0] == third  # the batch holding it, whole
    with pytest.raises(OffsetOutOfRangeError):
        log.read(third, BIG)
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(51, high_watermark=50)
    assert log.delete_records_before(5) == third + 1  # never backwards
    assert log.epoch_cache.entries == [EpochEntry(4, third + 1)]
    assert log.delete_records_before(54) == 54  # everything
    assert log.read(54, BIG) == b""
    assert len(log.segments) == 1 and log.active_segment.is_empty
    assert log.epoch_cache.entries == [EpochEntry(4, 54)]


# ---------------------------------------------------------------- timestamps


def test_offset_for_timestamp(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    for n in range(12):
        log.append_as_leader(make_batch(3, timestamp=5_000 + 100 * n), n // 4, now_ms=0)
    # The first record at or after the time (inside its batch, as Kafka), its own time.
    assert log.offset_for_timestamp(0) == (0, 5_000, 0)
    assert log.offset_for_timestamp(5_002) == (2, 5_002, 0)
    assert log.offset_for_timestamp(5_003) == (3, 5_100, 0)
    assert log.offset_for_timestamp(5_450) == (15, 5_500, 1)
    assert log.offset_for_timestamp(6_102) == (35, 6_102, 2)
    assert log.offset_for_timestamp(6_103) is None
    assert log.offset_for_timestamp(-2) == (0, -1, 0)
    assert log.offset_for_timestamp(-1) == (36, -1, 2)
    log.delete_records_before(10)
    assert log.offset_for_timestamp(0) == (10, 5_301, 0)


# ---------------------------------------------------------------- config


def test_log_config_from_topic_configs():
    base = LogConfig()
    config = LogConfig.from_topic_configs(
        {
            "segment.bytes": "1048576",
            "segment.ms": "60000",
            "retention.bytes": "-1",
            "retention.ms": "3600000",
            "flush.messages": "1",
            "flush.ms": "9223372036854775807",
            "max.message.bytes": "2000000",
            "index.interval.bytes": "0",
            "cleanup.policy": "delete",  # not ours: ignored
        },
        base,
    )
    assert config == LogConfig(
        segment_bytes=1048576,
        segment_ms=60000,
        retention_bytes=-1,
        retention_ms=3600000,
        flush_messages=1,
        flush_ms=None,
        max_message_bytes=2000000,
        index_interval_bytes=0,
    )
    assert LogConfig.from_topic_configs({}, base) == base
    assert base.segment_bytes == 128 * 1024 * 1024 and base.max_message_bytes == 1048588


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("segment.bytes", "ten", "expected an integer"),
        ("segment.bytes", "10", r"must be in \[14, 2147483647\]"),
        ("segment.bytes", "4294967296", "must be in"),
        ("retention.ms", "-2", "must be in"),
        ("flush.messages", "0", "must be in"),
        ("index.interval.bytes", "1.5", "expected an integer"),
    ],
)
def test_log_config_rejects_bad_values(name: str, value: str, problem: str):
    with pytest.raises(ValueError, match=problem) as info:
        LogConfig.from_topic_configs({name: value})
    assert name in str(info.value) and repr(value) in str(info.value)


def test_log_config_validates_direct_construction():
    with pytest.raises(ValueError, match=r"segment\.bytes"):
        LogConfig(segment_bytes=0)


# ---------------------------------------------------------------- flushing


def test_flush_advances_the_recovery_point(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log()
    fill(log, make_batch, [0] * 10)
    assert log.unflushed_messages == 30
    log.flush(up_to=12, now_ms=777)
    assert log.recovery_point == 12 and log.last_flush_ms == 777
    assert log.unflushed_messages == 18
    log.flush(up_to=10**6)
    assert log.recovery_point == 30


def test_flush_from_a_worker_thread_while_appending(open_log: OpenLog, make_batch: MakeBatch):
    log = open_log(LogConfig(segment_bytes=2000, index_interval_bytes=100))
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                log.flush()
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for n in range(300):
            log.append_as_leader(make_batch(2), n // 100, now_ms=0)
            if n % 97 == 5:
                log.truncate_to(log.log_end_offset - 3)
            if n % 53 == 0:
                log.delete_old_segments(high_watermark=log.log_end_offset, now_ms=0)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    log.flush()
    assert log.recovery_point == log.log_end_offset
    assert log.log_start_offset <= log.recovery_point


def test_closed_log_refuses_writes_and_delete_removes_the_directory(
    open_log: OpenLog, make_batch: MakeBatch, log_dir: Path
):
    log = open_log()
    fill(log, make_batch, [0])
    log.close()
    with pytest.raises(StorageError, match="closed"):
        log.append_as_leader(make_batch(1), 0)
    log.flush()  # a late flush of a closed log is a no-op
    log.delete()
    assert not log_dir.exists()


def test_a_new_leaders_epoch_reaches_the_checkpoint_before_its_first_batch(open_log, make_batch):
    """KIP-101's order kept with the deferred write (issue 20: a broker taking over
    3,333 partitions spent an fsync pair on each on its event loop, stopped
    heartbeating and was fenced, over and over): `assign_epoch_at_end` writes nothing
    yet, the epoch's first append writes the checkpoint before its batch, and a close
    writes an epoch that never got a batch. The file is never behind the log."""
    log = open_log()
    log.append_as_leader(make_batch(2), 0, now_ms=0)
    checkpoint = log.dir / "leader-epoch-checkpoint"
    assert checkpoint.read_text().splitlines()[2:] == ["0 0"]

    log.assign_epoch_at_end(3)
    assert log.latest_epoch == 3
    assert checkpoint.read_text().splitlines()[2:] == ["0 0"]  # not yet: no batch of it

    log.append_as_leader(make_batch(2), 3, now_ms=0)
    assert checkpoint.read_text().splitlines()[2:] == ["0 0", "3 2"]

    log.assign_epoch_at_end(5)  # an epoch that never writes a batch here
    log.close()
    assert checkpoint.read_text().splitlines()[2:] == ["0 0", "3 2", "5 4"]
