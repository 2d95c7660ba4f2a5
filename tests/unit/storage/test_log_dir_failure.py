"""LogDirFailureChannel and the Log methods it guards, on a real full file system
(a small tmpfs: ENOSPC from the kernel).

Invariant: after the first failed file operation of a data directory, no log in it
is written or read again (its state may be torn), the failure is announced once, and
a shutdown leaves no clean-shutdown marker (the next start recovers every log)."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.storage.errors import LogDirFailureError
from broker.storage.log import LogConfig
from broker.storage.log_dir_failure import LogDirFailureChannel
from broker.storage.log_manager import CLEAN_SHUTDOWN_FILE
from broker.storage.log_manager import LogManager
from tests.small_filesystem import SmallFilesystem
from tests.small_filesystem import small_filesystem

MakeBatch = Callable[..., bytes]


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[SmallFilesystem]:
    with small_filesystem(tmp_path / "data", 256 * 1024) as fs:
        yield fs


def test_the_first_failure_takes_the_directory_offline_once():
    channel = LogDirFailureChannel(Path("/data"))
    heard: list[LogDirFailureError] = []
    channel.add_listener(heard.append)
    channel.check()  # online: nothing raised
    first = channel.fail("append of log t-0", OSError(28, "No space left on device", "/data/x"))
    channel.fail("flush of log t-1", OSError(5, "Input/output error"))
    assert heard == [first] and channel.failure is first
    assert "append of log t-0 failed: /data/x: No space left on device (ENOSPC)" in str(first)
    assert "free space on the file system of /data" in str(first)
    with pytest.raises(LogDirFailureError) as raised:
        channel.check()
    assert raised.value is first
    late: list[LogDirFailureError] = []
    channel.add_listener(late.append)  # a listener added later hears it at once
    assert late == [first]


def test_a_full_disk_stops_every_log_of_the_directory(
    full_disk: SmallFilesystem, make_batch: MakeBatch
):
    manager = LogManager(full_disk.path, LogConfig(segment_bytes=64 * 1024, retention_ms=-1))
    manager.startup()
    heard: list[LogDirFailureError] = []
    manager.dir_failure.add_listener(heard.append)
    full = manager.get_or_create_log(("full", 0))
    other = manager.get_or_create_log(("other", 0))
    other.append_as_leader(make_batch(3), 0, now_ms=0)
    with pytest.raises(LogDirFailureError, match=r"No space left on device \(ENOSPC\)"):
        for _ in range(10_000):
            full.append_as_leader(make_batch(20, value_size=500), 0, now_ms=0)
    assert len(heard) == 1
    end = full.log_end_offset
    # Nothing touches the directory any more, even what would still fit or is cached.
    for operation in (
        lambda: other.append_as_leader(make_batch(1), 0, now_ms=0),
        lambda: other.read(0, 1 << 20),
        lambda: full.flush(),
        lambda: full.truncate_to(0),
        lambda: manager.get_or_create_log(("new", 0)),
        lambda: manager.checkpoint_high_watermarks({}),
    ):
        with pytest.raises(LogDirFailureError):
            operation()
    assert full.log_end_offset == end
    manager.shutdown()
    assert not (full_disk.path / CLEAN_SHUTDOWN_FILE).exists()

    # Space freed: the next start recovers the logs (unclean) and they work again.
    full_disk.resize(4 * 1024 * 1024)
    again = LogManager(full_disk.path, LogConfig(segment_bytes=64 * 1024, retention_ms=-1))
    assert again.startup() == {("full", 0), ("other", 0)}
    assert not again.had_clean_shutdown
    log = again.get_log(("full", 0))
    assert log is not None and log.log_end_offset == end
    log.append_as_leader(make_batch(1), 0, now_ms=0)
    again.shutdown()
