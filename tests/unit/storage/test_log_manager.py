"""LogManager: clean-shutdown marker, checkpoints, discovery, crash-safe deletion."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.storage.checkpoints import LOG_START_OFFSET_CHECKPOINT
from broker.storage.checkpoints import RECOVERY_POINT_CHECKPOINT
from broker.storage.checkpoints import OffsetCheckpointFile
from broker.storage.errors import CorruptCheckpointError
from broker.storage.errors import StorageError
from broker.storage.log import LogConfig
from broker.storage.log_manager import CLEAN_SHUTDOWN_FILE
from broker.storage.log_manager import LogManager
from runtime import fileio

MakeBatch = Callable[..., bytes]
CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=0)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _started(data_dir: Path) -> LogManager:
    manager = LogManager(data_dir, CONFIG)
    manager.startup()
    return manager


def test_first_startup_is_unclean_and_shutdown_leaves_the_marker(data_dir: Path):
    manager = LogManager(data_dir, CONFIG)
    assert manager.startup() == set()
    assert not manager.had_clean_shutdown
    manager.shutdown()
    assert (data_dir / CLEAN_SHUTDOWN_FILE).exists()
    again = LogManager(data_dir, CONFIG)
    again.startup()
    assert again.had_clean_shutdown
    assert not (data_dir / CLEAN_SHUTDOWN_FILE).exists()  # a crash now must look unclean
    again.close()
    after_crash = _started(data_dir)
    assert not after_crash.had_clean_shutdown
    after_crash.close()


def test_logs_and_checkpoints_survive_a_clean_restart(data_dir: Path, make_batch: MakeBatch):
    manager = _started(data_dir)
    orders = manager.get_or_create_log(("orders", 0))
    dashed = manager.get_or_create_log(("my-topic-v2", 3), LogConfig(segment_bytes=300))
    assert manager.get_or_create_log(("orders", 0)) is orders
    assert manager.get_log(("nope", 0)) is None
    for n in range(12):
        orders.append_as_leader(make_batch(3), n // 4, now_ms=0)
        dashed.append_as_leader(make_batch(1), 0, now_ms=0)
    orders.delete_records_before(5)
    manager.checkpoint_high_watermarks({("orders", 0): 30, ("my-topic-v2", 3): 12})
    manager.shutdown()

    recovery = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read()
    starts = OffsetCheckpointFile(data_dir / LOG_START_OFFSET_CHECKPOINT).read()
    assert recovery == {("orders", 0): 36, ("my-topic-v2", 3): 12}
    assert starts == {("orders", 0): 5, ("my-topic-v2", 3): 0}

    restarted = LogManager(data_dir, CONFIG)
    assert restarted.startup() == {("orders", 0), ("my-topic-v2", 3)}
    assert restarted.read_high_watermarks() == {("orders", 0): 30, ("my-topic-v2", 3): 12}
    log = restarted.get_log(("orders", 0))
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (5, 36, 36)
    assert log.latest_epoch == 2
    assert {tp for tp in (lg.topic_partition for lg in restarted.all_logs())} == {
        ("orders", 0),
        ("my-topic-v2", 3),
    }
    restarted.close()


def test_crash_recovers_logs_past_their_recovery_points(data_dir: Path, make_batch: MakeBatch):
    manager = _started(data_dir)
    log = manager.get_or_create_log(("orders", 0))
    for _ in range(10):
        log.append_as_leader(make_batch(3), 0, now_ms=0)
    manager.checkpoint_recovery_points_and_log_starts()  # recovery point 0 on disk
    tail = log.active_segment.log_path
    manager.close()  # crash: no flush, no marker
    with open(tail, "r+b") as f:
        f.truncate(tail.stat().st_size - 7)  # the last write was torn
    recovered = _started(data_dir)
    assert not recovered.had_clean_shutdown
    log = recovered.get_log(("orders", 0))
    assert log.log_end_offset == 27
    assert log.recovery_point == 27
    # Startup recorded the new recovery points straight away.
    assert OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read() == {("orders", 0): 27}
    recovered.close()


def test_delete_log_removes_it_and_its_checkpoint_entries(data_dir: Path, make_batch: MakeBatch):
    manager = _started(data_dir)
    log = manager.get_or_create_log(("orders", 0))
    log.append_as_leader(make_batch(3), 0, now_ms=0)
    manager.get_or_create_log(("orders", 1))
    manager.checkpoint_recovery_points_and_log_starts()
    assert manager.delete_log(("orders", 0))
    assert not manager.delete_log(("orders", 0))
    manager.wait_for_background_writes()  # the files are removed on the writer thread
    assert sorted(os.listdir(data_dir)) == sorted(
        [".lock", "orders-1", RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT]
    )
    assert OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read() == {("orders", 1): 0}
    recreated = manager.get_or_create_log(("orders", 0))
    assert recreated.log_end_offset == 0
    manager.close()


def test_delete_interrupted_between_rename_and_rmtree_is_finished_at_startup(
    data_dir: Path, make_batch: MakeBatch
):
    manager = _started(data_dir)
    log = manager.get_or_create_log(("orders", 0))
    log.append_as_leader(make_batch(3), 0, now_ms=0)
    manager.get_or_create_log(("orders", 1))
    manager.shutdown()
    # The first step of delete_log, then a crash: the directory is renamed, not removed.
    os.rename(data_dir / "orders-0", data_dir / f"orders-0.{'ab' * 16}-delete")
    restarted = LogManager(data_dir, CONFIG)
    assert restarted.startup() == {("orders", 1)}
    assert not any(name.endswith("-delete") for name in os.listdir(data_dir))
    restarted.close()


def test_garbage_checkpoint_refuses_startup_with_a_clear_error(data_dir: Path):
    data_dir.mkdir()
    (data_dir / RECOVERY_POINT_CHECKPOINT).write_text("0\n1\norders zero 1\n")
    manager = LogManager(data_dir, CONFIG)
    with pytest.raises(CorruptCheckpointError) as info:
        manager.startup()
    message = str(info.value)
    assert str(data_dir / RECOVERY_POINT_CHECKPOINT) in message
    assert "line 3" in message and "move the file away" in message
    with pytest.raises(CorruptCheckpointError):  # not "in use": the lock was released
        LogManager(data_dir, CONFIG).startup()


def test_second_manager_on_the_same_directory_is_refused(data_dir: Path):
    first = _started(data_dir)
    with pytest.raises(StorageError, match="in use by another broker process"):
        LogManager(data_dir, CONFIG).startup()
    first.close()


def test_startup_ignores_foreign_entries_and_removes_temp_files(data_dir: Path):
    data_dir.mkdir()
    (data_dir / "not-a-partition").mkdir()
    (data_dir / "meta.properties").write_text("version=1\nnode.id=1\n")
    (data_dir / "replication-offset-checkpoint.tmp").write_text("half")
    manager = _started(data_dir)
    assert manager.all_logs() == []
    assert not (data_dir / "replication-offset-checkpoint.tmp").exists()
    assert (data_dir / "meta.properties").exists()
    manager.close()


def test_illegal_topic_names_are_refused(data_dir: Path):
    manager = _started(data_dir)
    for topic in ("", "..", "a/b", "with space", "x" * 250):
        with pytest.raises(ValueError, match="illegal topic name"):
            manager.get_or_create_log((topic, 0))
    with pytest.raises(ValueError, match="illegal partition"):
        manager.get_or_create_log(("orders", -1))
    manager.close()


def test_a_stray_log_is_renamed_aside_with_its_data_and_skipped_at_startup(
    data_dir: Path, make_batch: MakeBatch
):
    manager = _started(data_dir)
    log = manager.get_or_create_log(("orders", 0))
    log.assign_topic_id("T-orders")
    log.append_as_leader(make_batch(3), 0, now_ms=0)
    manager.get_or_create_log(("kept", 0))
    stray = manager.set_aside_as_stray(("orders", 0))
    assert stray is not None and stray.topic_id == "T-orders"
    assert (stray.topic, stray.partition) == ("orders", 0)
    assert stray.path.name.startswith("orders-0.") and stray.path.name.endswith("-stray")
    assert not (data_dir / "orders-0").exists()
    assert manager.get_log(("orders", 0)) is None
    assert stray.size_bytes() > 0
    recovery_points = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read()
    assert ("orders", 0) not in recovery_points and ("kept", 0) in recovery_points
    manager.shutdown()
    again = LogManager(data_dir, CONFIG)
    assert again.startup() == {("kept", 0)}  # the stray is neither loaded nor deleted
    assert again.stray_logs() == [stray]
    assert stray.path.is_dir()
    again.close()


def test_set_aside_names_fit_in_255_bytes(data_dir: Path):
    manager = _started(data_dir)
    topic = "t" * 249
    manager.get_or_create_log((topic, 12345))
    stray = manager.set_aside_as_stray((topic, 12345))
    assert stray is not None and len(stray.path.name) == 255
    assert stray.path.name.endswith("-12345." + stray.path.name.split(".")[-1])
    manager.close()
    again = _started(data_dir)
    assert [s.partition for s in again.stray_logs()] == [12345]
    again.close()


def test_partition_metadata_records_the_topic_id(data_dir: Path):
    manager = _started(data_dir)
    log = manager.get_or_create_log(("t", 0))
    assert log.topic_id is None
    log.assign_topic_id("abc")
    log.assign_topic_id("abc")  # idempotent
    with pytest.raises(StorageError, match="belongs to topic id abc"):
        log.assign_topic_id("other")
    assert (data_dir / "t-0" / "partition.metadata").read_text() == "version: 0\ntopic_id: abc\n"
    manager.shutdown()
    again = _started(data_dir)
    assert again.get_log(("t", 0)).topic_id == "abc"
    again.close()
    (data_dir / "t-0" / "partition.metadata").write_text("version: 7\ntopic_id: abc\n")
    with pytest.raises(CorruptCheckpointError, match=r"partition\.metadata: version 7, expected 0"):
        _started(data_dir)


# ------------------------------------------------------------------ many new replicas


def test_a_delta_of_new_replicas_fsyncs_the_data_dir_once(
    data_dir: Path, make_batch: MakeBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 item 5: creating 10,000 replicas took 117 s, six fsyncs each. Now the
    data directory is fsynced once for all the logs a delta creates, and a new empty
    log writes no empty leader-epoch checkpoint: three fsyncs per replica (its
    directory, partition.metadata and its directory) and one for the delta. The files
    are real; os.fsync is only counted."""
    manager = _started(data_dir)
    synced: list[str] = []
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)
    n = 50
    created = [manager.prepare_new_log((f"t{i}", 0), CONFIG) for i in range(n)]
    assert all(created) and not manager.prepare_new_log(("t0", 0), CONFIG)
    manager.sync_new_logs()
    for i in range(n):
        manager.get_or_create_log((f"t{i}", 0)).assign_topic_id("A" * 22)
    assert synced.count(str(data_dir)) == 1  # one for the whole delta
    assert len(synced) == 3 * n + 1
    assert not (data_dir / "t0-0" / "leader-epoch-checkpoint").exists()
    # The first epoch reaches the checkpoint before the first batch of it.
    log = manager.get_or_create_log(("t0", 0))
    log.assign_epoch_at_end(3)
    log.append_as_leader(make_batch(2), leader_epoch=3)
    text = (data_dir / "t0-0" / "leader-epoch-checkpoint").read_text()
    assert text.splitlines() == ["0", "1", "3 0"]


def test_a_log_is_never_handed_out_before_its_directory_entry_is_durable(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the delta's one fsync fails, get_or_create_log fsyncs before handing the log
    out (and raises while it cannot): a replica never takes writes in a directory a
    machine crash could lose."""
    manager = _started(data_dir)
    assert manager.prepare_new_log(("t", 0), CONFIG)
    real_fsync = os.fsync
    failing = True

    def fsync(fd: int) -> None:
        if failing:
            raise OSError(24, "Too many open files")  # EMFILE: not a failed disk
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError):
        manager.sync_new_logs()
    with pytest.raises(StorageError):
        manager.get_or_create_log(("t", 0))
    failing = False
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    assert manager.get_or_create_log(("t", 0)) is not None
    assert len(synced) == 1  # the data dir, now
    manager.get_or_create_log(("t", 0))
    assert len(synced) == 1  # once durable, not again


# ------------------------------------------------------------------ recovery, made durable once


def _crashed_with_unflushed_logs(data_dir: Path, make_batch: MakeBatch, n: int) -> None:
    manager = _started(data_dir)
    for i in range(n):
        log = manager.get_or_create_log((f"t{i}", 0))
        log.append_as_leader(make_batch(3), 0, now_ms=0)
    manager.checkpoint_recovery_points_and_log_starts()  # recovery points 0 on disk
    manager.close()  # crash: no flush, no marker


class _SyscallCounter:
    """Counts os.fsync and syncfs(2) calls; both still run for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, syncfs_result: int | None = None):
        self.fsyncs = 0
        self.syncfs = 0
        real_fsync, real_syncfs = os.fsync, fileio._SYNCFS

        def fsync(fd: int) -> None:
            self.fsyncs += 1
            real_fsync(fd)

        def syncfs(fd: int) -> int:
            self.syncfs += 1
            if syncfs_result is not None:  # the disk failed
                ctypes.set_errno(errno.EIO)
                return syncfs_result
            assert real_syncfs is not None
            return real_syncfs(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        if real_syncfs is not None or syncfs_result is not None:
            monkeypatch.setattr(fileio, "_SYNCFS", syncfs)


@pytest.mark.skipif(not fileio.can_sync_file_system(), reason="syncfs(2) needs Linux >= 5.8")
def test_recovery_of_many_logs_is_made_durable_by_one_syncfs(
    data_dir: Path, make_batch: MakeBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 item 5: a SIGKILLed broker with 10,000 logs spent a third of its
    restart in fsyncs, four per recovered log (its segment, two indexes, its
    directory). One syncfs of the data directory's file system, after the last log
    and before any recovery point is checkpointed, makes the same changes durable."""
    n = 40
    _crashed_with_unflushed_logs(data_dir, make_batch, n)
    counter = _SyscallCounter(monkeypatch)
    recovered = _started(data_dir)
    assert counter.syncfs == 1
    # Only the two checkpoint files' atomic writes (file and directory each) remain.
    assert counter.fsyncs <= 4, counter.fsyncs
    assert {tp: log.recovery_point for tp, log in recovered._logs.items()} == {
        (f"t{i}", 0): 3 for i in range(n)
    }
    assert OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read() == {
        (f"t{i}", 0): 3 for i in range(n)
    }
    recovered.close()


def test_without_syncfs_each_recovered_log_is_fsynced(
    data_dir: Path, make_batch: MakeBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where syncfs cannot stand in for fsync (not Linux, or a kernel before 5.8 whose
    syncfs does not report disk errors), each recovered log is fsynced as before."""
    n = 10
    _crashed_with_unflushed_logs(data_dir, make_batch, n)
    monkeypatch.setattr(fileio, "_SYNCFS", None)
    counter = _SyscallCounter(monkeypatch)
    _started(data_dir).close()
    assert counter.syncfs == 0
    assert counter.fsyncs >= 4 * n


def test_a_failed_syncfs_fails_the_start_and_checkpoints_no_recovery_point(
    data_dir: Path, make_batch: MakeBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refused to make the recovered logs durable: the start fails with the
    error, and the recovery points on disk stay where they were (the next start
    recovers the same logs again), never claiming data the disk did not confirm."""
    _crashed_with_unflushed_logs(data_dir, make_batch, 3)
    _SyscallCounter(monkeypatch, syncfs_result=-1)
    with pytest.raises(OSError, match=r"syncfs of the file system holding .*Input/output error"):
        _started(data_dir)
    assert OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read() == {
        (f"t{i}", 0): 0 for i in range(3)
    }
