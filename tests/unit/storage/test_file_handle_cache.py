"""The bounded cache of open segment files (broker/storage/file_handles.py), on real
files and the process's real descriptor table (/proc/self/fd).

Invariants: however many partitions a data directory holds, at most
--max-open-segment-files of their files are open (plus the few pinned by operations in
progress); reads and writes through evicted and reopened descriptors return exactly
what was written; a descriptor in use is never closed under its user; running out of
descriptors fails only the operation that needed one (FileOpenError, a StorageError),
never takes the directory offline, and the same operation succeeds once descriptors
are free again."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.storage.errors import FileOpenError
from broker.storage.file_handles import FileHandleCache
from broker.storage.log import LogConfig
from broker.storage.log_manager import LogManager
from tests.open_file_limits import descriptors_exhausted
from tests.open_file_limits import open_fds

MakeBatch = Callable[..., bytes]
CAPACITY = 12
PARTITIONS = 60  # 180 segment files, 15 times the cache


def test_open_files_stay_bounded_across_many_partitions(tmp_path: Path, make_batch: MakeBatch):
    baseline = open_fds()
    config = LogConfig(segment_bytes=1024 * 1024, index_interval_bytes=0, retention_ms=-1)
    manager = LogManager(tmp_path, config, max_open_segment_files=CAPACITY)
    manager.startup()
    # startup holds the directory lock and the snapshot writer's descriptors.
    fixed = open_fds() - baseline
    logs = [manager.get_or_create_log((f"t{i}", 0)) for i in range(PARTITIONS)]
    assert open_fds() - baseline <= fixed + CAPACITY
    written: dict[int, list[bytes]] = {i: [] for i in range(PARTITIONS)}
    for round_ in range(3):  # round robin: every append reopens evicted files
        for i, log in enumerate(logs):
            batch = make_batch(2, timestamp=1_000 * round_ + i)
            info = log.append_as_leader(batch, 0, now_ms=0)
            written[i].append(log.read(info.first_offset, 1 << 20))
            assert open_fds() - baseline <= fixed + CAPACITY
    for i, log in enumerate(logs):
        assert log.log_end_offset == 6
        assert log.read(0, 1 << 20) == b"".join(written[i])
        assert log.offset_for_timestamp(2_000 + i) == (4, 2_000 + i, 0)
        assert open_fds() - baseline <= fixed + CAPACITY
    assert manager.file_handles.opens > 3 * PARTITIONS  # the files were reopened
    for log in logs:
        log.flush()
    manager.shutdown()
    assert open_fds() == baseline

    # A restart opens segment files lazily: none until read, then at most CAPACITY.
    manager = LogManager(tmp_path, config, max_open_segment_files=CAPACITY)
    manager.startup()
    assert open_fds() - baseline <= fixed + CAPACITY
    for i in range(PARTITIONS):
        log = manager.get_log((f"t{i}", 0))
        assert log is not None and log.read(0, 1 << 20) == b"".join(written[i])
    assert open_fds() - baseline <= fixed + CAPACITY
    manager.shutdown()


def test_a_pinned_descriptor_is_never_evicted(tmp_path: Path):
    cache = FileHandleCache(3)
    files = []
    for i in range(6):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * 4)
        files.append(cache.lazy(path, os.O_RDONLY))
    pinned_fd = files[0].acquire()  # e.g. an fsync in progress on a worker thread
    for handle in files[1:]:
        fd = handle.acquire()
        handle.release()
        assert os.pread(fd, 4, 0) != b""  # valid while pinned... and evicted later
    assert os.pread(pinned_fd, 4, 0) == b"\0" * 4  # still open, still that file
    assert files[0].is_open and cache.open_count == 3
    files[0].close()  # closing for good waits for the operation in progress
    assert files[0].is_open
    files[0].release()
    assert not files[0].is_open
    with pytest.raises(FileOpenError, match="already closed"):
        files[0].acquire()
    for handle in files[1:]:
        handle.close()
    assert cache.open_count == 0


def test_running_out_of_descriptors_fails_one_partition_not_the_directory(
    tmp_path: Path, make_batch: MakeBatch
):
    manager = LogManager(tmp_path, LogConfig(retention_ms=-1), max_open_segment_files=CAPACITY)
    manager.startup()
    cold = manager.get_or_create_log(("cold", 0))
    cold.append_as_leader(make_batch(2), 0, now_ms=0)
    for segment in cold.segments:
        segment.release_descriptors()  # its next use must open files
    hot = manager.get_or_create_log(("hot", 0))
    hot.append_as_leader(make_batch(2), 0, now_ms=0)  # its files stay open (cache has room)

    with descriptors_exhausted():
        with pytest.raises(FileOpenError, match="out of file descriptors"):
            cold.read(0, 1 << 20)
        with pytest.raises(FileOpenError, match="Too many open files"):
            cold.append_as_leader(make_batch(2), 0, now_ms=0)
        # A new leader epoch is kept in memory; its checkpoint is written before the
        # epoch's first batch (not at once: a broker taking over thousands of
        # partitions must not fsync for each on its loop), which cannot happen now...
        hot.assign_epoch_at_end(1)
        assert hot.latest_epoch == 1
        # ...so no batch of epoch 1 is written before its checkpoint is.
        with pytest.raises(FileOpenError):
            hot.append_as_leader(make_batch(2), 1, now_ms=0)
        assert hot.log_end_offset == 2
        assert hot.read(0, 1 << 20)  # reads of open files still work
        assert manager.dir_failure.failure is None  # the disk is fine: still online

    assert cold.log_end_offset == 2 and cold.read(0, 1 << 20)
    cold.append_as_leader(make_batch(2), 0, now_ms=0)
    assert cold.log_end_offset == 4
    hot.append_as_leader(make_batch(2), 1, now_ms=0)  # writes the checkpoint first
    checkpoint = (hot.dir / "leader-epoch-checkpoint").read_text()
    assert checkpoint.splitlines()[-1] == "1 2"
    manager.shutdown()


def test_older_segments_of_a_loaded_log_hold_no_descriptor_until_read(
    tmp_path: Path, make_batch: MakeBatch
):
    config = LogConfig(segment_bytes=300, index_interval_bytes=0, retention_ms=-1)
    manager = LogManager(tmp_path, config, max_open_segment_files=CAPACITY)
    manager.startup()
    log = manager.get_or_create_log(("rolled", 0))
    for _ in range(8):
        log.append_as_leader(make_batch(2, value_size=100), 0, now_ms=0)
    written = log.read(0, 1 << 20)
    manager.shutdown()

    for clean in (False, True):
        manager = LogManager(tmp_path, config, max_open_segment_files=CAPACITY)
        manager.startup()
        log = manager.get_log(("rolled", 0))
        assert log is not None and len(log.segments) == 8
        for segment in log.segments[:-1]:
            assert not any(handle.is_open for handle in segment._handles())
        assert log.read(0, 1 << 20) == written  # reopened to be read
        assert log.segments[0]._file.handle.is_open
        if clean:
            manager.shutdown()
        else:
            manager.close()  # as after a crash: the next load recovers


def test_flushes_on_threads_and_appends_share_a_tiny_cache(tmp_path: Path, make_batch: MakeBatch):
    """Worker threads fsync while the main thread appends and reads, with a cache
    of one segment's files: every operation reopens, evicts or waits on pins; none may
    use a descriptor closed (or reused for another file) under it."""
    config = LogConfig(index_interval_bytes=0, retention_ms=-1)
    manager = LogManager(tmp_path, config, max_open_segment_files=3)
    manager.startup()
    logs = [manager.get_or_create_log((f"c{i}", 0)) for i in range(8)]
    stop = threading.Event()
    failures: list[BaseException] = []

    def flush_all() -> None:
        while not stop.is_set():
            for log in logs:
                try:
                    log.flush()
                except BaseException as exc:  # reported to the test below
                    failures.append(exc)
                    return

    flushers = [threading.Thread(target=flush_all) for _ in range(2)]
    for thread in flushers:
        thread.start()
    expected: dict[int, bytes] = {i: b"" for i in range(len(logs))}
    try:
        for round_ in range(25):
            for i, log in enumerate(logs):
                info = log.append_as_leader(make_batch(2, timestamp=round_), 0, now_ms=0)
                expected[i] += log.read(info.first_offset, 1 << 20)
    finally:
        stop.set()
        for thread in flushers:
            thread.join(10)
    assert not failures, failures
    assert manager.dir_failure.failure is None
    for i, log in enumerate(logs):
        assert log.read(0, 1 << 20) == expected[i] and log.log_end_offset == 50
    manager.shutdown()
