"""Idempotent-producer state (broker/storage/producer_state.py) through the Log: the
dedup window of 5 batches, the sequence and epoch rules, truncation rollback,
snapshots (write, load, corrupt -> rebuild) and rebuild from headers after a crash."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from broker.storage.log import Log
from broker.storage.log import LogConfig
from broker.storage.producer_state import INT32_MAX
from broker.storage.producer_state import ProducerStateError
from broker.storage.producer_state import ProducerStateManager
from broker.storage.producer_state import snapshot_file_name
from protocol.errors import ErrorCode
from protocol.record_batch import BatchBuilder
from protocol.record_batch import BatchHeader
from protocol.record_batch import parse_header

PID = 1000


def batch(seq: int, records: int = 3, *, pid: int = PID, epoch: int = 0) -> bytes:
    now = int(time.time() * 1000)
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(records):
        builder.append(f"{pid}-{epoch}-{seq + i}".encode(), timestamp=now)
    return builder.build()


def header(
    seq: int, records: int = 3, *, pid: int = PID, epoch: int = 0, at: int = 0
) -> BatchHeader:
    return parse_header(batch(seq, records, pid=pid, epoch=epoch))._replace(base_offset=at)


def count_batches(log: Log) -> int:
    return sum(1 for segment in log.segments for _ in segment.iter_batches())


@pytest.fixture
def snapshot_on_close() -> bool:
    return False  # open_log's logs close as these tests left their snapshots


def test_each_of_the_last_five_batches_is_deduplicated(open_log) -> None:
    log = open_log()
    offsets = [log.append_as_leader(batch(3 * i), 0).first_offset for i in range(6)]
    assert offsets == [0, 3, 6, 9, 12, 15]
    for i in range(1, 6):  # the last five are cached
        info = log.append_as_leader(batch(3 * i), 0)
        assert info.duplicate and (info.first_offset, info.last_offset) == (3 * i, 3 * i + 2)
        assert log.log_end_offset == 18
    # The oldest fell out of the window: neither a duplicate nor in sequence.
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(0), 0)
    assert exc.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.append_as_leader(batch(18), 0).first_offset == 18
    assert count_batches(log) == 7


def test_out_of_order_and_unknown_producer(open_log) -> None:
    log = open_log()
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(5), 0)
    assert exc.value.error_code == ErrorCode.UNKNOWN_PRODUCER_ID
    log.append_as_leader(batch(0), 0)
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(4), 0)  # a gap: 3 expected
    assert exc.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(1, 2), 0)  # overlaps but is not a cached batch
    assert exc.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.log_end_offset == 3
    # Several batches of one producer in one append are checked against each other.
    log.append_as_leader(batch(3) + batch(6), 0)
    assert log.producer_state.entry(PID).last_seq == 8
    with pytest.raises(ProducerStateError):
        log.append_as_leader(batch(9) + batch(13), 0)
    assert log.log_end_offset == 9  # nothing of a refused append is written
    # Batches without a producer id are not checked.
    plain = BatchBuilder()
    plain.append(b"x")
    assert log.append_as_leader(plain.build(), 0).first_offset == 9


def test_epochs_fence_older_producers_and_restart_sequences(open_log) -> None:
    log = open_log()
    log.append_as_leader(batch(0, epoch=1), 0)
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(3, epoch=0), 0)
    assert exc.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(3, epoch=2), 0)  # a new epoch starts at 0
    assert exc.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    log.append_as_leader(batch(0, epoch=2), 0)
    entry = log.producer_state.entry(PID)
    assert (entry.epoch, entry.last_seq, len(entry.batches)) == (2, 2, 1)
    # A retry from the old epoch is not a duplicate any more: fenced.
    with pytest.raises(ProducerStateError) as exc:
        log.append_as_leader(batch(0, epoch=1), 0)
    assert exc.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH


def test_sequences_wrap_at_int32_max(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path, name="t-0")
    state.apply_replicated([header(INT32_MAX - 2, 3)])  # last sequence INT32_MAX
    assert state.entry(PID).last_seq == INT32_MAX
    check = state.prepare_leader_append([header(0, 2, at=3)])
    state.commit(check, 5)
    assert state.entry(PID).last_seq == 1
    wrapping = header(INT32_MAX - 1, 4, at=5)  # INT32_MAX-1 .. 1 across the wrap
    assert wrapping.last_sequence == 1
    state2 = ProducerStateManager(tmp_path, name="t-1")
    state2.apply_replicated([header(INT32_MAX - 4, 3)])
    state2.commit(state2.prepare_leader_append([wrapping]), 9)
    assert state2.prepare_leader_append([wrapping]).duplicate is not None
    with pytest.raises(ProducerStateError):
        state2.prepare_leader_append([header(INT32_MAX, 1, at=9)])
    assert state2.prepare_leader_append([header(2, 1, at=9)]).duplicate is None


def test_followers_build_the_same_state(open_log, tmp_path: Path, small_config: LogConfig) -> None:
    leader = open_log()
    for i in range(4):
        leader.append_as_leader(batch(3 * i), 0)
    follower = Log.open(tmp_path / "orders-1", small_config, had_clean_shutdown=True)
    follower.append_as_follower(leader.read(0, 1 << 20))
    # A new leader deduplicates a retry of a batch it only replicated.
    info = follower.append_as_leader(batch(9), 1)
    assert info.duplicate and info.first_offset == 9
    assert follower.append_as_leader(batch(12), 1).first_offset == 12
    follower.close(snapshot=False)


def test_truncation_rolls_the_state_back(open_log, log_dir: Path) -> None:
    log = open_log()
    for i in range(12):  # several segments, so snapshots at each roll
        log.append_as_leader(batch(3 * i), 0)
    assert len(log.segments) >= 2
    assert log.producer_state.snapshot_offsets() == [18]  # written at the roll
    log.truncate_to(21)  # keeps seq 0..20: snapshot 18, then the batch at 18
    assert log.producer_state.entry(PID).last_seq == 20
    assert all(s <= 21 for s in log.producer_state.snapshot_offsets())
    # The batch at 21 is gone: a resend is appended again, not answered as duplicate.
    info = log.append_as_leader(batch(21), 1)
    assert not info.duplicate and info.first_offset == 21
    assert log.append_as_leader(batch(18), 1).first_offset == 18  # kept: duplicate
    log.truncate_to(12)  # below the snapshot: it goes, the state comes from the log start
    assert log.producer_state.snapshot_offsets() == []
    assert log.producer_state.entry(PID).last_seq == 11
    log.truncate_to(0)
    assert log.producer_state.entry(PID) is None
    log.append_as_leader(batch(0), 2)
    log.truncate_fully_and_start_at(100)
    assert log.producer_state.entry(PID) is None and not log.producer_state.snapshot_offsets()


def test_snapshot_at_clean_shutdown_is_loaded(open_log, log_dir: Path) -> None:
    log = open_log()
    for i in range(3):
        log.append_as_leader(batch(3 * i), 0)
    log.append_as_leader(batch(0, pid=7), 0)
    log.close()
    assert (log_dir / snapshot_file_name(12)).exists()
    reopened = open_log()
    assert reopened.producer_state.map_end_offset == 12
    assert reopened.append_as_leader(batch(6), 0).duplicate
    assert reopened.append_as_leader(batch(0, pid=7), 0).first_offset == 9
    assert reopened.append_as_leader(batch(9), 0).first_offset == 12


def test_corrupt_snapshot_is_ignored_and_the_state_rebuilt(
    open_log, log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log()
    for i in range(3):
        log.append_as_leader(batch(3 * i), 0)
    log.close()
    path = log_dir / snapshot_file_name(9)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        reopened = open_log()
    assert "corrupt producer snapshot" in caplog.text
    assert not path.exists()
    assert reopened.append_as_leader(batch(3), 0).duplicate
    assert reopened.producer_state.entry(PID).last_seq == 8


def test_state_is_rebuilt_from_headers_after_a_crash(open_log, log_dir: Path) -> None:
    log = open_log()
    for i in range(10):  # some rolls (snapshots), then batches past the last snapshot
        log.append_as_leader(batch(3 * i), 0)
    last_snapshot = max(log.producer_state.snapshot_offsets())
    assert last_snapshot < 30
    log.close(snapshot=False)  # a crash: no snapshot at the end
    reopened = open_log(had_clean_shutdown=False, recovery_point=0)
    assert reopened.producer_state.map_end_offset == 30
    assert reopened.append_as_leader(batch(27), 0).duplicate
    assert reopened.append_as_leader(batch(30), 0).first_offset == 30
    # And with no snapshot at all: rebuilt from the log start.
    reopened.close(snapshot=False)
    for offset in reopened.producer_state.snapshot_offsets():
        (log_dir / snapshot_file_name(offset)).unlink()
    again = open_log(had_clean_shutdown=False)
    assert again.producer_state.entry(PID).last_seq == 32
    assert again.append_as_leader(batch(30), 0).duplicate


def test_producers_expire_and_are_capped(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path, name="t-0", max_producers=2, expiration_ms=1000)
    state.apply_replicated([header(0, pid=1), header(0, pid=2, at=3)])
    state.apply_replicated([header(3, pid=1, at=6)])  # pid 1 is now the most recent
    state.apply_replicated([header(0, pid=3, at=9)])
    assert sorted(state.producers) == [1, 3]  # pid 2, least recently written, evicted
    now = state.entry(3).last_timestamp
    assert state.remove_expired(now + 999) == 0
    assert state.remove_expired(now + 100_000) == 2 and not state.producers
