"""Damage inside a partition's log is refused, never cut or deleted (found by a
hostile-disk session, 2026-11-30: each of these cut or deleted CRC-valid, acknowledged
records before). Recovery may cut only a torn tail: bytes after the last valid batch
of the last segment holding records, with no valid batch among them. The invariant in
every test: the load fails with a StorageError naming the file, and no `.log` file
changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker.storage.errors import StorageError
from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.record_batch import BatchBuilder

CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=0, retention_ms=-1)
BIG = 10**9


def _batch() -> bytes:
    builder = BatchBuilder(base_timestamp=1_000_000)
    for i in range(3):
        builder.append(b"v%d" % i * 5, b"key", timestamp=1_000_000 + i)
    return builder.build()


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A log of 4 segments (15 offsets each), epochs 0..2, closed cleanly."""
    dir = tmp_path / "orders-0"
    log = Log.open(dir, CONFIG, had_clean_shutdown=True, now_ms=0)
    for i in range(20):
        log.append_as_leader(_batch(), i // 7, now_ms=0)
    assert len(log.segments) == 4
    log.close()
    return dir


def _logs(dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dir.glob("*.log"))}


def _refused(dir: Path, match: str, **open_args: object) -> None:
    before = _logs(dir)
    with pytest.raises(StorageError, match=match):
        Log.open(dir, CONFIG, **open_args)  # type: ignore[arg-type]
    assert _logs(dir) == before, "a .log file was cut or deleted"


def test_a_stray_copy_of_a_segment_is_refused_not_deleted_with_the_later_ones(
    written: Path,
) -> None:
    """A copy of the second segment named one offset lower (a restored backup, a stray
    copy): it starts inside the first segment. It was deleted, with every later
    segment (45 of 60 records)."""
    second = sorted(written.glob("*.log"))[1]
    shutil.copy(second, written / f"{int(second.stem) - 1:020d}.log")
    _refused(written, "inside .* two copies of the same records", had_clean_shutdown=True)


def test_a_segment_named_one_offset_off_is_refused_not_emptied(written: Path) -> None:
    """The last segment renamed one offset up: its first batch disagrees with its
    name. Its CRC-valid batches were cut to 0 bytes."""
    last = sorted(written.glob("*.log"))[-1]
    base = int(last.stem)
    for suffix in (".log", ".index", ".timeindex"):
        last.with_suffix(suffix).rename(written / f"{base + 1:020d}{suffix}")
    _refused(written, "was expected.*nothing was cut", had_clean_shutdown=True)


@pytest.mark.parametrize("segment", [0, 3])
def test_a_flipped_byte_with_valid_batches_after_it_is_refused(written: Path, segment: int) -> None:
    """An unclean shutdown, full recovery: a byte flipped in the first batch of a
    segment (its other batches, and in segment 0 three later segments, follow). The
    segment was cut at the flip and the later segments deleted (segment 0: all 60
    records)."""
    path = sorted(written.glob("*.log"))[segment]
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    _refused(written, "nothing was cut", had_clean_shutdown=False, recovery_point=0)


def test_garbage_after_a_middle_segment_is_refused_not_followed_by_deletions(
    written: Path,
) -> None:
    """Bytes appended to the second of four segments after a clean shutdown: the
    garbage was cut and the two later segments deleted (30 records)."""
    with open(sorted(written.glob("*.log"))[1], "ab") as f:
        f.write(b"garbage!" * 16)
    _refused(written, "later segments hold records", had_clean_shutdown=True)


def test_a_torn_tail_of_the_last_segment_is_still_cut(written: Path) -> None:
    """What recovery may cut: garbage after the last valid batch of the last segment,
    no valid batch among it."""
    last = sorted(written.glob("*.log"))[-1]
    good = last.read_bytes()
    with open(last, "ab") as f:
        f.write(b"garbage!" * 16)
    log = Log.open(written, CONFIG, had_clean_shutdown=False, recovery_point=0)
    try:
        assert last.read_bytes() == good
        assert log.log_end_offset == 60
    finally:
        log.close()
