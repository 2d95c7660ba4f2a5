"""Shared fixtures for the storage tests: batch builders and a config with tiny segments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.record_batch import BatchBuilder


def _make_batch(
    records: int = 3,
    *,
    timestamp: int = 1_000_000,
    value_size: int = 8,
    base_offset: int = 0,
    epoch: int = -1,
) -> bytes:
    """A batch of `records` records with timestamps timestamp, timestamp+1, ..."""
    builder = BatchBuilder(partition_leader_epoch=epoch, base_timestamp=timestamp)
    for i in range(records):
        builder.append(bytes([65 + i % 26]) * value_size, b"key", timestamp=timestamp + i)
    return builder.build(base_offset)


@pytest.fixture
def make_batch() -> Callable[..., bytes]:
    return _make_batch


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "orders-0"


@pytest.fixture
def small_config() -> LogConfig:
    """Segments of about five small batches, an index entry for nearly every batch."""
    return LogConfig(segment_bytes=700, index_interval_bytes=0, retention_ms=-1)


@pytest.fixture
def snapshot_on_close() -> bool:
    """Whether the logs `open_log` opened write their producer snapshot when closed at
    the end (a module overrides it to leave the snapshot files as its test left them)."""
    return True


@pytest.fixture
def open_log(log_dir: Path, small_config: LogConfig, snapshot_on_close: bool):
    """Open a log in `log_dir` (clean shutdown unless told otherwise); closed at the end."""
    opened: list[Log] = []

    def _open(config: LogConfig | None = None, **kwargs: object) -> Log:
        kwargs.setdefault("had_clean_shutdown", True)
        log = Log.open(log_dir, config or small_config, **kwargs)  # type: ignore[arg-type]
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.close(snapshot=snapshot_on_close)
