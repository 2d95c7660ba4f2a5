"""Partition: the leader-epoch check matrix and the high-watermark invariants."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from broker_harness import partition_state

from broker.partition import Partition
from broker.partition import Role
from broker.storage.errors import FileOpenError
from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.errors import ErrorCode
from protocol.record_batch import encode_batch
from tests.open_file_limits import descriptors_exhausted

# Partition t-0 on brokers 1 and 2.
state = partial(partition_state, replicas=(1, 2), isr=(1, 2))


@pytest.fixture
def partition(tmp_path: Path):
    log = Log.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    p = Partition("t", 0, "T", log, node_id=1, high_watermark=99)
    yield p
    log.close()


def test_checkpointed_hw_is_capped_by_the_log(partition: Partition) -> None:
    assert partition.high_watermark == 0


def test_epoch_checks(partition: Partition) -> None:
    p = partition
    assert p.check_leader_epoch(-1) == ErrorCode.NOT_LEADER_OR_FOLLOWER  # offline
    p.make_leader(state(1, 5), now_ms=0)
    assert p.check_leader_epoch(-1) == ErrorCode.NONE
    assert p.check_leader_epoch(5) == ErrorCode.NONE
    assert p.check_leader_epoch(4) == ErrorCode.FENCED_LEADER_EPOCH
    assert p.check_leader_epoch(6) == ErrorCode.UNKNOWN_LEADER_EPOCH
    p.make_follower(state(2, 6))
    assert p.check_leader_epoch(6) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert p.check_leader_epoch(6, require_leader=False) == ErrorCode.NONE
    assert p.check_leader_epoch(5) == ErrorCode.FENCED_LEADER_EPOCH
    p.stop()
    assert p.check_leader_epoch(-1) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert p.role is Role.STOPPED


def test_epochs_never_go_back(partition: Partition) -> None:
    partition.make_leader(state(1, 5), now_ms=0)
    with pytest.raises(AssertionError):
        partition.make_follower(state(2, 4))


def test_high_watermark_is_min_leo_over_the_isr(partition: Partition) -> None:
    p = partition
    p.make_leader(state(1, 0), now_ms=0)
    for _ in range(3):
        p.append_as_leader(encode_batch([(None, b"v")]))
    assert p.high_watermark == 0  # follower 2 has not fetched in this epoch
    assert p.update_follower_fetch_state(2, 10, 2, now_ms=1)
    assert p.high_watermark == 2
    assert not p.update_follower_fetch_state(2, 10, 1, now_ms=2)  # never back
    assert p.high_watermark == 2
    with pytest.raises(AssertionError):
        p._set_high_watermark(1)
    # The ISR shrinks to the leader alone: HW = LEO.
    p.make_leader(state(1, 0, isr=(1,), pe=1), now_ms=3)
    assert p.high_watermark == 3
    assert p.replica_states[2].log_end_offset == 1  # kept within the same term


def test_unsafe_ignore_leader_epoch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The test-only switch skips the KIP-320 comparison (a stale leader accepts a
    newer epoch), loudly; the role check stays."""
    import broker.partition as partition_module

    log = Log.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    try:
        p = Partition("t", 0, "T", log, node_id=1, ignore_leader_epoch=True)
        p.make_leader(state(1, 5), now_ms=0)
        partition_module._warned_ignore_epoch = False
        with caplog.at_level("WARNING"):
            assert p.check_leader_epoch(4) == ErrorCode.NONE
            assert p.check_leader_epoch(9) == ErrorCode.NONE
        assert caplog.text.count("UNSAFE TEST SWITCH") == 1
        p.make_follower(state(2, 6))
        assert p.check_leader_epoch(9) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    finally:
        log.close()


def test_becoming_leader_without_a_descriptor_for_the_epoch_checkpoint(
    partition: Partition,
) -> None:
    """Issue 20: the leader-epoch checkpoint cannot be written (EMFILE): make_leader
    (the metadata handler's step) goes on; appends answer a storage error until the
    checkpoint is on disk, and then carry the new epoch."""
    p = partition
    with descriptors_exhausted():
        p.make_leader(state(1, 3), now_ms=0)  # must not raise
        assert p.is_leader and p.log.latest_epoch == 3
        with pytest.raises(FileOpenError):
            p.append_as_leader(encode_batch([(None, b"v")]))
    assert p.log.log_end_offset == 0
    checkpoint = p.log.dir / "leader-epoch-checkpoint"
    assert not checkpoint.exists() or not checkpoint.read_text().endswith("3 0\n")
    p.append_as_leader(encode_batch([(None, b"v")]))
    assert p.log.log_end_offset == 1
    assert (p.log.dir / "leader-epoch-checkpoint").read_text().endswith("3 0\n")
